#include "logcap.hpp"
#include "logcap_file.hpp"
#include "logcap_inotify.hpp"
#include "logcap_policy.hpp"
#include "logcap_records.hpp"

#include "fake_engine.hpp"

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include <unistd.h>

namespace fs = std::filesystem;
using namespace reaperd;
using namespace reaperd::logcap;
using namespace std::chrono_literals;

namespace {

constexpr std::uint64_t MiB = 1024 * 1024;

CapTarget target(std::string id, bool owned, std::uint64_t cap, std::uint64_t bytes) {
    CapTarget t;
    t.id = std::move(id);
    t.owned = owned;
    t.cap.cap_bytes = cap;
    t.log_bytes = bytes;
    return t;
}

LogsConfig logs_config(LogAction action, LogScope scope, std::uint64_t max = 10 * MiB,
                       std::uint64_t total = 0) {
    LogsConfig c;
    c.max_size_bytes = max;
    c.action = action;
    c.scope = scope;
    c.total_max_size_bytes = total;
    return c;
}

const LogAction all_actions[] = {LogAction::truncate, LogAction::stop, LogAction::kill, LogAction::remove};
const LogScope all_scopes[] = {LogScope::sessions, LogScope::all};

}  // namespace

BOOST_AUTO_TEST_SUITE(policy)

// The project's one absolute rule, over the whole table: every action, every scope, a
// container over its own cap and over the total budget, owned or not.
BOOST_AUTO_TEST_CASE(unowned_containers_are_only_ever_truncated) {
    for (auto action : all_actions)
        for (auto scope : all_scopes)
            for (bool owned : {false, true})
                for (auto reason : {CapReason::own_cap, CapReason::total_budget}) {
                    BOOST_TEST_CONTEXT("action " << std::string(reaperd::to_string(action)) << ", scope "
                                                 << (scope == LogScope::all ? "all" : "sessions")
                                                 << ", owned " << owned << ", " << to_string(reason)) {
                        auto config = reason == CapReason::own_cap
                                          ? logs_config(action, scope, 10 * MiB)
                                          : logs_config(action, scope, 0, 10 * MiB);
                        std::vector<CapTarget> targets{target("a", owned, config.max_size_bytes, 20 * MiB)};
                        auto decisions = decide(targets, config);
                        if (!owned && scope == LogScope::sessions) {
                            BOOST_TEST(decisions.empty());
                            continue;
                        }
                        BOOST_TEST_REQUIRE(decisions.size() == 1u);
                        BOOST_TEST((decisions[0].reason == reason));
                        auto expected = owned ? action : LogAction::truncate;
                        BOOST_TEST((decisions[0].action == expected));
                        if (!owned) BOOST_TEST((decisions[0].action == LogAction::truncate));
                    }
                }
}

BOOST_AUTO_TEST_CASE(under_the_mark_nothing_happens) {
    auto config = logs_config(LogAction::stop, LogScope::all);
    std::vector<CapTarget> targets{target("a", true, 10 * MiB, 10 * MiB - 1),
                                   target("b", false, 10 * MiB, 0)};
    BOOST_TEST(decide(targets, config).empty());
    targets[0].log_bytes = 10 * MiB;
    BOOST_TEST(decide(targets, config).size() == 1u);
}

BOOST_AUTO_TEST_CASE(a_fast_writer_is_cut_at_a_lower_mark) {
    auto config = logs_config(LogAction::truncate, LogScope::sessions);
    std::vector<CapTarget> targets{target("a", true, 10 * MiB, 8 * MiB)};
    BOOST_TEST(decide(targets, config).empty());
    // 14 MB in 200 ms: the mark is at its floor, 9/16 of the cap, above the half a cut keeps.
    targets[0].headroom_bytes = headroom_for(70e6);
    BOOST_TEST(mark_for(10 * MiB, targets[0].headroom_bytes) == 10 * MiB - 10 * MiB / 16 * 7);
    BOOST_TEST(mark_for(10 * MiB, targets[0].headroom_bytes) > keep_for(10 * MiB));
    BOOST_TEST(decide(targets, config).size() == 1u);
}

// A cut punches out the oldest part and keeps the newest half of the cap, unless the file
// system refused a punch before, or the apparent size (which punching leaves growing) reached
// its limit: then it truncates.
BOOST_AUTO_TEST_CASE(a_cut_punches_and_keeps_half_the_cap_unless_refused_or_near_the_largest_file) {
    auto config = logs_config(LogAction::truncate, LogScope::sessions);
    std::vector<CapTarget> targets{target("a", true, 10 * MiB, 11 * MiB)};
    targets[0].apparent_bytes = 700 * MiB;
    targets[0].apparent_limit = apparent_limit_for(1024 * MiB);
    auto decisions = decide(targets, config);
    BOOST_TEST_REQUIRE(decisions.size() == 1u);
    BOOST_TEST((decisions[0].cut.method == CutMethod::punch_hole));
    BOOST_TEST(decisions[0].cut.keep_bytes == 5 * MiB);
    BOOST_TEST(!decisions[0].cut.at_size_limit);

    targets[0].punch_refused = true;
    decisions = decide(targets, config);
    BOOST_TEST_REQUIRE(decisions.size() == 1u);
    BOOST_TEST((decisions[0].cut.method == CutMethod::truncate));
    BOOST_TEST(!decisions[0].cut.at_size_limit);

    targets[0].punch_refused = false;
    BOOST_TEST(apparent_limit_for(1024 * MiB) == 768 * MiB);
    targets[0].apparent_bytes = 768 * MiB;
    decisions = decide(targets, config);
    BOOST_TEST_REQUIRE(decisions.size() == 1u);
    BOOST_TEST((decisions[0].cut.method == CutMethod::truncate));
    BOOST_TEST(decisions[0].cut.at_size_limit);

    targets[0].apparent_limit = 0;  // no limit known
    BOOST_TEST((decide(targets, config)[0].cut.method == CutMethod::punch_hole));
}

// What a budget cut keeps counts as still there: two logs that both must be cut to fit.
BOOST_AUTO_TEST_CASE(the_budget_counts_what_its_cuts_keep) {
    auto config = logs_config(LogAction::truncate, LogScope::all, 0, 100 * MiB);
    std::vector<CapTarget> targets{target("a", true, 0, 60 * MiB), target("b", true, 0, 50 * MiB)};
    auto decisions = decide(targets, config);
    // Share: half the budget over two logs, 25 MiB each. 110 -> cut a (keeps 25) -> 75: fits.
    BOOST_TEST_REQUIRE(decisions.size() == 1u);
    BOOST_TEST(targets[decisions[0].target].id == "a");
    BOOST_TEST(decisions[0].cut.keep_bytes == 25 * MiB);
    targets[0].log_bytes = 90 * MiB;  // 140 -> a keeps 25 -> 75: fits
    BOOST_TEST(decide(targets, config).size() == 1u);
    targets[1].log_bytes = 80 * MiB;  // 170 -> a -> 105 -> b keeps 25 -> 50
    BOOST_TEST(decide(targets, config).size() == 2u);
}

BOOST_AUTO_TEST_CASE(halted_busy_exempt_and_uncapped_targets_are_left) {
    auto config = logs_config(LogAction::stop, LogScope::all);
    std::vector<CapTarget> targets{target("halted", true, 10 * MiB, 20 * MiB),
                                   target("busy", true, 10 * MiB, 20 * MiB),
                                   target("exempt", true, 0, 20 * MiB),
                                   target("uncapped", true, 0, 20 * MiB)};
    targets[0].halted = true;
    targets[1].busy = true;
    targets[2].cap.exempt = true;
    BOOST_TEST(decide(targets, config).empty());
}

// A log the engine rotates within its cap is not cut for its own cap, however full its files
// are, but still counts, and can be cut, in the total budget.
BOOST_AUTO_TEST_CASE(a_log_the_engine_rotates_within_its_cap_is_cut_only_for_the_budget) {
    auto config = logs_config(LogAction::truncate, LogScope::sessions, 2 * MiB);
    std::vector<CapTarget> targets{target("rotated", true, 2 * MiB, 2 * MiB)};
    BOOST_TEST(decide(targets, config).size() == 1u);
    targets[0].cap.engine_rotates = true;
    BOOST_TEST(decide(targets, config).empty());

    config = logs_config(LogAction::truncate, LogScope::sessions, 2 * MiB, 3 * MiB);
    std::vector<CapTarget> two{target("rotated", true, 2 * MiB, 2 * MiB), target("other", true, 2 * MiB, MiB)};
    two[0].cap.engine_rotates = true;
    const auto decisions = decide(two, config);
    BOOST_TEST_REQUIRE(decisions.size() == 1u);
    BOOST_TEST(two[decisions[0].target].id == "rotated");
    BOOST_TEST((decisions[0].reason == CapReason::total_budget));
}

// Before the engine has described a container (it is known from the persisted list only),
// stop, kill and remove cannot go through the door's inspect: its log is cut instead.
BOOST_AUTO_TEST_CASE(a_target_known_only_locally_is_truncated_whatever_the_action) {
    for (auto action : all_actions)
        for (bool budget : {false, true}) {
            BOOST_TEST_CONTEXT("action " << std::string(reaperd::to_string(action)) << ", budget " << budget) {
                auto config = budget ? logs_config(action, LogScope::sessions, 0, 10 * MiB)
                                     : logs_config(action, LogScope::sessions, 10 * MiB);
                std::vector<CapTarget> targets{target("a", true, config.max_size_bytes, 20 * MiB)};
                targets[0].local_only = true;
                auto decisions = decide(targets, config);
                BOOST_TEST_REQUIRE(decisions.size() == 1u);
                BOOST_TEST((decisions[0].action == LogAction::truncate));
            }
        }
}

BOOST_AUTO_TEST_CASE(the_total_budget_acts_on_the_largest_first) {
    auto config = logs_config(LogAction::stop, LogScope::all, 0, 100 * MiB);
    std::vector<CapTarget> targets{target("small", true, 0, 10 * MiB), target("big", true, 0, 60 * MiB),
                                   target("middle", false, 0, 35 * MiB),
                                   target("exempt", true, 0, 500 * MiB)};
    targets[3].cap.exempt = true;
    auto decisions = decide(targets, config);
    // 105 MiB: cutting "big" (60) brings the rest to 45 MiB.
    BOOST_TEST_REQUIRE(decisions.size() == 1u);
    BOOST_TEST(targets[decisions[0].target].id == "big");
    BOOST_TEST((decisions[0].action == LogAction::stop));
    BOOST_TEST((decisions[0].reason == CapReason::total_budget));

    targets[1].log_bytes = 30 * MiB;  // 75 MiB: fits
    BOOST_TEST(decide(targets, config).empty());

    targets[1].log_bytes = 80 * MiB;
    targets[0].log_bytes = 70 * MiB;  // 185: big (80) -> 105, still over; then "small" (70) -> 35
    decisions = decide(targets, config);
    BOOST_TEST_REQUIRE(decisions.size() == 2u);
    BOOST_TEST(targets[decisions[0].target].id == "big");
    BOOST_TEST(targets[decisions[1].target].id == "small");
}

BOOST_AUTO_TEST_CASE(the_budget_skips_halted_logs_and_counts_those_cut_for_their_own_cap_as_done) {
    auto config = logs_config(LogAction::stop, LogScope::all, 50 * MiB, 100 * MiB);
    std::vector<CapTarget> targets{target("halted", true, 50 * MiB, 45 * MiB),
                                   target("over-own", true, 50 * MiB, 60 * MiB),
                                   target("a", true, 50 * MiB, 40 * MiB)};
    targets[0].halted = true;
    auto decisions = decide(targets, config);
    BOOST_TEST_REQUIRE(decisions.size() == 1u);
    BOOST_TEST(targets[decisions[0].target].id == "over-own");
    BOOST_TEST((decisions[0].reason == CapReason::own_cap));
}

BOOST_AUTO_TEST_CASE(labels_override_the_default) {
    struct Row {
        std::optional<std::string> label;
        std::uint64_t cap;
        bool exempt;
        bool bad;
    };
    const Row rows[] = {
        // Docker's max-size grammar, decimal (units.hpp parse_docker_size): "1MiB" is 10^6.
        {std::nullopt, 10 * MiB, false, false}, {"1MiB", 1'000'000, false, false},
        {"512k", 512'000, false, false},        {"10m", 10'000'000, false, false},
        {"1.5g", 1'500'000'000, false, false},  {"0", 0, true, false},
        {"lots", 10 * MiB, false, true},        {"-5MiB", 10 * MiB, false, true},
        {"", 10 * MiB, false, true},
    };
    for (const auto& row : rows) {
        BOOST_TEST_CONTEXT("label " << row.label.value_or("(none)")) {
            reaper::Labels labels;
            if (row.label) labels[max_size_label] = *row.label;
            auto setting = resolve_cap(labels, 10 * MiB);
            BOOST_TEST(setting.cap_bytes == row.cap);
            BOOST_TEST(setting.exempt == row.exempt);
            BOOST_TEST(setting.bad_label.has_value() == row.bad);
        }
    }
}

BOOST_AUTO_TEST_CASE(growth_counts_when_sustained_and_decays_over_time) {
    GrowthEstimator growth;
    auto t = GrowthEstimator::Clock::time_point{} + 1h;
    growth.observe(0, t);
    growth.observe(700'000, t + 5ms);  // inside the minimum window: not measured yet
    BOOST_TEST(growth.bytes_per_second() == 0.0);
    growth.observe(1'400'000, t + 20ms);  // one window at 70 MB/s: could be a burst
    BOOST_TEST(growth.bytes_per_second() == 0.0);
    growth.observe(2'800'000, t + 40ms);  // two: a runaway
    BOOST_TEST(growth.bytes_per_second() == 70e6, boost::test_tools::tolerance(0.01));
    growth.observe(0, t + 45ms);  // cut: a new window, the rate is kept
    BOOST_TEST(growth.bytes_per_second() == 70e6, boost::test_tools::tolerance(0.01));
    growth.observe(0, t + 65ms);  // quiet for 20 ms: decays, not drops
    BOOST_TEST(growth.bytes_per_second() > 40e6);
    BOOST_TEST(growth.bytes_per_second() < 70e6);
    growth.observe(0, t + 3065ms);  // quiet for 3 s (six half-lives): about gone
    BOOST_TEST(growth.bytes_per_second() < 2e6);
}

BOOST_AUTO_TEST_CASE(a_single_burst_is_not_a_rate) {
    GrowthEstimator growth;
    auto t = GrowthEstimator::Clock::time_point{} + 1h;
    growth.observe(0, t);
    growth.observe(512 * 1024, t + 20ms);
    growth.observe(512 * 1024, t + 1s);
    BOOST_TEST(growth.bytes_per_second() == 0.0);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- the watcher, on real files, with a scripted engine ------------------------------------
// A cut can come in the middle of an append (the capper sees the size grow page by page),
// leaving the rest of it in the file: so a cut shows as "under the cap", not as empty.
namespace {

using reaper::test::FakeEngine;

struct Record {
    Priority priority;
    std::string message_id;
    std::string message;
    std::map<std::string, std::string> fields;
};

class Records {
public:
    LogSink sink() {
        return [this](Priority p, std::string_view id, std::string_view message, std::vector<LogField> fields) {
            Record r{p, std::string(id), std::string(message), {}};
            for (auto& f : fields) r.fields[f.name] = f.value;
            // The watcher thread's start-up record of its scheduling class comes when that
            // thread runs, so it is kept out of the counts (daemon_test checks it).
            if (r.fields.count("SCHEDULING")) return;
            std::lock_guard lock(mutex_);
            records_.push_back(std::move(r));
        };
    }
    std::vector<Record> all() {
        std::lock_guard lock(mutex_);
        return records_;
    }
    std::vector<Record> with(const std::string& field, const std::string& value) {
        std::vector<Record> out;
        for (auto& r : all())
            if (r.fields.count(field) && r.fields.at(field) == value) out.push_back(r);
        return out;
    }

private:
    std::mutex mutex_;
    std::vector<Record> records_;
};

// The capper's clock: real time, plus what a test skipped. A backstop round, a retry window
// or a coalescing window is skipped at once (skip(), then LogCapper::settle()) rather than
// slept through.
class SkippingClock {
public:
    using Clock = std::chrono::steady_clock;
    Clock::time_point now() const { return Clock::now() + Clock::duration{skipped_.load()}; }
    void skip(Clock::duration by) { skipped_ += by.count(); }

private:
    std::atomic<Clock::duration::rep> skipped_{0};
};

// The backstop's interval in these tests: long enough that no backstop round comes of real
// time during a test, so the rounds a test counts are the ones it skipped to.
constexpr auto check_interval = 1h;

// A container directory laid out as the engine lays it out, in a temp dir.
struct Fixture {
    fs::path root = fs::temp_directory_path() / ("logcap-test-" + std::to_string(::getpid()));
    FakeEngine engine;
    Records records;
    SkippingClock clock;
    Fixture() { fs::create_directories(root); }
    ~Fixture() { fs::remove_all(root); }

    ContainerLog container(const std::string& hex, const std::string& session,
                           const std::string& driver = "json-file") {
        std::string id = hex + std::string(64 - hex.size(), '0');
        ContainerLog c;
        c.id = id;
        c.name = "c-" + hex;
        c.session = session;
        c.log_driver = driver;
        c.docker_root_dir = root.string();
        engine.add(id, session.empty() ? reaper::Labels{} : reaper::Labels{{"reaperd.session", session}});
        fs::create_directories(root / "containers" / id);
        if (driver == "json-file") {
            c.log_path = (root / "containers" / id / (id + "-json.log")).string();
            std::ofstream(c.log_path).flush();
        }
        return c;
    }

    LogCapper::Options options(LogsConfig logs) {
        LogCapper::Options o;
        o.logs = logs;
        o.logs.check_interval = check_interval;
        o.sink = records.sink();
        o.clock = [this] { return clock.now(); };
        return o;
    }

    // Moves the clock by `by` and lets the capper run what came due.
    void skip(LogCapper& capper, std::chrono::milliseconds by) {
        clock.skip(by);
        BOOST_TEST_REQUIRE(capper.settle());
    }
    // Moves the clock to the next backstop round and lets the capper run it.
    void backstop(LogCapper& capper, int rounds = 1) {
        for (int i = 0; i < rounds; ++i) skip(capper, check_interval);
    }
};

void append(const std::string& path, std::uint64_t bytes) {
    std::ofstream out(path, std::ios::app | std::ios::binary);
    std::string chunk(64 * 1024, 'x');
    for (std::uint64_t done = 0; done < bytes; done += chunk.size())
        out.write(chunk.data(), static_cast<std::streamsize>(std::min<std::uint64_t>(chunk.size(), bytes - done)));
}

std::uint64_t size_of(const std::string& path) {
    std::error_code ec;
    auto n = fs::file_size(path, ec);
    return ec ? 0 : n;
}

// The bytes `path` holds on disk (0 if it does not exist): what the capper counts.
std::uint64_t allocated_of(const std::string& path) { return allocated_bytes(path); }

// Whether `condition` holds once the capper has run every message and read every write made
// before the call (LogCapper::settle()): what it would do about them is done.
template <typename F>
bool settled(LogCapper& capper, F condition) {
    return capper.settle() && condition();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(watcher)

BOOST_AUTO_TEST_CASE(a_log_over_its_cap_is_cut_and_recorded) {
    Fixture f;
    LogCapper capper(f.engine, f.options(logs_config(LogAction::truncate, LogScope::sessions, 1 * MiB)));
    capper.start();
    auto c = f.container("a1", "s1");
    capper.add(c);
    BOOST_TEST_REQUIRE(settled(capper, [&] { return capper.watched() == 1u; }));
    // Under half the cap: not cut even if a loaded machine spreads the writes out so that
    // they read as a fast writer (whose mark is lowered to half the cap).
    append(c.log_path, 400 * 1024);
    BOOST_TEST(settled(capper, [&] { return size_of(c.log_path) == 400u * 1024; }));
    append(c.log_path, MiB);
    BOOST_TEST_REQUIRE(settled(capper, [&] { return capper.counters().truncations > 0u; }));
    BOOST_TEST(allocated_of(c.log_path) < MiB);
    BOOST_TEST_REQUIRE(settled(capper, [&] { return !f.records.with("ACTION", "truncate").empty(); }));
    auto r = f.records.with("ACTION", "truncate").front();
    BOOST_TEST((r.priority == Priority::notice));
    BOOST_TEST(r.message_id == std::string(message_id::log_capped));
    BOOST_TEST(r.fields["CONTAINER_ID"] == c.id);
    BOOST_TEST(r.fields["CONTAINER_NAME"] == c.name);
    BOOST_TEST(r.fields["SESSION_ID"] == "s1");
    BOOST_TEST(std::stoull(r.fields["LOG_BYTES_BEFORE"]) >= MiB / 2);
    BOOST_TEST(std::stoull(r.fields["LOG_BYTES_AFTER"]) < MiB);
    BOOST_TEST(capper.counters().truncations == 1u);
    BOOST_TEST(capper.counters().log_bytes_dropped >= MiB / 2);
    BOOST_TEST(f.engine.calls().empty());
}

// Issue 21: the cut truncated the live file to 0, dropping the newest lines with the rest and
// leaving Docker 23+'s follower and --tail past the end of the file. It now punches out the
// oldest part: the apparent size stays, the newest half of the cap stays readable.
BOOST_AUTO_TEST_CASE(a_cut_punches_out_the_oldest_part_and_keeps_the_newest_half) {
    Fixture f;
    LogCapper capper(f.engine, f.options(logs_config(LogAction::truncate, LogScope::sessions, 1 * MiB)));
    capper.start();
    auto c = f.container("a2", "s1");
    capper.add(c);
    BOOST_TEST_REQUIRE(settled(capper, [&] { return capper.watched() == 1u; }));
    std::string written;
    for (int i = 0; written.size() < 1400 * 1024; ++i) written += "line " + std::to_string(i) + "\n";
    std::ofstream(c.log_path, std::ios::app | std::ios::binary) << written;
    BOOST_TEST_REQUIRE(settled(capper, [&] { return capper.counters().truncations == 1u; }));
    BOOST_TEST(size_of(c.log_path) == written.size());  // every offset still valid
    BOOST_TEST(allocated_of(c.log_path) >= MiB / 2);
    BOOST_TEST(allocated_of(c.log_path) < MiB / 2 + 64 * 1024);
    std::ifstream in(c.log_path, std::ios::binary);
    std::string now((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::size_t kept = MiB / 2;
    BOOST_TEST(now.substr(now.size() - kept) == written.substr(written.size() - kept));  // the newest half
    BOOST_TEST(now[0] == '\0');  // the oldest part is a hole
    BOOST_TEST_REQUIRE(settled(capper, [&] { return !f.records.with("ACTION", "truncate").empty(); }));
    auto r = f.records.with("ACTION", "truncate").front();
    BOOST_TEST(r.fields["CUT_METHOD"] == "punch_hole");
    BOOST_TEST(std::stoull(r.fields["LOG_BYTES_KEPT"]) >= MiB / 2);
    BOOST_TEST(std::stoull(r.fields["LOG_BYTES_AFTER"]) < MiB);
    BOOST_TEST(capper.counters().cut_fallbacks == 0u);
    // The next cut starts where the last hole ends and keeps the newest half again.
    std::string more;
    for (int i = 0; more.size() < 700 * 1024; ++i) more += "more " + std::to_string(i) + "\n";
    std::ofstream(c.log_path, std::ios::app | std::ios::binary) << more;
    BOOST_TEST_REQUIRE(settled(capper, [&] { return capper.counters().truncations == 2u; }));
    BOOST_TEST(size_of(c.log_path) == written.size() + more.size());
    BOOST_TEST(allocated_of(c.log_path) < MiB / 2 + 64 * 1024);
}

// Where the file system refuses to punch (vfat, NFS < 4.2, ...), the cut falls back to
// truncating, with one warning for the container however often it is cut, and a counter.
BOOST_AUTO_TEST_CASE(a_refused_punch_falls_back_to_truncate_with_one_warning) {
    Fixture f;
    auto options = f.options(logs_config(LogAction::truncate, LogScope::sessions, 1 * MiB));
    std::atomic<int> punches{0};
    options.cut_calls.punch_hole = [&](int, std::uint64_t, std::uint64_t) {
        ++punches;
        return EOPNOTSUPP;
    };
    LogCapper capper(f.engine, options);
    capper.start();
    auto c = f.container("a3", "s1");
    capper.add(c);
    BOOST_TEST_REQUIRE(settled(capper, [&] { return capper.watched() == 1u; }));
    for (unsigned cuts = 1; cuts <= 3; ++cuts) {
        append(c.log_path, 1200 * 1024);
        BOOST_TEST_REQUIRE(settled(capper, [&] { return capper.counters().truncations == cuts; }));
        BOOST_TEST(size_of(c.log_path) == 0u);
    }
    BOOST_TEST(punches.load() == 1);  // refused once: truncated from then on
    BOOST_TEST(capper.counters().cut_fallbacks == 3u);
    std::vector<Record> warnings;
    for (const auto& r : f.records.all())
        if (r.priority == Priority::warning) warnings.push_back(r);
    BOOST_TEST_REQUIRE(warnings.size() == 1u);
    BOOST_TEST(warnings[0].fields["ERRNO"] == std::to_string(EOPNOTSUPP));
    BOOST_TEST(warnings[0].fields["CONTAINER_ID"] == c.id);
    BOOST_TEST_REQUIRE(!f.records.with("ACTION", "truncate").empty());
    BOOST_TEST(f.records.with("CUT_METHOD", "truncate").size() >= 1u);
    BOOST_TEST(f.records.with("CUT_METHOD", "punch_hole").empty());
}

BOOST_AUTO_TEST_CASE(rotated_files_count_and_are_dropped) {
    Fixture f;
    LogCapper capper(f.engine, f.options(logs_config(LogAction::truncate, LogScope::sessions, 1 * MiB)));
    capper.start();
    auto c = f.container("b2", "s1");
    append(c.log_path + ".1", 400 * 1024);
    append(c.log_path + ".2.gz", 400 * 1024);
    capper.add(c);
    BOOST_TEST_REQUIRE(settled(capper, [&] { return capper.watched() == 1u; }));
    BOOST_TEST(size_of(c.log_path + ".1") == 400u * 1024);
    append(c.log_path, 300 * 1024);  // 1.1 MiB in all: over
    BOOST_TEST_REQUIRE(settled(capper, [&] { return !fs::exists(c.log_path + ".1"); }));
    BOOST_TEST(!fs::exists(c.log_path + ".2.gz"));
    BOOST_TEST(allocated_of(c.log_path) < MiB);
    BOOST_TEST_REQUIRE(settled(capper, [&] { return capper.counters().log_bytes_dropped >= 800u * 1024; }));
}

BOOST_AUTO_TEST_CASE(a_rotation_by_rename_is_followed) {
    Fixture f;
    LogCapper capper(f.engine, f.options(logs_config(LogAction::truncate, LogScope::sessions, 1 * MiB)));
    capper.start();
    auto c = f.container("b3", "s1");
    capper.add(c);
    BOOST_TEST_REQUIRE(settled(capper, [&] { return capper.watched() == 1u; }));
    append(c.log_path, 600 * 1024);
    fs::rename(c.log_path, c.log_path + ".1");
    append(c.log_path, 600 * 1024);  // a new live file; 1.2 MiB in all
    BOOST_TEST_REQUIRE(settled(capper, [&] { return !fs::exists(c.log_path + ".1"); }));
    BOOST_TEST(allocated_of(c.log_path) < MiB);
}

BOOST_AUTO_TEST_CASE(the_local_driver_is_capped_in_its_own_directory) {
    Fixture f;
    LogCapper capper(f.engine, f.options(logs_config(LogAction::truncate, LogScope::sessions, 1 * MiB)));
    capper.start();
    auto c = f.container("c3", "s1", "local");
    capper.add(c);  // before the engine made local-logs: picked up by the backstop
    auto dir = f.root / "containers" / c.id / "local-logs";
    BOOST_TEST_REQUIRE(settled(capper, [&] { return capper.watched() == 1u; }));
    fs::create_directories(dir);
    append((dir / "container.log").string(), 100 * 1024);
    f.backstop(capper);
    append((dir / "container.log.1.gz").string(), 600 * 1024);
    append((dir / "container.log").string(), 400 * 1024);
    BOOST_TEST_REQUIRE(settled(capper, [&] { return !fs::exists(dir / "container.log.1.gz"); }));
    BOOST_TEST(allocated_of((dir / "container.log").string()) < MiB);
}

BOOST_AUTO_TEST_CASE(the_data_root_is_learned_from_a_json_file_log_path) {
    Fixture f;
    LogCapper capper(f.engine, f.options(logs_config(LogAction::truncate, LogScope::sessions, 1 * MiB)));
    capper.start();
    auto local = f.container("c4", "s1", "local");
    local.docker_root_dir.clear();
    auto dir = f.root / "containers" / local.id / "local-logs";
    fs::create_directories(dir);
    append((dir / "container.log").string(), 2 * MiB);
    capper.add(local);
    auto json = f.container("c5", "s1");
    json.docker_root_dir.clear();
    capper.add(json);
    BOOST_TEST_REQUIRE(settled(capper, [&] { return allocated_of((dir / "container.log").string()) < MiB; }));
    BOOST_TEST(capper.watched() == 2u);
    BOOST_TEST(f.records.with("ACTION", "none").empty());
}

BOOST_AUTO_TEST_CASE(a_local_log_with_no_known_root_is_reported_after_a_check_interval) {
    Fixture f;
    LogCapper capper(f.engine, f.options(logs_config(LogAction::truncate, LogScope::sessions, 1 * MiB)));
    capper.start();
    auto local = f.container("c6", "s1", "local");
    local.docker_root_dir.clear();
    capper.add(local);
    BOOST_TEST_REQUIRE(settled(capper, [&] { return f.records.with("CONTAINER_ID", local.id).empty(); }));
    f.backstop(capper);
    BOOST_TEST_REQUIRE(f.records.with("CONTAINER_ID", local.id).size() == 1u);
    auto r = f.records.with("CONTAINER_ID", local.id).front();
    BOOST_TEST(r.fields["LOG_DRIVER"] == "local");
    BOOST_TEST(r.message.find("data root") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(drivers_without_files_are_reported_once) {
    Fixture f;
    LogCapper capper(f.engine, f.options(logs_config(LogAction::truncate, LogScope::sessions, 1 * MiB)));
    capper.start();
    auto c = f.container("d4", "s1", "none");
    capper.add(c);
    capper.add(c);
    auto j = f.container("d5", "s1", "journald");
    capper.add(j);
    BOOST_TEST_REQUIRE(settled(capper, [&] { return f.records.with("ACTION", "none").size() == 2u; }));
    f.backstop(capper, 2);
    auto none = f.records.with("CONTAINER_ID", c.id);
    BOOST_TEST_REQUIRE(none.size() == 1u);
    BOOST_TEST((none[0].priority == Priority::warning));
    BOOST_TEST(none[0].fields["LOG_DRIVER"] == "none");
    BOOST_TEST(none[0].message.find("not capped") != std::string::npos);
    BOOST_TEST(capper.watched() == 0u);
}

BOOST_AUTO_TEST_CASE(a_label_overrides_and_a_broken_label_warns_once) {
    Fixture f;
    LogCapper capper(f.engine, f.options(logs_config(LogAction::truncate, LogScope::sessions, 4 * MiB)));
    capper.start();
    auto small = f.container("e5", "s1");
    small.labels[max_size_label] = "256KiB";
    auto broken = f.container("e6", "s1");
    broken.labels[max_size_label] = "ten megs";
    capper.add(small);
    capper.add(broken);
    capper.add(broken);  // fed again (e.g. at start): still one warning
    BOOST_TEST_REQUIRE(settled(capper, [&] { return capper.watched() == 2u; }));
    append(small.log_path, 300 * 1024);
    append(broken.log_path, 1 * MiB);
    BOOST_TEST_REQUIRE(settled(capper, [&] { return allocated_of(small.log_path) < 256u * 1024; }));
    BOOST_TEST(size_of(broken.log_path) == 1 * MiB);  // the 4 MiB default applies
    append(broken.log_path, 4 * MiB);
    BOOST_TEST_REQUIRE(settled(capper, [&] { return capper.counters().truncations >= 2u; }));
    auto warnings = f.records.with("LABEL_VALUE", "ten megs");
    BOOST_TEST_REQUIRE(warnings.size() == 1u);
    BOOST_TEST((warnings[0].priority == Priority::warning));
    BOOST_TEST(warnings[0].fields["CONTAINER_NAME"] == broken.name);
    BOOST_TEST(warnings[0].message.find(broken.name) != std::string::npos);
    BOOST_TEST(warnings[0].message.find("ten megs") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(stop_acts_through_the_engine_on_owned_containers_only) {
    for (auto action : {LogAction::stop, LogAction::kill, LogAction::remove}) {
        BOOST_TEST_CONTEXT("action " << std::string(reaperd::to_string(action))) {
            Fixture f;
            LogCapper capper(f.engine, f.options(logs_config(action, LogScope::all, 1 * MiB)));
            capper.start();
            auto owned = f.container("f7", "s1");
            auto unowned = f.container("f8", "");
            capper.add(owned);
            capper.add(unowned);
            BOOST_TEST_REQUIRE(settled(capper, [&] { return capper.watched() == 2u; }));
            append(owned.log_path, 2 * MiB);
            append(unowned.log_path, 2 * MiB);
            BOOST_TEST_REQUIRE(settled(capper, [&] { return allocated_of(unowned.log_path) < MiB; }));
            BOOST_TEST_REQUIRE(
                settled(capper, [&] { return !f.records.with("ACTION", std::string(reaperd::to_string(action))).empty(); }));
            auto r = f.records.with("ACTION", std::string(reaperd::to_string(action))).front();
            BOOST_TEST(r.fields["CONTAINER_ID"] == owned.id);
            BOOST_TEST(r.fields["SESSION_ID"] == "s1");
            BOOST_TEST((r.priority == Priority::notice));
            f.backstop(capper, 3);  // no second action
            for (const auto& call : f.engine.calls()) {
                BOOST_TEST(call.id == owned.id, call.op);
                if (call.op != "inspect") BOOST_TEST(call.op == std::string(reaperd::to_string(action)));
            }
            auto calls = f.engine.calls();
            auto acted = std::count_if(calls.begin(), calls.end(),
                                       [&](const auto& call) { return call.op == std::string(reaperd::to_string(action)); });
            BOOST_TEST(acted == 1);
            BOOST_TEST(size_of(owned.log_path) == 2 * MiB);  // stopped, not cut
            auto counters = capper.counters();
            BOOST_TEST(counters.stops + counters.kills + counters.removals == 1u);
        }
    }
}

BOOST_AUTO_TEST_CASE(a_halted_container_is_acted_on_again_only_after_it_starts_again) {
    for (auto action : {LogAction::stop, LogAction::kill, LogAction::remove}) {
        const std::string op(reaperd::to_string(action));
        BOOST_TEST_CONTEXT("action " << op) {
            Fixture f;
            LogCapper capper(f.engine, f.options(logs_config(action, LogScope::sessions, 1 * MiB)));
            capper.start();
            auto owned = f.container("f9", "s1");
            capper.add(owned);
            BOOST_TEST_REQUIRE(settled(capper, [&] { return capper.watched() == 1u; }));
            auto acted = [&] {
                auto calls = f.engine.calls();
                return std::count_if(calls.begin(), calls.end(), [&](const auto& call) { return call.op == op; });
            };
            append(owned.log_path, 2 * MiB);
            BOOST_TEST_REQUIRE(settled(capper, [&] { return acted() == 1; }));
            append(owned.log_path, 1 * MiB);  // the engine flushing what it still held
            BOOST_TEST_REQUIRE(capper.settle());
            f.backstop(capper, 3);
            BOOST_TEST(acted() == 1);
            if (action == LogAction::remove) continue;
            f.engine.start_container(owned.id, owned.log_path);
            capper.add(owned);  // the daemon feeds it again when it starts again
            BOOST_TEST(settled(capper, [&] { return acted() == 2; }));
        }
    }
}

BOOST_AUTO_TEST_CASE(a_failed_stop_is_retried_with_a_warning) {
    Fixture f;
    const reaper::test::Fault boom{reaper::EngineErrorKind::Server, 500, "boom"};
    f.engine.fail("stop", "", {boom, boom});  // the first two attempts
    auto options = f.options(logs_config(LogAction::stop, LogScope::sessions, 1 * MiB));
    options.retry_interval = 10min;  // no retry comes of real time, however slow the machine
    LogCapper capper(f.engine, options);
    capper.start();
    auto c = f.container("a9", "s1");
    capper.add(c);
    BOOST_TEST_REQUIRE(settled(capper, [&] { return capper.watched() == 1u; }));
    append(c.log_path, 2 * MiB);
    BOOST_TEST_REQUIRE(settled(capper, [&] { return capper.counters().action_failures == 1u; }));
    f.skip(capper, options.retry_interval);
    BOOST_TEST_REQUIRE(capper.counters().action_failures == 2u);
    auto warnings = f.records.with("ACTION", "stop");
    BOOST_TEST_REQUIRE(!warnings.empty());
    BOOST_TEST((warnings[0].priority == Priority::warning));
    BOOST_TEST(warnings[0].fields["ERROR"] == "engine error 500: boom");  // the engine's own words
    f.skip(capper, options.retry_interval);
    BOOST_TEST_REQUIRE(capper.counters().stops == 1u);
}

BOOST_AUTO_TEST_CASE(scope_sessions_leaves_unowned_logs_alone) {
    Fixture f;
    LogCapper capper(f.engine, f.options(logs_config(LogAction::truncate, LogScope::sessions, 1 * MiB)));
    capper.start();
    auto c = f.container("b1", "");
    capper.add(c);
    append(c.log_path, 2 * MiB);
    f.backstop(capper);
    BOOST_TEST(size_of(c.log_path) == 2 * MiB);
    BOOST_TEST(capper.watched() == 0u);
    capper.reconfigure(logs_config(LogAction::stop, LogScope::all, 1 * MiB));
    BOOST_TEST_REQUIRE(settled(capper, [&] { return allocated_of(c.log_path) < MiB; }));
    BOOST_TEST(f.engine.calls().empty());
}

BOOST_AUTO_TEST_CASE(dry_run_only_logs) {
    Fixture f;
    auto options = f.options(logs_config(LogAction::remove, LogScope::sessions, 1 * MiB));
    Guard guard(f.engine, {{"reaperd.session"}, true}, f.records.sink());
    LogCapper capper(guard, options);
    capper.start();
    auto c = f.container("b4", "s1");
    capper.add(c);
    BOOST_TEST_REQUIRE(settled(capper, [&] { return capper.watched() == 1u; }));
    append(c.log_path, 2 * MiB);
    BOOST_TEST_REQUIRE(settled(capper, [&] { return !f.records.with("ACTION", "would_remove").empty(); }));
    f.backstop(capper, 2);
    BOOST_TEST(f.records.with("ACTION", "would_remove").size() == 1u);
    BOOST_TEST(size_of(c.log_path) == 2 * MiB);
    BOOST_TEST(f.engine.calls().empty());
}

// Issue 10: the capper used to act on the ownership it cached when the container was added,
// and on the dry run it was started with. Its stop, kill and remove now go through the door,
// which checks the config the last reload installed.
BOOST_AUTO_TEST_CASE(after_a_reload_that_drops_the_label_key_nothing_is_stopped_killed_or_removed) {
    for (auto scope : {LogScope::sessions, LogScope::all}) {
        for (auto action : {LogAction::stop, LogAction::kill, LogAction::remove}) {
            const std::string op(reaperd::to_string(action));
            BOOST_TEST_CONTEXT("action " << op << ", scope " << reaperd::to_string(scope)) {
                Fixture f;
                Guard guard(f.engine, {}, f.records.sink());
                LogCapper capper(guard, f.options(logs_config(action, scope, 1 * MiB)));
                capper.start();
                auto c = f.container("ab", "s1");
                capper.add(c);
                BOOST_TEST_REQUIRE(settled(capper, [&] { return capper.watched() == 1u; }));
                guard.configure({{"org.testcontainers.sessionId"}, false});  // the reload
                append(c.log_path, 2 * MiB);
                BOOST_TEST_REQUIRE(
                    settled(capper, [&] { return f.records.with("REFUSAL", "refused_not_owned").size() == 1u; }));
                if (scope == LogScope::sessions) {
                    BOOST_TEST(settled(capper, [&] { return capper.watched() == 0u; }));  // left alone
                } else {
                    BOOST_TEST(settled(capper, [&] { return allocated_of(c.log_path) < MiB; }));  // only cut
                }
                f.backstop(capper, 2);
                for (const auto& call : f.engine.calls()) BOOST_TEST(call.op == "inspect");
                BOOST_TEST(f.records.with("REFUSAL", "refused_not_owned").size() == 1u);
                BOOST_TEST(f.records.with("ACTION", op).empty());
                auto counters = capper.counters();
                BOOST_TEST(counters.stops + counters.kills + counters.removals == 0u);
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(a_reload_to_dry_run_and_back_reaches_the_capper) {
    Fixture f;
    Guard guard(f.engine, {}, f.records.sink());
    LogCapper capper(guard, f.options(logs_config(LogAction::remove, LogScope::sessions, 1 * MiB)));
    capper.start();
    auto c = f.container("ac", "s1");
    capper.add(c);
    BOOST_TEST_REQUIRE(settled(capper, [&] { return capper.watched() == 1u; }));
    guard.configure({{"reaperd.session"}, true});  // the reload
    append(c.log_path, 2 * MiB);
    BOOST_TEST_REQUIRE(settled(capper, [&] { return f.records.with("ACTION", "would_remove").size() == 1u; }));
    f.backstop(capper, 2);
    BOOST_TEST(f.engine.calls().empty());
    BOOST_TEST(size_of(c.log_path) == 2 * MiB);
    guard.configure({});  // and back: the capper acts at once
    append(c.log_path, 1024);
    BOOST_TEST(settled(capper, [&] { return capper.counters().removals == 1u; }));
    auto calls = f.engine.calls();
    BOOST_TEST(std::count_if(calls.begin(), calls.end(), [](const auto& call) { return call.op == "remove"; }) == 1);
}

BOOST_AUTO_TEST_CASE(repeated_cuts_are_coalesced_into_one_record_per_interval) {
    Fixture f;
    auto options = f.options(logs_config(LogAction::truncate, LogScope::sessions, 256 * 1024));
    options.log_coalesce = 10min;  // the cuts come within it whatever the machine's load
    LogCapper capper(f.engine, options);
    capper.start();
    auto c = f.container("b5", "s1");
    capper.add(c);
    BOOST_TEST_REQUIRE(settled(capper, [&] { return capper.watched() == 1u; }));
    for (int i = 0; i < 5; ++i) {
        append(c.log_path, 300 * 1024);
        BOOST_TEST_REQUIRE(settled(capper, [&] { return allocated_of(c.log_path) < 256u * 1024; }));
    }
    BOOST_TEST(capper.counters().truncations == 5u);
    BOOST_TEST_REQUIRE(f.records.with("ACTION", "truncate").size() == 1u);  // the first, at once
    f.skip(capper, options.log_coalesce);
    auto cuts = f.records.with("ACTION", "truncate");
    BOOST_TEST_REQUIRE(cuts.size() == 2u);
    BOOST_TEST(cuts[0].fields["ACTION_COUNT"] == "1");
    BOOST_TEST(cuts[1].fields["ACTION_COUNT"] == "4");
    capper.stop();
}

// Issue 11: a restarted reaperd waited for the engine's full list (43 s behind a slow proxy
// in the chaos run) before capping anything, and a 2 MiB log reached 19.5 MiB meanwhile.
BOOST_AUTO_TEST_CASE(a_persisted_log_is_capped_before_any_engine_info) {
    Fixture f;
    std::string persisted = (f.root / "logcap.json").string();
    auto options = f.options(logs_config(LogAction::stop, LogScope::sessions, 1 * MiB));
    options.persist_path = persisted;
    options.persist_interval = 10ms;
    auto c = f.container("e1", "s1");
    {
        LogCapper first(f.engine, options);
        first.start();
        first.add(c);
        BOOST_TEST_REQUIRE(settled(first, [&] { return fs::exists(persisted); }));
    }  // as a SIGKILL would leave it: the file, and nothing the engine said since
    LogCapper capper(f.engine, options);
    capper.start();
    BOOST_TEST(capper.watched() == 1u);  // at once, before the thread ran
    BOOST_TEST_REQUIRE(!f.records.with("LOGS", "1").empty());
    // Cut again and again (watched by inotify, not only at the backstop's rounds).
    // One append can be cut twice: a slow build (TSan) sees its first part before the rest.
    for (int round = 0; round < 3; ++round) {
        const auto before = capper.counters().truncations;
        append(c.log_path, 2 * MiB);
        BOOST_TEST_REQUIRE(settled(capper, [&] { return capper.counters().truncations > before; }));
        BOOST_TEST(allocated_of(c.log_path) < MiB);
    }
    // The action is stop, but nothing goes to the engine before it has described the container.
    BOOST_TEST(f.engine.calls().empty());
    BOOST_TEST(capper.counters().stops == 0u);
    auto cut = f.records.with("ACTION", "truncate");
    BOOST_TEST_REQUIRE(!cut.empty());
    BOOST_TEST(cut.front().fields["CONTAINER_NAME"] == c.name);
    BOOST_TEST(cut.front().fields["SESSION_ID"] == "s1");

    // Once the engine has described it, the configured action applies again.
    capper.add(c);
    append(c.log_path, 2 * MiB);
    BOOST_TEST(settled(capper, [&] { return capper.counters().stops == 1u; }));
}

BOOST_AUTO_TEST_CASE(a_persisted_entry_whose_file_is_gone_or_replaced_is_dropped_quietly) {
    Fixture f;
    std::string persisted = (f.root / "logcap.json").string();
    auto options = f.options(logs_config(LogAction::truncate, LogScope::sessions, 1 * MiB));
    options.persist_path = persisted;
    options.persist_interval = 10ms;
    auto gone = f.container("e2", "s1");
    auto replaced = f.container("e3", "s1");
    auto kept = f.container("e4", "s1");
    {
        LogCapper first(f.engine, options);
        first.start();
        first.add(gone);
        first.add(replaced);
        first.add(kept);
        BOOST_TEST_REQUIRE(settled(first, [&] { return first.watched() == 3u; }));
    }
    fs::remove_all(fs::path(gone.log_path).parent_path());
    // Another file at the same path, made while the old one still exists: removing first and
    // then creating can be handed the freed inode number again (CI's filesystem did).
    std::ofstream(replaced.log_path + ".new").flush();
    fs::rename(replaced.log_path + ".new", replaced.log_path);
    auto before = f.records.all().size();
    LogCapper capper(f.engine, options);
    capper.start();
    BOOST_TEST(capper.watched() == 1u);
    // Quietly: only the count of what was loaded.
    auto records = f.records.all();
    BOOST_TEST_REQUIRE(records.size() == before + 1);
    BOOST_TEST(records.back().fields["LOGS"] == "1");

    // A list that names it keeps it (its info comes later); one that does not forgets it,
    // also from the file.
    capper.forget_unlisted({kept.id});
    BOOST_TEST(settled(capper, [&] { return capper.watched() == 1u; }));
    capper.forget_unlisted({});
    BOOST_TEST(settled(capper, [&] { return capper.watched() == 0u; }));
    capper.stop();
    LogCapper third(f.engine, options);
    third.start();
    BOOST_TEST(third.watched() == 0u);
}

BOOST_AUTO_TEST_CASE(a_persisted_file_that_does_not_parse_is_ignored_with_a_warning) {
    Fixture f;
    std::string persisted = (f.root / "logcap.json").string();
    std::ofstream(persisted) << "{\"containers\": [{\"id\": 1";
    auto options = f.options(logs_config(LogAction::truncate, LogScope::sessions, 1 * MiB));
    options.persist_path = persisted;
    LogCapper capper(f.engine, options);
    capper.start();
    BOOST_TEST(capper.watched() == 0u);
    auto records = f.records.all();
    BOOST_TEST_REQUIRE(records.size() == 1u);
    BOOST_TEST((records[0].priority == Priority::warning));
    BOOST_TEST(records[0].message.find(persisted) != std::string::npos);
}

// Issue 11: a log in a directory reaperd cannot see (another mount namespace, a data root it
// cannot reach) was silently not capped.
BOOST_AUTO_TEST_CASE(an_unopenable_log_warns_once_and_counts) {
    Fixture f;
    LogCapper capper(f.engine, f.options(logs_config(LogAction::truncate, LogScope::sessions, 1 * MiB)));
    capper.start();
    BOOST_TEST_REQUIRE(capper.settle());  // the first backstop round, at start, is behind us
    auto c = f.container("e5", "s1");
    c.log_path = (f.root / "elsewhere" / "containers" / c.id / (c.id + "-json.log")).string();
    capper.add(c);
    BOOST_TEST_REQUIRE(capper.settle());
    f.backstop(capper);  // one round could be a container removed before the daemon said so
    BOOST_TEST(capper.counters().log_open_failures == 0u);
    f.backstop(capper);
    BOOST_TEST_REQUIRE(capper.counters().log_open_failures == 1u);
    BOOST_TEST(capper.counters().log_unopenable == 1u);
    f.backstop(capper, 5);
    auto warned = f.records.with("CONTAINER_ID", c.id);
    BOOST_TEST_REQUIRE(warned.size() == 1u);
    BOOST_TEST((warned[0].priority == Priority::warning));
    BOOST_TEST(warned[0].fields["LOG_PATH"] == fs::path(c.log_path).parent_path().string());
    BOOST_TEST(warned[0].fields["ERROR"] == std::system_category().message(ENOENT));
    BOOST_TEST(capper.counters().log_open_failures == 1u);

    // It becomes visible: capped, and the gauge drops.
    fs::create_directories(fs::path(c.log_path).parent_path());
    std::ofstream(c.log_path).flush();
    f.backstop(capper, 2);  // the first round counts what the one before found
    BOOST_TEST(capper.counters().log_unopenable == 0u);
    append(c.log_path, 2 * MiB);
    BOOST_TEST(settled(capper, [&] { return capper.counters().truncations > 0u; }));
    BOOST_TEST(f.records.with("CONTAINER_ID", c.id).size() >= 2u);  // the cut's record
}

// A container whose directory was watched and then went (removed before the daemon said so)
// is not a log reaperd cannot open.
BOOST_AUTO_TEST_CASE(a_removed_container_is_not_reported_as_unopenable) {
    Fixture f;
    LogCapper capper(f.engine, f.options(logs_config(LogAction::truncate, LogScope::sessions, 1 * MiB)));
    capper.start();
    auto c = f.container("e6", "s1");
    capper.add(c);
    BOOST_TEST_REQUIRE(settled(capper, [&] { return capper.watched() == 1u; }));
    fs::remove_all(fs::path(c.log_path).parent_path());
    BOOST_TEST_REQUIRE(capper.settle());
    f.backstop(capper, 5);
    BOOST_TEST(capper.counters().log_open_failures == 0u);
    BOOST_TEST(f.records.with("CONTAINER_ID", c.id).empty());
}

BOOST_AUTO_TEST_SUITE_END()

// ---- the watcher's parts, alone -------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(parts)

// A rotation renames the live file away: the descriptor then points at the rotation, and a cut
// through it would drop the rotation's lines and leave the live file growing.
BOOST_AUTO_TEST_CASE(a_log_file_renamed_away_is_not_at_its_path_and_reopens_by_name) {
    Fixture f;
    auto c = f.container("f1", "s1");
    auto files = locate_log(c.id, c.log_driver, c.log_path, f.root.string());
    BOOST_TEST_REQUIRE(files.has_value());
    LogFile log;
    bool identity_changed = false;
    BOOST_TEST(log.open_if_closed(*files, identity_changed) == 0);
    BOOST_TEST(identity_changed);
    BOOST_TEST(log.is_at_path(*files));
    append(c.log_path, 1000);
    fs::rename(c.log_path, c.log_path + ".1");
    append(c.log_path, 300);
    BOOST_TEST(!log.is_at_path(*files));
    log.close_if_replaced(*files);
    BOOST_TEST(!log.is_open());
    identity_changed = false;
    BOOST_TEST(log.open_if_closed(*files, identity_changed) == 0);
    BOOST_TEST(identity_changed);
    log.measure_live();
    log.measure_rotations(*files, false);
    const auto live = allocated_of(c.log_path), rotated = allocated_of(c.log_path + ".1");
    BOOST_TEST(live > 0u);
    BOOST_TEST(log.live_bytes() == live);
    BOOST_TEST(log.apparent_bytes() == 300u);
    BOOST_TEST(log.rotated_bytes() == rotated);
    auto cut = log.cut(*files, {CutMethod::truncate, 0, false}, system_cut_calls());
    BOOST_TEST(cut.error == 0);
    BOOST_TEST(cut.before_bytes == live + rotated);
    BOOST_TEST(cut.dropped_bytes == live + rotated);
    BOOST_TEST(size_of(c.log_path) == 0u);
    BOOST_TEST(!fs::exists(c.log_path + ".1"));
}

// Issue 21, point 5: rotations count toward the cap and go first, oldest first; the live file
// is cut only when it alone holds more than the cut keeps.
BOOST_AUTO_TEST_CASE(rotations_are_deleted_oldest_first_before_the_live_file_is_cut) {
    Fixture f;
    auto c = f.container("f3", "s1");
    auto files = locate_log(c.id, c.log_driver, c.log_path, f.root.string());
    BOOST_TEST_REQUIRE(files.has_value());
    const std::string live_name = fs::path(c.log_path).filename().string();
    append(c.log_path, 100 * 1024);
    append(c.log_path + ".1", 100 * 1024);
    append(c.log_path + ".2", 300 * 1024);
    append(c.log_path + ".3.gz", 300 * 1024);
    InotifyDispatcher inotify;
    BOOST_TEST_REQUIRE(inotify.watch(files->dir, "c") >= 0);
    auto events = [&] {
        std::vector<std::string> names;
        inotify.drain([&](const DirEvent& e) {
            if (e.kind == DirEvent::Kind::entry) names.emplace_back(e.name);
        });
        return names;
    };
    LogFile log;
    bool identity_changed = false;
    BOOST_TEST_REQUIRE(log.open_if_closed(*files, identity_changed) == 0);
    events();
    // 800 KiB against a keep of 256 KiB: the live file and .1 fit in it; .2 and .3.gz do not.
    auto cut = log.cut(*files, {CutMethod::punch_hole, 256 * 1024, false}, system_cut_calls());
    BOOST_TEST(cut.error == 0);
    BOOST_TEST(!cut.live_method.has_value());  // the live file was not cut
    BOOST_TEST((events() == std::vector<std::string>{live_name + ".3.gz", live_name + ".2"}));
    BOOST_TEST(fs::exists(c.log_path + ".1"));
    BOOST_TEST(size_of(c.log_path) == 100u * 1024);
    BOOST_TEST(cut.kept_bytes == allocated_of(c.log_path) + allocated_of(c.log_path + ".1"));

    // The live file alone over the keep: every rotation goes, then the live file is punched.
    append(c.log_path, 500 * 1024);
    append(c.log_path + ".2", 10);
    events();
    cut = log.cut(*files, {CutMethod::punch_hole, 256 * 1024, false}, system_cut_calls());
    BOOST_TEST(cut.error == 0);
    BOOST_TEST((cut.live_method == std::optional<CutMethod>(CutMethod::punch_hole)));
    BOOST_TEST((events() == std::vector<std::string>{live_name + ".2", live_name + ".1", live_name}));
    BOOST_TEST(size_of(c.log_path) == 600u * 1024);
    BOOST_TEST(allocated_of(c.log_path) >= 256u * 1024);
    BOOST_TEST(allocated_of(c.log_path) < 256u * 1024 + 64 * 1024);
    BOOST_TEST(cut.kept_bytes == allocated_of(c.log_path));
}

// A cut starts where this capper's last punch ended, without asking the file (SEEK_DATA waits
// on the inode behind a busy writer); a file truncated from outside since is punched from its
// start again.
BOOST_AUTO_TEST_CASE(a_cut_starts_where_the_last_punch_ended_unless_the_file_shrank) {
    Fixture f;
    auto c = f.container("f4", "s1");
    auto files = locate_log(c.id, c.log_driver, c.log_path, f.root.string());
    BOOST_TEST_REQUIRE(files.has_value());
    std::vector<std::pair<std::uint64_t, std::uint64_t>> punches;  // offset, length
    CutCalls calls = system_cut_calls();
    const auto punch = calls.punch_hole;
    calls.punch_hole = [&](int fd, std::uint64_t offset, std::uint64_t length) {
        punches.emplace_back(offset, length);
        return punch(fd, offset, length);
    };
    LogFile log;
    bool identity_changed = false;
    BOOST_TEST_REQUIRE(log.open_if_closed(*files, identity_changed) == 0);
    const CutPlan keep_256k{CutMethod::punch_hole, 256 * 1024, false};
    append(c.log_path, 1024 * 1024);
    BOOST_TEST(log.cut(*files, keep_256k, calls).error == 0);
    append(c.log_path, 512 * 1024);
    BOOST_TEST(log.cut(*files, keep_256k, calls).error == 0);
    BOOST_TEST_REQUIRE(punches.size() == 2u);
    BOOST_TEST(punches[0].first == 0u);
    BOOST_TEST(punches[1].first == punches[0].first + punches[0].second);
    BOOST_TEST(punches[1].first + punches[1].second == (1536u - 256) * 1024);
    BOOST_TEST(allocated_of(c.log_path) <= 256u * 1024 + 64 * 1024);

    fs::resize_file(c.log_path, 0);
    append(c.log_path, 768 * 1024);
    BOOST_TEST(log.cut(*files, keep_256k, calls).error == 0);
    BOOST_TEST_REQUIRE(punches.size() == 3u);
    BOOST_TEST(punches[2].first == 0u);
    BOOST_TEST(punches[2].second == 512u * 1024);

    // Truncated again and grown past where the last punch ended before the next cut: the data
    // before that point is found and punched too.
    fs::resize_file(c.log_path, 0);
    append(c.log_path, 1024 * 1024);
    BOOST_TEST(log.cut(*files, keep_256k, calls).error == 0);
    BOOST_TEST_REQUIRE(punches.size() == 4u);
    BOOST_TEST(punches[3].first == 0u);
    BOOST_TEST(allocated_of(c.log_path) <= 256u * 1024 + 64 * 1024);
}

BOOST_AUTO_TEST_CASE(a_directory_removed_under_its_watch_is_reported_gone_once_per_container) {
    Fixture f;
    auto c = f.container("f2", "s1");
    auto dir = fs::path(c.log_path).parent_path().string();
    InotifyDispatcher inotify;
    BOOST_TEST_REQUIRE(inotify.watch(dir, "a") >= 0);
    BOOST_TEST_REQUIRE(inotify.watch(dir, "b") >= 0);  // two containers, one directory
    append(c.log_path, 10);
    std::vector<std::string> seen;
    BOOST_TEST(inotify.drain([&](const DirEvent& e) {
        if (e.kind == DirEvent::Kind::entry && e.name == fs::path(c.log_path).filename().string())
            seen.push_back(std::string(e.id));
    }));
    BOOST_TEST(seen.size() >= 2u);
    fs::remove_all(dir);
    std::vector<std::string> gone;
    inotify.drain([&](const DirEvent& e) {
        if (e.kind == DirEvent::Kind::dir_gone) gone.push_back(std::string(e.id));
    });
    BOOST_TEST((gone == std::vector<std::string>{"a", "b"}));
    BOOST_TEST(!inotify.drain([](const DirEvent&) {}));
}

BOOST_AUTO_TEST_CASE(cuts_inside_the_window_are_summed_into_one_record) {
    Records records;
    CutCoalescer cuts;
    RecordSubject subject{"0123456789abcdef", "c-1", "s1"};
    auto t = logcap::TimePoint{} + 1h;
    BOOST_TEST(cuts.note({3000, 10, 2990, 10, CutMethod::punch_hole, CapReason::own_cap}, t, 1s));  // the first: at once
    cuts.flush(records.sink(), subject, 2048, 0, t);
    BOOST_TEST(!cuts.note({2000, 20, 1980, 20, CutMethod::punch_hole, CapReason::own_cap}, t + 100ms, 1s));
    BOOST_TEST(!cuts.note({2500, 30, 2470, 0, CutMethod::truncate, CapReason::total_budget}, t + 200ms, 1s));
    BOOST_TEST(cuts.pending());
    BOOST_TEST((cuts.due_at(1s) == t + 1s));
    cuts.flush(records.sink(), subject, 2048, 4096, t + 1s);
    BOOST_TEST(!cuts.pending());
    auto all = records.all();
    BOOST_TEST_REQUIRE(all.size() == 2u);
    BOOST_TEST(all[0].fields["ACTION_COUNT"] == "1");
    BOOST_TEST(all[1].fields["ACTION_COUNT"] == "2");
    BOOST_TEST(all[1].fields["LOG_BYTES_DROPPED"] == "4450");
    BOOST_TEST(all[1].fields["LOG_BYTES_BEFORE"] == "2500");  // the last cut's
    BOOST_TEST(all[1].fields["REASON"] == std::string(to_string(CapReason::total_budget)));
    BOOST_TEST(all[1].message.find("container c-1 (0123456789ab)") != std::string::npos);
    BOOST_TEST(all[0].fields["CUT_METHOD"] == "punch_hole");
    BOOST_TEST(all[0].fields["LOG_BYTES_KEPT"] == "10");
    BOOST_TEST(all[0].message.find("--tail") != std::string::npos);  // the first punch says how to read
    BOOST_TEST(all[0].message.find("reaperctl logs ") != std::string::npos);
    BOOST_TEST(all[1].fields["CUT_METHOD"] == "truncate");  // the last cut's
    BOOST_TEST(all[1].fields["LOG_BYTES_KEPT"] == "0");
    BOOST_TEST(cuts.note({100, 0, 100, 0, std::nullopt, CapReason::own_cap}, t + 2s, 1s));  // a window after the last record
}

BOOST_AUTO_TEST_SUITE_END()
