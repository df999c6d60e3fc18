#include "metrics.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include <sys/resource.h>
#include <unistd.h>

namespace reaperd {

namespace {
void header(std::ostringstream& out, const char* name, const char* type, const char* help) {
    out << "# HELP " << name << ' ' << help << '\n' << "# TYPE " << name << ' ' << type << '\n';
}

std::optional<std::string> slurp(const char* path) {
    std::ifstream in(path);
    if (!in) return std::nullopt;
    std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (in.bad()) return std::nullopt;
    return text;
}

template <typename Number>
std::optional<Number> parse_number(std::string_view text) {
    Number value{};
    auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
    return value;
}

// Label values in the exposition format escape backslash, quote and newline.
std::string escape_label(const std::string& value) {
    std::string out;
    for (char c : value) {
        if (c == '\\') out += "\\\\";
        else if (c == '"') out += "\\\"";
        else if (c == '\n') out += "\\n";
        else out += c;
    }
    return out;
}
}  // namespace

// ---- process figures ---------------------------------------------------------------------

std::optional<ProcStat> parse_proc_stat(std::string_view stat, long ticks_per_second,
                                        long page_size) {
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so the fields are
    // counted from the last ')'. Field 3 (state) is fields[0]; see proc(5).
    const auto close = stat.rfind(')');
    if (close == std::string_view::npos || ticks_per_second <= 0 || page_size <= 0)
        return std::nullopt;
    std::vector<std::string_view> fields;
    std::string_view rest = stat.substr(close + 1);
    while (!rest.empty()) {
        const auto start = rest.find_first_not_of(" \n");
        if (start == std::string_view::npos) break;
        rest.remove_prefix(start);
        const auto end = std::min(rest.find_first_of(" \n"), rest.size());
        fields.push_back(rest.substr(0, end));
        rest.remove_prefix(end);
    }
    auto field = [&](std::size_t number) -> std::optional<std::uint64_t> {
        if (number < 3 || number - 3 >= fields.size()) return std::nullopt;
        return parse_number<std::uint64_t>(fields[number - 3]);
    };
    const auto utime = field(14), stime = field(15), starttime = field(22), vsize = field(23),
               rss = field(24);
    if (!utime || !stime || !starttime || !vsize || !rss) return std::nullopt;
    const auto ticks = static_cast<double>(ticks_per_second);
    ProcStat out;
    out.cpu_seconds = static_cast<double>(*utime + *stime) / ticks;
    out.start_seconds_after_boot = static_cast<double>(*starttime) / ticks;
    out.virtual_memory_bytes = *vsize;
    out.resident_memory_bytes = *rss * static_cast<std::uint64_t>(page_size);
    return out;
}

std::optional<std::uint64_t> parse_boot_time(std::string_view proc_stat) {
    constexpr std::string_view key = "btime ";
    for (std::size_t at = 0; at < proc_stat.size();) {
        const auto end = std::min(proc_stat.find('\n', at), proc_stat.size());
        const auto line = proc_stat.substr(at, end - at);
        if (line.starts_with(key)) return parse_number<std::uint64_t>(line.substr(key.size()));
        at = end + 1;
    }
    return std::nullopt;
}

std::optional<ProcessStats> read_process_stats() {
    // The boot time does not change while reaperd runs; /proc/stat grows with the CPU count.
    static const std::optional<std::uint64_t> boot = [] {
        auto text = slurp("/proc/stat");
        return text ? parse_boot_time(*text) : std::nullopt;
    }();
    const auto stat_text = slurp("/proc/self/stat");
    if (!boot || !stat_text) return std::nullopt;
    const auto stat = parse_proc_stat(*stat_text, ::sysconf(_SC_CLK_TCK), ::sysconf(_SC_PAGESIZE));
    if (!stat) return std::nullopt;
    ProcessStats out;
    out.cpu_seconds = stat->cpu_seconds;
    out.start_time_seconds = static_cast<double>(*boot) + stat->start_seconds_after_boot;
    out.virtual_memory_bytes = stat->virtual_memory_bytes;
    out.resident_memory_bytes = stat->resident_memory_bytes;
    // Like Prometheus' own clients, this counts the descriptor that lists the directory too.
    std::error_code ec;
    for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end;
         it.increment(ec))
        ++out.open_fds;
    if (ec) return std::nullopt;
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) == 0) out.max_fds = limit.rlim_cur;
    return out;
}

// ---- histogram ---------------------------------------------------------------------------

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
    const auto bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
    ++counts_[static_cast<std::size_t>(bucket)];
    sum_ += value;
    ++count_;
}

void Histogram::render(std::string& out, const std::string& name) const {
    std::uint64_t cumulative = 0;
    for (std::size_t i = 0; i <= bounds_.size(); ++i) {
        cumulative += counts_[i];
        out += name + "_bucket{le=\"" +
               (i < bounds_.size() ? format_value(bounds_[i]) : std::string("+Inf")) + "\"} " +
               std::to_string(cumulative) + '\n';
    }
    out += name + "_sum " + format_value(sum_) + '\n';
    out += name + "_count " + std::to_string(count_) + '\n';
}

std::string format_value(double value) {
    if (std::isnan(value)) return "NaN";
    if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
    // Integers print without ".0" up to 2^53, where a double still holds each one exactly.
    if (value == std::floor(value) && std::fabs(value) < 9007199254740992.0)
        return std::to_string(static_cast<std::int64_t>(value));
    char buffer[64];
    auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, value);
    return error == std::errc{} ? std::string(buffer, end) : std::to_string(value);
}

// ---- counters ----------------------------------------------------------------------------

// Measured here (RECIPES.md 1): a force-remove of a running container takes ~50 ms, so an
// unhindered reap lands in the 0.05-0.1 buckets, a burst waiting for reaper.concurrency
// slots in the next few; retries start at retry_initial (1 s) and double up to retry_max
// (60 s), so a failing engine shows from 1 s to several minutes.
const std::vector<double>& Metrics::reap_latency_buckets() {
    static const std::vector<double> buckets{0.025, 0.05, 0.1, 0.25, 0.5, 1,  2.5,
                                             5,     10,   30,  60,   120, 300};
    return buckets;
}

// One attempt is an inspect and a force-remove: 20-200 ms here when the engine keeps up;
// RemovalPace counts an answer over 2 s (at most half engine.request_timeout) as congestion.
const std::vector<double>& Metrics::removal_latency_buckets() {
    static const std::vector<double> buckets{0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30};
    return buckets;
}

void Metrics::removal_answered(Seconds latency) {
    std::lock_guard lock(mutex_);
    removal_latency_.observe(std::max(0.0, latency.count()));
}

Histogram Metrics::removal_latency() const {
    std::lock_guard lock(mutex_);
    return removal_latency_;
}

void Metrics::reap_done(Seconds latency) {
    std::lock_guard lock(mutex_);
    ++reaps_done_;
    reap_latency_.observe(std::max(0.0, latency.count()));
}

void Metrics::session_ended(EndReason reason) {
    std::lock_guard lock(mutex_);
    ++sessions_ended_[std::string(to_string(reason))];
}

void Metrics::engine_synced(std::chrono::system_clock::time_point at) noexcept {
    engine_last_sync_ms_ =
        std::chrono::duration_cast<std::chrono::milliseconds>(at.time_since_epoch()).count();
}

std::map<std::string, std::uint64_t> Metrics::sessions_ended() const {
    std::lock_guard lock(mutex_);
    return sessions_ended_;
}

void Metrics::control_refused(const std::string& reason) {
    std::lock_guard lock(mutex_);
    ++control_refused_[reason];
}

std::map<std::string, std::uint64_t> Metrics::control_refusals() const {
    std::map<std::string, std::uint64_t> counts{{"connections", 0}, {"connections_per_uid", 0}, {"leases_per_uid", 0}, {"uid", 0}};
    std::lock_guard lock(mutex_);
    for (const auto& [reason, count] : control_refused_) counts[reason] = count;
    return counts;
}

Histogram Metrics::reap_latency() const {
    std::lock_guard lock(mutex_);
    return reap_latency_;
}

void Metrics::action(const std::string& kind) {
    std::lock_guard lock(mutex_);
    ++actions_[kind];
}

std::map<std::string, std::uint64_t> Metrics::actions() const {
    std::lock_guard lock(mutex_);
    return actions_;
}

std::string Metrics::render(const Gauges& gauges) const {
    std::ostringstream out;
    const Histogram latency = reap_latency();  // one snapshot: its count is every reap count
    header(out, "reaperd_tracked_containers", "gauge", "Session-owned containers being tracked.");
    out << "reaperd_tracked_containers " << gauges.tracked_containers << '\n';
    header(out, "reaperd_sessions", "gauge", "Known sessions by state.");
    for (const char* state : {"leased", "grace", "ended", "unclaimed"}) {
        auto it = gauges.sessions_by_state.find(state);
        out << "reaperd_sessions{state=\"" << state << "\"} "
            << (it == gauges.sessions_by_state.end() ? 0 : it->second) << '\n';
    }
    header(out, "reaperd_pending_reaps", "gauge", "Reaps queued or being retried.");
    out << "reaperd_pending_reaps " << gauges.pending_reaps << '\n';
    header(out, "reaperd_tracked_networks", "gauge", "Session-owned networks being tracked.");
    out << "reaperd_tracked_networks " << gauges.tracked_networks << '\n';
    header(out, "reaperd_tracked_volumes", "gauge", "Session-owned volumes being tracked.");
    out << "reaperd_tracked_volumes " << gauges.tracked_volumes << '\n';
    header(out, "reaperd_pending_network_reaps", "gauge",
           "Removals of networks of ended sessions queued or being retried.");
    out << "reaperd_pending_network_reaps " << gauges.pending_network_reaps << '\n';
    header(out, "reaperd_pending_volume_reaps", "gauge",
           "Removals of volumes of ended sessions queued or being retried.");
    out << "reaperd_pending_volume_reaps " << gauges.pending_volume_reaps << '\n';
    header(out, "reaperd_engine_up", "gauge", "1 when the engine answers, else 0.");
    out << "reaperd_engine_up " << (gauges.engine_up ? 1 : 0) << '\n';
    header(out, "reaperd_engine_slow", "gauge",
           "1 while the engine is slow: a removal attempt timed out or answered slowly within "
           "the last 10 s, or one has been in flight that long; else 0.");
    out << "reaperd_engine_slow " << (gauges.engine_slow ? 1 : 0) << '\n';
    header(out, "reaperd_removal_limit", "gauge",
           "Removal attempts allowed in flight now, fitted to what the engine delivers (at most "
           "reaper.concurrency; 1 while it answers nothing).");
    out << "reaperd_removal_limit " << gauges.removal_limit << '\n';
    header(out, "reaperd_removals_in_flight", "gauge", "Removal attempts waiting on the engine now.");
    out << "reaperd_removals_in_flight " << gauges.removals_in_flight << '\n';
    header(out, "reaperd_removal_timeouts_total", "counter",
           "Removal attempts the engine did not answer within engine.request_timeout; each is "
           "attempted again through a fresh inspect, not counted as failed.");
    out << "reaperd_removal_timeouts_total " << removals_unanswered() << '\n';
    header(out, "reaperd_removal_attempt_seconds", "histogram",
           "Seconds the engine took to answer a removal attempt (an inspect and a remove).");
    std::string attempts;
    removal_latency().render(attempts, "reaperd_removal_attempt_seconds");
    out << attempts;
    header(out, "reaperd_reaps_done_total", "counter",
           "Containers removed (the same count as reaperd_reaps_total, kept for existing users).");
    out << "reaperd_reaps_done_total " << latency.count() << '\n';
    header(out, "reaperd_reaps_failed_total", "counter", "Removal attempts that failed.");
    out << "reaperd_reaps_failed_total " << reaps_failed() << '\n';
    header(out, "reaperd_networks_reaped_total", "counter",
           "Networks of ended sessions removed: the engine confirmed each removal.");
    out << "reaperd_networks_reaped_total " << networks_reaped() << '\n';
    header(out, "reaperd_volumes_reaped_total", "counter",
           "Volumes of ended sessions removed: the engine confirmed each removal.");
    out << "reaperd_volumes_reaped_total " << volumes_reaped() << '\n';
    header(out, "reaperd_log_bytes_dropped_total", "counter",
           "Container log bytes cut away by log caps.");
    out << "reaperd_log_bytes_dropped_total " << gauges.log_bytes_dropped << '\n';
    header(out, "reaperd_actions_total", "counter", "Actions taken, by kind.");
    auto all_actions = actions();
    for (const auto& [kind, count] : gauges.log_actions) all_actions[kind] += count;
    for (const auto& [kind, count] : all_actions)
        out << "reaperd_actions_total{action=\"" << escape_label(kind) << "\"} " << count << '\n';
    header(out, "reaperd_engine_reconnects_total", "counter",
           "Times the engine connection was re-established after a loss.");
    out << "reaperd_engine_reconnects_total " << engine_reconnects() << '\n';

    header(out, "reaperd_reaps_total", "counter",
           "Containers removed: the engine confirmed each removal.");
    out << "reaperd_reaps_total " << latency.count() << '\n';
    header(out, "reaperd_reap_latency_seconds", "histogram",
           "Seconds from when a container became due for reaping (its session ended, an orphan "
           "report came, its max_age passed) until the engine confirmed its removal.");
    std::string buckets;
    latency.render(buckets, "reaperd_reap_latency_seconds");
    out << buckets;
    header(out, "reaperd_sessions_ended_total", "counter", "Sessions ended, by reason.");
    for (const auto& [reason, count] : sessions_ended())
        out << "reaperd_sessions_ended_total{reason=\"" << escape_label(reason) << "\"} " << count
            << '\n';
    header(out, "reaperd_log_action_failures_total", "counter",
           "Log-cap actions (truncate, stop, kill, remove) that failed; each is tried again.");
    out << "reaperd_log_action_failures_total " << gauges.log_action_failures << '\n';
    header(out, "reaperd_log_unopenable", "gauge",
           "Container logs in scope that reaperd cannot open (permissions, another mount "
           "namespace, a data root it cannot see), so not capped.");
    out << "reaperd_log_unopenable " << gauges.log_unopenable << '\n';
    header(out, "reaperd_log_open_failures_total", "counter",
           "Containers whose log reaperd could not open, each warned about once.");
    out << "reaperd_log_open_failures_total " << gauges.log_open_failures << '\n';
    header(out, "reaperd_log_cut_fallbacks_total", "counter",
           "Log cuts that truncated the live file to 0 instead of punching out its oldest part: "
           "its file system refused the punch, or its apparent size neared the largest file.");
    out << "reaperd_log_cut_fallbacks_total " << gauges.log_cut_fallbacks << '\n';
    header(out, "reaperd_control_refused_total", "counter",
           "Control connections and leases refused by a limit (control.max_connections, "
           "control.max_connections_per_uid, control.max_leases_per_uid) or, at a user's reaperd, "
           "from another uid (uid), by reason.");
    for (const auto& [reason, count] : control_refusals())
        out << "reaperd_control_refused_total{reason=\"" << escape_label(reason) << "\"} " << count << '\n';
    header(out, "reaperd_state_save_failures_total", "counter",
           "Times the state file could not be saved; the next change tries again.");
    out << "reaperd_state_save_failures_total " << state_save_failures() << '\n';
    header(out, "reaperd_tombstones", "gauge",
           "Ended sessions remembered, to reap containers created later under their ids.");
    out << "reaperd_tombstones " << gauges.tombstones << '\n';
    header(out, "reaperd_tombstones_evicted_total", "counter",
           "Tombstones forgotten before sessions.tombstone_ttl because more than "
           "sessions.max_tombstones were held.");
    out << "reaperd_tombstones_evicted_total " << tombstones_evicted() << '\n';
    header(out, "reaperd_engine_last_sync_timestamp_seconds", "gauge",
           "Unix time of the last full list of the engine's containers reconciled; 0 before "
           "the first.");
    out << "reaperd_engine_last_sync_timestamp_seconds "
        << format_value(static_cast<double>(engine_last_sync_ms_.load()) / 1000) << '\n';
    header(out, "reaperd_build_info", "gauge", "Always 1; the version reaperd was built as.");
    out << "reaperd_build_info{version=\"" << escape_label(REAPER_VERSION) << "\"} 1\n";

    if (const auto& p = gauges.process) {
        header(out, "process_cpu_seconds_total", "counter",
               "Total user and system CPU time spent in seconds.");
        out << "process_cpu_seconds_total " << format_value(p->cpu_seconds) << '\n';
        header(out, "process_open_fds", "gauge", "Number of open file descriptors.");
        out << "process_open_fds " << p->open_fds << '\n';
        header(out, "process_max_fds", "gauge", "Maximum number of open file descriptors.");
        out << "process_max_fds " << p->max_fds << '\n';
        header(out, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
        out << "process_resident_memory_bytes " << p->resident_memory_bytes << '\n';
        header(out, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.");
        out << "process_virtual_memory_bytes " << p->virtual_memory_bytes << '\n';
        header(out, "process_start_time_seconds", "gauge",
               "Start time of the process since unix epoch in seconds.");
        out << "process_start_time_seconds " << format_value(p->start_time_seconds) << '\n';
    }
    return out.str();
}

}  // namespace reaperd
