// The daemon's counters and their Prometheus text exposition. Counters may be bumped from
// any thread; gauges (and the log capper's own counters) are read by the main loop when it
// renders. Names follow Prometheus' conventions (base units in the name, _total counters,
// HELP and TYPE for every family); README "Metrics" lists them, and `promtool check metrics`
// finds nothing to say about the exposition (tests/integration/prometheus_test.cpp).
#pragma once

#include "vocabulary.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace reaperd {

// The process' own figures, the standard process_* metrics (as Prometheus' Go and Python
// clients export them), read from /proc/self.
struct ProcessStats {
    std::uint64_t open_fds = 0;
    std::uint64_t max_fds = 0;  // the soft RLIMIT_NOFILE
    std::uint64_t resident_memory_bytes = 0;
    std::uint64_t virtual_memory_bytes = 0;
    double cpu_seconds = 0;         // user + system
    double start_time_seconds = 0;  // unix time
};
// nullopt when /proc cannot be read (the process_* families are then left out).
std::optional<ProcessStats> read_process_stats();

// The parts of /proc/self/stat the process_* metrics use; the pure half of
// read_process_stats(), nullopt when `stat` does not parse.
struct ProcStat {
    double cpu_seconds = 0;
    double start_seconds_after_boot = 0;
    std::uint64_t virtual_memory_bytes = 0;
    std::uint64_t resident_memory_bytes = 0;
};
std::optional<ProcStat> parse_proc_stat(std::string_view stat, long ticks_per_second,
                                        long page_size);
// The boot time ("btime" of /proc/stat), unix seconds.
std::optional<std::uint64_t> parse_boot_time(std::string_view proc_stat);

// Point-in-time values the main loop reads from its registry.
struct Gauges {
    std::uint64_t tracked_containers = 0;
    std::map<std::string, std::uint64_t> sessions_by_state;  // leased, grace, ended, unclaimed
    std::uint64_t pending_reaps = 0;
    std::uint64_t tombstones = 0;  // ended sessions remembered (sessions.max_tombstones)
    // Session-owned networks and volumes, and their removals queued or being retried.
    std::uint64_t tracked_networks = 0;
    std::uint64_t tracked_volumes = 0;
    std::uint64_t pending_network_reaps = 0;
    std::uint64_t pending_volume_reaps = 0;
    bool engine_up = false;
    // The pace of removals (reaper.hpp RemovalPace): whether the engine is slow, the
    // attempts allowed in flight now and those in flight.
    bool engine_slow = false;
    std::uint64_t removal_limit = 0;
    std::uint64_t removals_in_flight = 0;
    // Kept by the log capper, rendered here: bytes cut away, and its actions by kind
    // (merged into reaperd_actions_total).
    std::uint64_t log_bytes_dropped = 0;
    std::map<std::string, std::uint64_t> log_actions;
    std::uint64_t log_action_failures = 0;  // the capper's engine calls that failed
    std::uint64_t log_unopenable = 0;        // logs in scope the capper cannot open now
    std::uint64_t log_open_failures = 0;     // warnings it gave for those, one per container
    std::uint64_t log_cut_fallbacks = 0;     // cuts that truncated instead of punching
    std::optional<ProcessStats> process;
};

// A Prometheus histogram: cumulative buckets by upper bound, their sum and count.
class Histogram {
public:
    explicit Histogram(std::vector<double> upper_bounds);  // ascending; +Inf is implied
    void observe(double value);
    // `name`'s _bucket (le="+Inf" last), _sum and _count lines, without HELP or TYPE.
    void render(std::string& out, const std::string& name) const;
    std::uint64_t count() const noexcept { return count_; }
    double sum() const noexcept { return sum_; }

private:
    std::vector<double> bounds_;
    std::vector<std::uint64_t> counts_;  // per bucket, not cumulative; the last is +Inf
    double sum_ = 0;
    std::uint64_t count_ = 0;
};

// A sample value as the exposition writes it: integers without a fraction, others in the
// shortest form that reads back the same, "+Inf", "-Inf", "NaN".
std::string format_value(double value);

class Metrics {
public:
    using Seconds = std::chrono::duration<double>;

    // A removal the engine confirmed, `latency` after the container became due for reaping
    // (its session ended, an orphan report came, its max_age passed: when it was queued).
    void reap_done(Seconds latency);
    void reap_failed() noexcept { ++reaps_failed_; }
    // A network or volume ("network", "volume") of an ended session removed.
    void object_reaped(std::string_view kind) noexcept {
        ++(kind == "volume" ? volumes_reaped_ : networks_reaped_);
    }
    void engine_reconnect() noexcept { ++engine_reconnects_; }
    // A removal attempt (inspect and remove, through the door) the engine answered after
    // `latency`, or did not answer within engine.request_timeout.
    void removal_answered(Seconds latency);
    void removal_unanswered() noexcept { ++removals_unanswered_; }
    std::uint64_t removals_unanswered() const noexcept { return removals_unanswered_; }
    Histogram removal_latency() const;
    // A control connection or lease refused by a limit: "connections", "connections_per_uid"
    // or "leases_per_uid" (ControlHandler::request_refused).
    void control_refused(const std::string& reason);
    std::map<std::string, std::uint64_t> control_refusals() const;  // every reason, 0 included
    // A session ended, for `reason`: its label value is the vocabulary's name.
    void session_ended(EndReason reason);
    void state_save_failed() noexcept { ++state_save_failures_; }
    // A tombstone forgotten before its tombstone_ttl because more than
    // sessions.max_tombstones were held.
    void tombstone_evicted() noexcept { ++tombstones_evicted_; }
    std::uint64_t tombstones_evicted() const noexcept { return tombstones_evicted_; }
    // A full list of the engine's containers was reconciled at `at`.
    void engine_synced(std::chrono::system_clock::time_point at) noexcept;
    // One action taken (or, in a dry run, that would have been: dry_run_action()): "reap",
    // "would_reap", "end_session", the log capper's (LogAction's names), "refused_...".
    void action(const std::string& kind);

    std::uint64_t reaps_done() const noexcept { return reaps_done_; }
    std::uint64_t reaps_failed() const noexcept { return reaps_failed_; }
    std::uint64_t networks_reaped() const noexcept { return networks_reaped_; }
    std::uint64_t volumes_reaped() const noexcept { return volumes_reaped_; }
    std::uint64_t engine_reconnects() const noexcept { return engine_reconnects_; }
    std::map<std::string, std::uint64_t> actions() const;
    std::map<std::string, std::uint64_t> sessions_ended() const;
    std::uint64_t state_save_failures() const noexcept { return state_save_failures_; }
    Histogram reap_latency() const;

    // The Prometheus text format (version 0.0.4): names prefixed reaperd_, and the standard
    // process_* names when gauges.process is set.
    std::string render(const Gauges& gauges) const;

    // The reap latency histogram's upper bounds, in seconds.
    static const std::vector<double>& reap_latency_buckets();
    // The removal attempt histogram's.
    static const std::vector<double>& removal_latency_buckets();

private:
    std::atomic<std::uint64_t> reaps_done_{0};
    std::atomic<std::uint64_t> reaps_failed_{0};
    std::atomic<std::uint64_t> networks_reaped_{0};
    std::atomic<std::uint64_t> volumes_reaped_{0};
    std::atomic<std::uint64_t> engine_reconnects_{0};
    std::atomic<std::uint64_t> state_save_failures_{0};
    std::atomic<std::uint64_t> tombstones_evicted_{0};
    std::atomic<std::int64_t> engine_last_sync_ms_{0};  // unix ms; 0 = never
    mutable std::mutex mutex_;
    std::map<std::string, std::uint64_t> actions_;
    std::map<std::string, std::uint64_t> sessions_ended_;  // by reason
    std::map<std::string, std::uint64_t> control_refused_;  // by reason
    Histogram reap_latency_{reap_latency_buckets()};
    std::atomic<std::uint64_t> removals_unanswered_{0};
    Histogram removal_latency_{removal_latency_buckets()};
};

}  // namespace reaperd
