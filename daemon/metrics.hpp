// The daemon's counters and their Prometheus text exposition. Counters may be bumped from
// any thread; gauges (and the log capper's own counters) are read by the main loop when it
// renders.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace reaperd {

// Point-in-time values the main loop reads from its registry.
struct Gauges {
    std::uint64_t tracked_containers = 0;
    std::map<std::string, std::uint64_t> sessions_by_state;  // leased, grace, ended, unclaimed
    std::uint64_t pending_reaps = 0;
    bool engine_up = false;
    // Kept by the log capper, rendered here: bytes cut away, and its actions by kind
    // (merged into reaperd_actions_total).
    std::uint64_t log_bytes_dropped = 0;
    std::map<std::string, std::uint64_t> log_actions;
};

class Metrics {
public:
    void reap_done() noexcept { ++reaps_done_; }
    void reap_failed() noexcept { ++reaps_failed_; }
    void engine_reconnect() noexcept { ++engine_reconnects_; }
    // One action taken (or, in a dry run, that would have been): "reap", "would_reap",
    // "end_session", "truncate", "stop", "kill", "remove", ...
    void action(const std::string& kind);

    std::uint64_t reaps_done() const noexcept { return reaps_done_; }
    std::uint64_t reaps_failed() const noexcept { return reaps_failed_; }
    std::uint64_t engine_reconnects() const noexcept { return engine_reconnects_; }
    std::map<std::string, std::uint64_t> actions() const;

    // The Prometheus text format (version 0.0.4), names prefixed reaperd_.
    std::string render(const Gauges& gauges) const;

private:
    std::atomic<std::uint64_t> reaps_done_{0};
    std::atomic<std::uint64_t> reaps_failed_{0};
    std::atomic<std::uint64_t> engine_reconnects_{0};
    mutable std::mutex mutex_;
    std::map<std::string, std::uint64_t> actions_;
};

}  // namespace reaperd
