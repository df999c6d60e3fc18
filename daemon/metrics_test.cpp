#include "metrics.hpp"

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <unistd.h>

using namespace reaperd;
using namespace std::chrono_literals;

BOOST_AUTO_TEST_CASE(renders_every_metric_in_prometheus_text_format) {
    Metrics m;
    m.reap_done(30ms);
    m.reap_done(2s);
    m.reap_failed();
    m.engine_reconnect();
    m.action("reap");
    m.action("reap");
    m.action("end_session");
    Gauges g;
    g.tracked_containers = 12;
    g.sessions_by_state = {{"leased", 3}, {"ended", 1}};
    g.pending_reaps = 1;
    g.engine_up = true;
    g.log_bytes_dropped = 4096;
    g.log_actions = {{"truncate", 5}, {"reap", 1}};
    std::string text = m.render(g);
    for (const char* line : {
             "# TYPE reaperd_tracked_containers gauge\n",
             "reaperd_tracked_containers 12\n",
             "reaperd_sessions{state=\"leased\"} 3\n",
             "reaperd_sessions{state=\"grace\"} 0\n",
             "reaperd_sessions{state=\"ended\"} 1\n",
             "reaperd_sessions{state=\"unclaimed\"} 0\n",
             "reaperd_pending_reaps 1\n",
             "reaperd_engine_up 1\n",
             "# TYPE reaperd_reaps_done_total counter\n",
             "reaperd_reaps_done_total 2\n",
             "reaperd_reaps_failed_total 1\n",
             "reaperd_log_bytes_dropped_total 4096\n",
             "reaperd_actions_total{action=\"reap\"} 3\n",
             "reaperd_actions_total{action=\"end_session\"} 1\n",
             "reaperd_actions_total{action=\"truncate\"} 5\n",
             "reaperd_engine_reconnects_total 1\n",
         })
        BOOST_TEST(text.find(line) != std::string::npos, line);
    BOOST_TEST(text.back() == '\n');
}

BOOST_AUTO_TEST_CASE(action_label_values_are_escaped) {
    Metrics m;
    m.action("a\"b\\c\nd");
    std::string text = m.render({});
    BOOST_TEST(text.find("reaperd_actions_total{action=\"a\\\"b\\\\c\\nd\"} 1\n") != std::string::npos);
}

namespace {

// The family a sample line belongs to: its name less a histogram's _bucket/_sum/_count.
std::string family_of(const std::string& sample, const std::set<std::string>& histograms) {
    std::string name = sample.substr(0, sample.find_first_of("{ "));
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        const std::string s = suffix;
        if (name.size() > s.size() && name.ends_with(s) &&
            histograms.count(name.substr(0, name.size() - s.size())))
            return name.substr(0, name.size() - s.size());
    }
    return name;
}

// One of each event, for the renders below.
void make_busy(Metrics& m) {
    m.reap_done(40ms);
    m.reap_failed();
    m.session_ended(EndReason::end);
    m.session_ended(EndReason::lease_expired);
    m.session_ended(EndReason::lease_expired);
    m.state_save_failed();
    m.tombstone_evicted();
    m.tombstone_evicted();
    m.engine_synced(std::chrono::system_clock::time_point{1700000000123ms});
    m.action("reap");
}

Gauges busy_gauges() {
    Gauges g;
    g.log_action_failures = 7;
    g.tombstones = 3;
    ProcessStats p;
    p.open_fds = 9;
    p.max_fds = 1024;
    p.resident_memory_bytes = 12 << 20;
    p.virtual_memory_bytes = 300 << 20;
    p.cpu_seconds = 1.25;
    p.start_time_seconds = 1700000000.5;
    g.process = p;
    return g;
}

}  // namespace

// What `promtool check metrics` insists on, checked without it (prometheus_test runs the
// real one): every family has HELP then TYPE once, before its samples, which are contiguous.
BOOST_AUTO_TEST_CASE(every_family_has_one_help_and_type_before_its_contiguous_samples) {
    Metrics m;
    make_busy(m);
    std::istringstream text(m.render(busy_gauges()));
    std::map<std::string, std::string> types;
    std::set<std::string> helps, histograms, finished;
    std::string line, current;
    while (std::getline(text, line)) {
        BOOST_TEST_CONTEXT(line) {
            BOOST_TEST(!line.empty());
            if (line.starts_with("# HELP ")) {
                auto name = line.substr(7, line.find(' ', 7) - 7);
                BOOST_TEST(helps.insert(name).second, "a second HELP for " << name);
            } else if (line.starts_with("# TYPE ")) {
                auto name = line.substr(7, line.find(' ', 7) - 7);
                auto type = line.substr(line.rfind(' ') + 1);
                BOOST_TEST(helps.count(name) == 1u, "HELP before TYPE");
                BOOST_TEST(types.emplace(name, type).second, "a second TYPE for " << name);
                if (type == "histogram") histograms.insert(name);
                if (type == "counter") BOOST_TEST(name.ends_with("_total"));
                if (!current.empty()) finished.insert(current);
                current = name;
            } else {
                auto family = family_of(line, histograms);
                BOOST_TEST(family == current, "sample outside its family");
                BOOST_TEST(!finished.count(family));
            }
        }
    }
    for (const char* family :
         {"reaperd_reaps_total", "reaperd_reaps_done_total", "reaperd_reap_latency_seconds",
          "reaperd_sessions_ended_total", "reaperd_log_action_failures_total",
          "reaperd_state_save_failures_total", "reaperd_engine_last_sync_timestamp_seconds",
          "reaperd_tombstones", "reaperd_tombstones_evicted_total",
          "reaperd_build_info", "process_cpu_seconds_total", "process_open_fds",
          "process_max_fds", "process_resident_memory_bytes", "process_virtual_memory_bytes",
          "process_start_time_seconds"})
        BOOST_TEST(types.count(family) == 1u, family);
}

BOOST_AUTO_TEST_CASE(renders_the_new_families) {
    Metrics m;
    make_busy(m);
    const std::string text = m.render(busy_gauges());
    for (const char* line : {
             "# TYPE reaperd_reaps_total counter\n",
             "reaperd_reaps_total 1\n",
             "reaperd_reaps_done_total 1\n",
             "# TYPE reaperd_reap_latency_seconds histogram\n",
             "reaperd_reap_latency_seconds_bucket{le=\"0.025\"} 0\n",
             "reaperd_reap_latency_seconds_bucket{le=\"0.05\"} 1\n",
             "reaperd_reap_latency_seconds_bucket{le=\"+Inf\"} 1\n",
             "reaperd_reap_latency_seconds_sum 0.04\n",
             "reaperd_reap_latency_seconds_count 1\n",
             "reaperd_sessions_ended_total{reason=\"end\"} 1\n",
             "reaperd_sessions_ended_total{reason=\"lease_expired\"} 2\n",
             "reaperd_log_action_failures_total 7\n",
             "reaperd_state_save_failures_total 1\n",
             "# TYPE reaperd_tombstones gauge\n",
             "reaperd_tombstones 3\n",
             "# TYPE reaperd_tombstones_evicted_total counter\n",
             "reaperd_tombstones_evicted_total 2\n",
             "# TYPE reaperd_engine_last_sync_timestamp_seconds gauge\n",
             "reaperd_engine_last_sync_timestamp_seconds 1700000000.123\n",
             "# TYPE reaperd_build_info gauge\n",
             "reaperd_build_info{version=\"" REAPER_VERSION "\"} 1\n",
             "# TYPE process_cpu_seconds_total counter\n",
             "process_cpu_seconds_total 1.25\n",
             "process_open_fds 9\n",
             "process_max_fds 1024\n",
             "process_resident_memory_bytes 12582912\n",
             "process_virtual_memory_bytes 314572800\n",
             "process_start_time_seconds 1700000000.5\n",
         })
        BOOST_TEST(text.find(line) != std::string::npos, line);
}

BOOST_AUTO_TEST_CASE(before_any_event_counters_are_zero_and_process_families_need_figures) {
    const std::string text = Metrics().render({});
    for (const char* line : {
             "reaperd_reaps_total 0\n",
             "reaperd_reap_latency_seconds_bucket{le=\"+Inf\"} 0\n",
             "reaperd_reap_latency_seconds_sum 0\n",
             "reaperd_reap_latency_seconds_count 0\n",
             "# TYPE reaperd_sessions_ended_total counter\n",
             "reaperd_state_save_failures_total 0\n",
             "reaperd_engine_last_sync_timestamp_seconds 0\n",
         })
        BOOST_TEST(text.find(line) != std::string::npos, line);
    BOOST_TEST(text.find("reaperd_sessions_ended_total{") == std::string::npos);
    BOOST_TEST(text.find("process_") == std::string::npos);
}

BOOST_AUTO_TEST_CASE(histogram_buckets_are_cumulative_with_inclusive_upper_bounds) {
    struct Case {
        const char* name;
        std::vector<double> observed;
        std::vector<std::uint64_t> cumulative;  // le=1, le=5, le=+Inf
        const char* sum;
    } cases[] = {
        {"none", {}, {0, 0, 0}, "0"},
        {"on a bound counts in it", {1, 5}, {1, 2, 2}, "6"},
        {"above the last bound", {7.5}, {0, 0, 1}, "7.5"},
        {"zero and a fraction", {0, 0.5, 3}, {2, 3, 3}, "3.5"},
    };
    for (const auto& c : cases) {
        BOOST_TEST_CONTEXT(c.name) {
            Histogram h({1, 5});
            for (double v : c.observed) h.observe(v);
            std::string text;
            h.render(text, "x_seconds");
            const std::string expected =
                "x_seconds_bucket{le=\"1\"} " + std::to_string(c.cumulative[0]) + "\n" +
                "x_seconds_bucket{le=\"5\"} " + std::to_string(c.cumulative[1]) + "\n" +
                "x_seconds_bucket{le=\"+Inf\"} " + std::to_string(c.cumulative[2]) + "\n" +
                "x_seconds_sum " + c.sum + "\n" + "x_seconds_count " +
                std::to_string(c.observed.size()) + "\n";
            BOOST_TEST(text == expected);
        }
    }
}

BOOST_AUTO_TEST_CASE(reap_latency_counts_each_reap_and_a_negative_latency_as_zero) {
    Metrics m;
    m.reap_done(-3s);  // the wall clock stepped back between queueing and removal
    m.reap_done(500ms);
    BOOST_TEST(m.reaps_done() == 2u);
    BOOST_TEST(m.reap_latency().count() == 2u);
    BOOST_TEST(m.reap_latency().sum() == 0.5);
}

BOOST_AUTO_TEST_CASE(values_are_written_as_prometheus_reads_them) {
    const std::pair<double, const char*> cases[] = {
        {0, "0"},           {3, "3"},
        {-2, "-2"},         {0.025, "0.025"},
        {1.25, "1.25"},     {1700000000.123, "1700000000.123"},
        {1e300, "1e+300"},  {std::numeric_limits<double>::infinity(), "+Inf"},
        {-std::numeric_limits<double>::infinity(), "-Inf"},
        {std::numeric_limits<double>::quiet_NaN(), "NaN"},
    };
    for (const auto& [value, text] : cases) BOOST_TEST(format_value(value) == text);
}

BOOST_AUTO_TEST_CASE(proc_stat_lines_parse_from_the_last_parenthesis) {
    // utime 150 + stime 50 ticks, starttime 12345 ticks, vsize 314572800, rss 3072 pages.
    const std::string tail =
        " S 1 100 100 0 -1 4194560 5000 0 0 0 150 50 0 0 20 0 7 0 12345 314572800 3072 "
        "18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 17 1 0 0 0 0 0\n";
    struct Case {
        const char* name;
        std::string stat;
        bool parses;
    } cases[] = {
        {"plain", "4242 (reaperd)" + tail, true},
        {"a name with spaces and parentheses", "4242 (a (b) c)" + tail, true},
        {"no parenthesis", "4242 reaperd" + tail, false},
        {"cut short", "4242 (reaperd) S 1 100 100 0 -1 4194560 5000 0 0 0 150 50", false},
        {"not a number", "4242 (reaperd) S 1 100 100 0 -1 4194560 5000 0 0 0 x 50 0 0 20 0 7 0 "
                         "12345 314572800 3072\n",
         false},
        {"empty", "", false},
    };
    for (const auto& c : cases) {
        BOOST_TEST_CONTEXT(c.name) {
            auto parsed = parse_proc_stat(c.stat, 100, 4096);
            BOOST_TEST(parsed.has_value() == c.parses);
            if (parsed && c.parses) {
                BOOST_TEST(parsed->cpu_seconds == 2.0);
                BOOST_TEST(parsed->start_seconds_after_boot == 123.45);
                BOOST_TEST(parsed->virtual_memory_bytes == 314572800u);
                BOOST_TEST(parsed->resident_memory_bytes == 3072u * 4096u);
            }
        }
    }
    BOOST_TEST(!parse_proc_stat("4242 (reaperd)" + tail, 0, 4096));
}

BOOST_AUTO_TEST_CASE(boot_time_is_read_from_the_btime_line) {
    const std::pair<const char*, std::optional<std::uint64_t>> cases[] = {
        {"cpu  1 2 3\nintr 5 6\nbtime 1700000000\nprocesses 10\n", 1700000000u},
        {"btime 42", 42u},
        {"cpu 1\nbtime x\n", std::nullopt},
        {"cpu 1\nxbtime 5\n", std::nullopt},
        {"", std::nullopt},
    };
    for (const auto& [text, expected] : cases) BOOST_TEST_CONTEXT(text) {
            BOOST_TEST((parse_boot_time(text) == expected));
        }
}

BOOST_AUTO_TEST_CASE(this_process_figures_are_plausible) {
    const auto stats = read_process_stats();
    BOOST_REQUIRE(stats.has_value());
    BOOST_TEST(stats->open_fds >= 3u);  // stdin, stdout, stderr at least
    BOOST_TEST(stats->max_fds >= stats->open_fds);
    BOOST_TEST(stats->resident_memory_bytes > 0u);
    BOOST_TEST(stats->virtual_memory_bytes >= stats->resident_memory_bytes);
    BOOST_TEST(stats->cpu_seconds >= 0.0);
    const double now = std::chrono::duration<double>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
    // This test process started moments ago (ticks are 10 ms; btime is whole seconds).
    BOOST_TEST(stats->start_time_seconds <= now + 1);
    BOOST_TEST(stats->start_time_seconds > now - 600);
}

BOOST_AUTO_TEST_CASE(control_refusals_are_counted_by_reason_every_reason_shown) {
    Metrics m;
    m.control_refused("leases_per_uid");
    m.control_refused("leases_per_uid");
    m.control_refused("connections_per_uid");
    const std::string text = m.render(Gauges{});
    for (const char* line : {"# TYPE reaperd_control_refused_total counter\n",
                             "reaperd_control_refused_total{reason=\"connections\"} 0\n",
                             "reaperd_control_refused_total{reason=\"connections_per_uid\"} 1\n",
                             "reaperd_control_refused_total{reason=\"leases_per_uid\"} 2\n",
                             "reaperd_control_refused_total{reason=\"uid\"} 0\n"})
        BOOST_TEST(text.find(line) != std::string::npos, line);
}
