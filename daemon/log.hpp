// The daemon's log: one record per event, with a stable MESSAGE_ID per kind of event and
// structured fields. Goes to journald natively when running under it, else to stderr as
// one line per record ("<priority> message key=value ...").
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace reaperd {

// syslog priorities, as journald uses them.
enum class Priority { err = 3, warning = 4, notice = 5, info = 6, debug = 7 };

struct LogField {
    std::string name;  // journal field name: upper case, e.g. CONTAINER_ID
    std::string value;
};

// Stable ids (128-bit, as journald wants them) for each kind of event, so users can
// `journalctl MESSAGE_ID=...`. Never change a published one.
namespace message_id {
inline constexpr std::string_view container_reaped = "8f1a6c2e3b7d4e5f9a0b1c2d3e4f5a01";
inline constexpr std::string_view reap_failed = "8f1a6c2e3b7d4e5f9a0b1c2d3e4f5a02";
inline constexpr std::string_view log_capped = "8f1a6c2e3b7d4e5f9a0b1c2d3e4f5a03";
inline constexpr std::string_view session_ended = "8f1a6c2e3b7d4e5f9a0b1c2d3e4f5a04";
inline constexpr std::string_view engine_lost = "8f1a6c2e3b7d4e5f9a0b1c2d3e4f5a05";
inline constexpr std::string_view engine_back = "8f1a6c2e3b7d4e5f9a0b1c2d3e4f5a06";
inline constexpr std::string_view would_reap = "8f1a6c2e3b7d4e5f9a0b1c2d3e4f5a08";
inline constexpr std::string_view network_reaped = "8f1a6c2e3b7d4e5f9a0b1c2d3e4f5a09";
inline constexpr std::string_view volume_reaped = "8f1a6c2e3b7d4e5f9a0b1c2d3e4f5a0a";
inline constexpr std::string_view object_reap_failed = "8f1a6c2e3b7d4e5f9a0b1c2d3e4f5a0b";
inline constexpr std::string_view engine_unsupported = "5e3d39f5a5394c3bae9f001d0ffc2d30";
}  // namespace message_id

// Writes one record. `message_id` may be empty. Thread-safe; never throws.
void log(Priority priority, std::string_view message_id, std::string_view message,
         std::vector<LogField> fields = {});

inline void log(Priority priority, std::string_view message) { log(priority, {}, message, {}); }

}  // namespace reaperd
