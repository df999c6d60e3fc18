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

// Stable ids for each kind of event, so users can `journalctl MESSAGE_ID=...`: each one from
// `systemd-id128 new`, as sd-journal(3) asks, so no other program's id collides with ours
// (the hand-numbered ids of 0.1.0's development were replaced before any release). A new
// kind gets a new id and an entry in systemd/reaperd.catalog; never change a published one.
namespace message_id {
inline constexpr std::string_view container_reaped = "0e62ab2724b54aa1a1c7ea5d3e0bebbf";
inline constexpr std::string_view reap_failed = "347221861dca45598661bf3fe804fa0e";
inline constexpr std::string_view log_capped = "b39fa64419c04d89acfc9bc2a5ef00cc";
inline constexpr std::string_view session_ended = "3c83583be2ab4b1baf196fe145337242";
inline constexpr std::string_view engine_lost = "9bf899df198e4c9c9f069b9e0532b01a";
inline constexpr std::string_view engine_back = "221f3762af65456c9c49d8d32ced405f";
inline constexpr std::string_view would_reap = "0b3bee67999b493eaee1967646265f79";
inline constexpr std::string_view network_reaped = "6eb67f8885eb49a18e7fe87168118d73";
inline constexpr std::string_view volume_reaped = "1943ff664609426cac0668cb3aa013c1";
inline constexpr std::string_view object_reap_failed = "622bf8b5ccae4399b1b7684582602294";
inline constexpr std::string_view engine_unsupported = "5e3d39f5a5394c3bae9f001d0ffc2d30";
inline constexpr std::string_view engine_slow = "6a71e618587146168f7d04ff94412d5b";
inline constexpr std::string_view engine_in_time = "2d172fa04c0f4288bed0b594ac6f70d3";
}  // namespace message_id

// Writes one record. `message_id` may be empty. Thread-safe; never throws.
void log(Priority priority, std::string_view message_id, std::string_view message,
         std::vector<LogField> fields = {});

inline void log(Priority priority, std::string_view message) { log(priority, {}, message, {}); }

}  // namespace reaperd
