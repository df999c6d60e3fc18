// The log capper's records of what it did (logcap.hpp), in one place: the truncation record
// and the coalescing of repeated cuts into one (LogCapper::Options::log_coalesce), and the
// table of the engine actions (stop, kill, remove) with how each is done and told.
//
// Contract: pure bookkeeping and formatting on the watcher thread; the only side effect is
// the record handed to the sink. A container's first cut is told at once; cuts after it
// within the window are summed (ACTION_COUNT, LOG_BYTES_DROPPED) and told when the window
// has passed since the last record, or when the container is forgotten or the capper stops
// (flush() at that time). A record says how the live file was last cut (CUT_METHOD=
// punch_hole, truncate, or none when only rotations were deleted) and the bytes kept on disk
// (LOG_BYTES_KEPT); the first punched cut of a container also says how to read what was kept.
// Never throws but what the sink throws.
#pragma once

#include "config.hpp"
#include "guard.hpp"
#include "log.hpp"
#include "logcap_policy.hpp"
#include "vocabulary.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace reaperd::logcap {

using TimePoint = std::chrono::steady_clock::time_point;

// What a record says of its container, besides what it did.
struct RecordSubject {
    std::string_view id;
    std::string_view name;
    std::string_view session;
};

// The fields every capper record about a container carries.
std::vector<LogField> container_fields(const RecordSubject& subject, std::string_view action);
// "container NAME (SHORT-ID)", as the messages name it.
std::string describe(const RecordSubject& subject);

// The cuts of one container not yet told.
class CutCoalescer {
public:
    struct Cut {
        std::uint64_t before_bytes = 0;
        std::uint64_t after_bytes = 0;
        std::uint64_t dropped_bytes = 0;
        std::uint64_t kept_bytes = 0;
        // How the live file was cut; nullopt: it was not, only old rotations were deleted.
        std::optional<CutMethod> method;
        CapReason reason = CapReason::own_cap;
    };
    // Notes a cut; returns whether it is to be told now (the first, or the first after a
    // window with no record).
    bool note(const Cut& cut, TimePoint now, std::chrono::milliseconds window);
    // When the cuts held are due to be told (none held: nullopt).
    std::optional<TimePoint> due_at(std::chrono::milliseconds window) const;
    bool pending() const { return cuts_ > 0; }
    // Tells the cuts held, if any, through `sink`, as told at `now`.
    void flush(const LogSink& sink, const RecordSubject& subject, std::uint64_t cap_bytes,
               std::uint64_t total_budget_bytes, TimePoint now);

private:
    unsigned cuts_ = 0;
    std::uint64_t dropped_bytes_ = 0;
    Cut last_;
    bool told_how_to_read_ = false;
    std::optional<TimePoint> last_record_;
};

// One engine action of the capper: the door's act for it and the word its record uses.
struct EngineAction {
    LogAction action;
    ContainerAct act;
    std::string_view done;  // "stopped", "killed", "removed"
};
// The row for stop, kill or remove. Throws std::logic_error for truncate, which is the
// watcher's own act: only the policy's stop, kill and remove become engine jobs.
const EngineAction& engine_action(LogAction action);

}  // namespace reaperd::logcap
