// The whole main loop against the scripted fake engine: faults injected into every call it
// makes, the engine going away, leases, and the ownership rule throughout.
#include "daemon.hpp"
#include "eventually.hpp"
#include "fake_engine.hpp"

#include <reaper/units.hpp>

#include <Poco/JSON/Object.h>
#include <Poco/JSON/Parser.h>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

using namespace reaperd;
namespace test = reaper::test;
using test::FakeEngine;
using test::Fault;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

struct TempDir {
    std::string path;
    TempDir() {
        char pattern[] = "/tmp/reaperd-loop-test.XXXXXX";
        path = ::mkdtemp(pattern);
    }
    ~TempDir() { fs::remove_all(path); }
};

Config fast_config(const std::string& state_dir) {
    Config c;
    c.state.dir = state_dir;
    c.sessions.lease_grace = 100ms;
    c.reaper.retry_initial = 10ms;
    c.reaper.retry_max = 50ms;
    c.reaper.error_after_attempts = 3;
    return c;
}

// The loop's clock: real time, plus what a test skipped. Retries of a fault row still come
// due within milliseconds, while a grace or a "nothing more happens" window is skipped at once
// (advance(), then Daemon::settle()) rather than slept through. The wall clock moves with it,
// and may be stepped on its own, as NTP or `date -s` step a host's.
class SkippingClock {
public:
    TimePoint now() const { return Clock::now() + Clock::duration{skipped_.load()}; }
    TimePoint wall_now() const { return now() + Clock::duration{wall_ahead_.load()}; }
    void skip(Clock::duration by) { skipped_ += by.count(); }
    void step_wall(Clock::duration by) { wall_ahead_ += by.count(); }

private:
    std::atomic<Clock::duration::rep> skipped_{0};
    std::atomic<Clock::duration::rep> wall_ahead_{0};
};

// A daemon turning on its own thread, without signals, control socket or log caps.
struct Running {
    SkippingClock clock;
    Daemon daemon;
    std::thread thread;
    int exit_code = -1;

    Running(Config config, FakeEngine& engine, bool wait_until_ready = true)
        : daemon(std::move(config), engine, [this] {
              DaemonOptions o;
              o.handle_signals = false;
              o.control_server = false;
              o.log_caps = false;
              o.clock = [this] { return clock.now(); };
              o.wall_clock = [this] { return clock.wall_now(); };
              return o;
          }()) {
        thread = std::thread([this] { exit_code = daemon.run(); });
        if (wait_until_ready) BOOST_REQUIRE(wait([&] { return status()->getValue<bool>("ready"); }));
    }
    ~Running() { stop(); }
    int stop() {
        if (thread.joinable()) {
            daemon.request_stop();
            thread.join();
        }
        return exit_code;
    }
    Poco::JSON::Object::Ptr status() {
        Poco::JSON::Parser parser;
        return parser.parse(daemon.status_json()).extract<Poco::JSON::Object::Ptr>();
    }
    std::uint64_t counter(const std::string& name) {
        return status()->getObject("counters")->getValue<std::uint64_t>(name);
    }
    // Lets the loop handle what was posted so far at the current time, then moves its clock
    // forward by `by` and waits until it has turned at that time and every removal that turn
    // started has come back.
    void advance(Clock::duration by) {
        BOOST_REQUIRE(daemon.settle());
        clock.skip(by);
        BOOST_REQUIRE(daemon.settle());
    }
    // Polls state that other threads (the reaper pool, the watcher) change: what is waited
    // for is their work, never a daemon deadline, which advance() skips instead.
    static bool wait(const std::function<bool()>& condition, std::chrono::milliseconds limit = 30s) {
        return reaper::test::eventually(condition, limit);
    }
};

const reaper::Labels doomed{{"reaperd.session", "doomed"}};
const reaper::Labels alive{{"reaperd.session", "alive"}};
const reaper::Labels unlabeled{{"app", "db"}};

bool never_touched(const FakeEngine& engine, const std::vector<std::string>& ids) {
    auto calls = engine.destructive_calls();
    for (const auto& id : ids)
        if (std::find(calls.begin(), calls.end(), id) != calls.end()) return false;
    return true;
}

}  // namespace

// Each row: faults injected into one container's calls; it must be reaped in the end, and
// nothing unlabeled or still leased may ever be touched meanwhile.
BOOST_AUTO_TEST_CASE(reaps_through_every_injected_fault_and_touches_nothing_else) {
    struct Case {
        const char* name;
        std::string op;
        std::vector<Fault> faults;
        unsigned expected_failures;
    } cases[] = {
        {"409 conflict x3", "remove",
         {test::conflict_running(), test::conflict_running(), test::conflict_running()}, 3},
        {"500 x4", "remove",
         {test::server_error(), test::server_error(), test::server_error(), test::server_error()}, 4},
        {"removal in progress x3 (a wait, not a failure)", "remove",
         {test::removal_in_progress(), test::removal_in_progress(), test::removal_in_progress()}, 0},
        // No answer in time: unknown, not failed; the next attempt's fresh inspect finds out.
        {"timeout x2 (unknown, not failures)", "remove", {test::timeout(), test::timeout()}, 0},
        {"unreachable x2", "remove", {test::unreachable(), test::unreachable()}, 2},
        {"inspect 500 then timeout", "inspect", {test::server_error(), test::timeout()}, 1},
    };
    for (const auto& c : cases) {
        BOOST_TEST_CONTEXT(c.name) {
            TempDir dir;
            FakeEngine engine;
            engine.add("victim", doomed);
            engine.add("bystander", unlabeled);
            engine.add("leased", alive);
            Running r(fast_config(dir.path), engine);
            engine.fail(c.op, "victim", c.faults);  // after the watcher's own inspect
            r.daemon.lease_opened("alive", 1);
            r.daemon.lease_opened("doomed", 2);
            r.daemon.end_session("doomed");
            BOOST_CHECK_THROW(r.daemon.orphan_reported("bystander", "doomed"),  // no session label
                              Refused);
            BOOST_TEST(Running::wait([&] { return !engine.exists("victim"); }));
            BOOST_TEST(Running::wait([&] { return r.status()->getValue<int>("pending_reaps") == 0; }));
            BOOST_TEST(r.counter("reaps_failed") == c.expected_failures);
            BOOST_TEST(engine.exists("bystander"));
            BOOST_TEST(engine.exists("leased"));
            BOOST_TEST(never_touched(engine, {"bystander", "leased"}));
            BOOST_TEST(r.stop() == 0);
        }
    }
}

BOOST_AUTO_TEST_CASE(survives_the_engine_going_away_and_reaps_when_it_is_back) {
    TempDir dir;
    FakeEngine engine;
    engine.add("c", doomed);
    Running r(fast_config(dir.path), engine);
    r.daemon.lease_opened("doomed", 1);
    engine.set_down(true);
    BOOST_TEST(Running::wait([&] { return r.status()->getValue<std::string>("engine") == "down"; }));
    r.daemon.lease_closed("doomed", 1);
    BOOST_TEST(Running::wait([&] { return r.counter("reaps_failed") >= 3; }));
    BOOST_TEST(engine.exists("c"));
    engine.set_down(false);
    BOOST_TEST(Running::wait([&] { return !engine.exists("c"); }));
    BOOST_TEST(Running::wait([&] { return r.status()->getValue<std::string>("engine") == "up"; }));
    BOOST_TEST(r.counter("engine_reconnects") == 1u);
    BOOST_TEST(r.counter("reaps_done") == 1u);
}

// Issue 23: an engine whose DELETEs get no answer within the request timeout. The loop
// keeps a single probe in flight, never a pile; the timeouts are unknown, not failures; the
// first answer after them brings forward a retry that had backed off for an hour; "slow"
// shows while it lasts and clears 10 s after.
BOOST_AUTO_TEST_CASE(a_stalled_engine_gets_one_probe_at_a_time_and_its_answer_brings_retries_forward) {
    TempDir dir;
    FakeEngine engine;
    Config config = fast_config(dir.path);
    config.reaper.retry_initial = 1h;
    config.reaper.retry_max = 1h;
    engine.add("sticky", {{"reaperd.session", "early"}});
    for (int i = 0; i < 30; ++i) engine.add("c" + std::to_string(i), doomed);
    std::atomic<bool> stalled{false};
    std::atomic<int> hanging{0}, most_hanging_after_first{0}, timeouts{0};
    engine.before_every("remove", [&] {
        if (!stalled) return;
        const int now_hanging = ++hanging;
        if (timeouts > 0)  // the first wave went out before any timeout: what comes after it
            most_hanging_after_first = std::max(most_hanging_after_first.load(), now_hanging);
        std::this_thread::sleep_for(5ms);  // real time: the hung DELETE overlaps any other in flight
        --hanging;
        ++timeouts;
        throw reaper::Timeout(0, "", "DELETE /containers/x: no answer from the engine within the timeout");
    });
    Running r(config, engine);
    engine.fail("remove", "sticky", {test::server_error()});
    r.daemon.end_session("early");
    BOOST_TEST(Running::wait([&] { return r.counter("reaps_failed") == 1u; }));  // now due in an hour
    stalled = true;
    r.daemon.end_session("doomed");
    BOOST_TEST(Running::wait([&] { return timeouts >= 60; }));
    auto pace = r.status()->getObject("engine_pace");
    BOOST_TEST(r.status()->getValue<std::string>("engine") == "slow");
    BOOST_TEST(pace->getValue<unsigned>("limit") == 1u);
    BOOST_TEST(pace->getValue<unsigned>("in_flight") <= 1u);
    BOOST_TEST(pace->getValue<unsigned>("timeouts_total") >= 60u);
    BOOST_TEST(!pace->isNull("slow_since"));
    // Those of the first wave that hung together were sent before any timeout was known.
    BOOST_TEST(most_hanging_after_first <= Config{}.reaper.concurrency);
    BOOST_TEST(r.counter("reaps_failed") == 1u);  // sticky's 500 only: timeouts are unknown
    BOOST_TEST(r.status()->getObject("counters")->getObject("guard")->getValue<unsigned>("unanswered") >= 60u);
    const int probes_before = timeouts;
    BOOST_TEST(Running::wait([&] { return timeouts >= probes_before + 5; }));
    BOOST_TEST(hanging <= 1);

    const int lists_before = engine.calls("list");
    stalled = false;
    BOOST_TEST(Running::wait([&] { return r.counter("reaps_done") == 31u; }));  // sticky too, not in an hour
    // The engine answered again: relisted now, not at the next resync (60 s of loop time).
    BOOST_TEST(Running::wait([&] { return engine.calls("list") > lists_before; }));
    BOOST_TEST(!engine.exists("sticky"));
    BOOST_TEST(r.status()->getValue<std::string>("engine") == "slow");  // the last timeout is recent
    r.advance(11s);
    BOOST_TEST(r.status()->getValue<std::string>("engine") == "up");
    BOOST_TEST(r.status()->getObject("engine_pace")->isNull("slow_since"));
    BOOST_TEST(r.status()->getObject("engine_pace")->getValue<unsigned>("timeouts") == 0u);
}

BOOST_AUTO_TEST_CASE(an_unsupported_engine_is_its_own_state_and_blocks_readiness_until_it_changes) {
    TempDir dir;
    FakeEngine engine;
    const Fault refused{reaper::EngineErrorKind::Unsupported, 200, ""};
    engine.fail("events", "", std::vector<Fault>(40, refused));
    Running r(fast_config(dir.path), engine, false);
    BOOST_TEST(Running::wait([&] { return r.status()->getValue<std::string>("engine") == "unsupported"; }));
    BOOST_TEST(!r.status()->getValue<bool>("ready"));
    BOOST_TEST(r.status()->getValue<std::string>("engine_error").find("injected") != std::string::npos);
    BOOST_TEST(Running::wait([&] { return r.status()->getValue<std::string>("engine") == "up"; }));
    BOOST_TEST(r.status()->getValue<bool>("ready"));
    BOOST_TEST(!r.status()->has("engine_error"));
}

BOOST_AUTO_TEST_CASE(a_broken_event_stream_is_reconciled_by_a_relist) {
    TempDir dir;
    FakeEngine engine;
    Running r(fast_config(dir.path), engine);
    r.daemon.end_session("doomed");
    engine.break_streams();
    engine.add_silently("missed", doomed);  // no event: only the re-list can find it
    BOOST_TEST(Running::wait([&] { return !engine.exists("missed"); }));
}

BOOST_AUTO_TEST_CASE(leases_keep_a_session_and_the_grace_ends_it) {
    TempDir dir;
    FakeEngine engine;
    engine.add("a", alive);
    Running r(fast_config(dir.path), engine);
    r.daemon.lease_opened("alive", 1);
    r.daemon.lease_opened("alive", 2);
    r.daemon.lease_closed("alive", 1);
    r.advance(400ms);  // 4x lease_grace, with one lease still open
    BOOST_TEST(engine.exists("a"));
    BOOST_TEST(r.status()->getValue<int>("pending_reaps") == 0);
    BOOST_TEST(r.status()->getArray("sessions")->getObject(0)->getValue<std::string>("state") == "leased");
    r.daemon.lease_closed("alive", 2);
    r.advance(100ms);  // lease_grace
    BOOST_TEST(Running::wait([&] { return !engine.exists("a"); }));
    auto sessions = r.status()->getArray("sessions");
    BOOST_REQUIRE(sessions->size() == 1u);
    BOOST_TEST(sessions->getObject(0)->getValue<std::string>("state") == "ended");
    BOOST_TEST(sessions->getObject(0)->getValue<std::string>("end_reason") == "lease_expired");
    // Its deadline, as decide() sees it (policy.hpp deadline_of): ended now, forgotten a
    // tombstone_ttl later.
    const auto ttl_ms = fast_config(dir.path).sessions.tombstone_ttl.count();
    const auto deadline_in_ms = sessions->getObject(0)->getValue<std::int64_t>("deadline_in_ms");
    BOOST_TEST(deadline_in_ms <= ttl_ms);
    BOOST_TEST(deadline_in_ms > ttl_ms - 10000);
    std::string metrics = r.daemon.metrics_text();
    BOOST_TEST(metrics.find("reaperd_reaps_done_total 1\n") != std::string::npos);
    BOOST_TEST(metrics.find("reaperd_sessions{state=\"ended\"} 1\n") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(pending_reaps_and_tombstones_survive_a_restart) {
    TempDir dir;
    {
        FakeEngine engine;
        engine.add("c", doomed);
        Running r(fast_config(dir.path), engine);
        engine.set_down(true);
        r.daemon.end_session("doomed");
        BOOST_TEST(Running::wait([&] { return r.status()->getValue<int>("pending_reaps") == 1; }));
        BOOST_TEST(r.stop() == 0);
        BOOST_TEST(engine.exists("c"));
    }
    FakeEngine engine;
    engine.add("c", doomed);
    engine.set_down(true);
    Daemon daemon(fast_config(dir.path), engine, [] {
        DaemonOptions o;
        o.handle_signals = false;
        o.control_server = false;
        o.log_caps = false;
        return o;
    }());
    std::thread t([&] { daemon.run(); });
    Poco::JSON::Parser parser;
    auto status = parser.parse(daemon.status_json()).extract<Poco::JSON::Object::Ptr>();
    BOOST_TEST(status->getValue<int>("pending_reaps") == 1);
    engine.set_down(false);
    BOOST_TEST(Running::wait([&] { return !engine.exists("c"); }));
    engine.add("late", doomed);  // the tombstone was kept
    BOOST_TEST(Running::wait([&] { return !engine.exists("late"); }));
    daemon.request_stop();
    t.join();
}

// In-memory deadlines are on the loop's steady clock: a day's step of the wall clock ends no
// lease grace (on the wall clock it would have ended at once), and status shows the grace's
// end in the wall clock's new time. The grace ends when the loop's clock says so.
BOOST_AUTO_TEST_CASE(a_step_of_the_wall_clock_moves_no_deadline) {
    TempDir dir;
    Config config = fast_config(dir.path);
    config.sessions.lease_grace = 10min;
    FakeEngine engine;
    engine.add("a", alive);
    auto grace_end = [](Running& r) {
        auto session = r.status()->getArray("sessions")->getObject(0);
        BOOST_REQUIRE(session->getValue<std::string>("state") == "grace");
        return *reaper::parse_rfc3339(session->getValue<std::string>("deadline"));
    };
    Running r(config, engine);
    r.daemon.lease_opened("alive", 1);
    r.daemon.lease_closed("alive", 1);
    BOOST_REQUIRE(r.daemon.settle());
    const auto before = grace_end(r);
    const auto left = before - Clock::now();
    BOOST_TEST((left > 9min && left <= 10min));
    r.clock.step_wall(24h);
    r.advance(1min);
    BOOST_TEST(engine.exists("a"));
    BOOST_TEST((grace_end(r) - before == 24h));
    r.advance(8min);
    BOOST_TEST(engine.exists("a"));
    r.advance(1min + 100ms);
    BOOST_TEST(Running::wait([&] { return !engine.exists("a"); }));
}

BOOST_AUTO_TEST_CASE(dry_run_removes_nothing) {
    TempDir dir;
    FakeEngine engine;
    engine.add("c", doomed);
    Config config = fast_config(dir.path);
    config.reaper.dry_run = true;
    Running r(config, engine);
    r.daemon.end_session("doomed");
    r.daemon.orphan_reported("c", "doomed");
    BOOST_TEST(Running::wait([&] {
        auto actions = r.status()->getObject("counters")->getObject("actions");
        return actions->has("would_reap") && actions->getValue<int>("would_reap") == 2;
    }));
    r.advance(200ms);  // past every retry delay: nothing more is due
    BOOST_TEST(engine.exists("c"));
    BOOST_TEST(engine.destructive_calls().empty());
}

// Issue 10, point 3: an orphan reported by name is pinned to the container's full id when it
// is received; once that container is gone, a new container that took the name (of another,
// leased session) is never touched by the retries.
BOOST_AUTO_TEST_CASE(an_orphan_reported_by_name_is_retried_by_its_full_id_only) {
    TempDir dir;
    FakeEngine engine;
    const std::string first(64, 'a'), second(64, 'b');
    engine.add(first, {{"reaperd.session", "A"}});
    engine.rename(first, "web");
    engine.fail("remove", first, std::vector<Fault>(1000, test::server_error()));
    Running r(fast_config(dir.path), engine);
    r.daemon.orphan_reported("web", "A");
    auto pending = r.status()->getArray("pending");
    BOOST_REQUIRE(pending->size() == 1u);
    BOOST_TEST(pending->getObject(0)->getValue<std::string>("container") == first);
    BOOST_TEST(pending->getObject(0)->getValue<std::string>("name") == "web");
    BOOST_TEST(Running::wait([&] { return r.counter("reaps_failed") >= 2; }));
    // Removed by hand (with no event: only the retries can find out), and the name reused by
    // a container of a leased session.
    r.daemon.lease_opened("B", 1);
    engine.drop_silently(first);
    engine.add_silently(second, {{"reaperd.session", "B"}});
    engine.rename(second, "web");
    BOOST_TEST(Running::wait([&] { return r.status()->getValue<int>("pending_reaps") == 0; }));
    r.advance(200ms);  // past every retry delay: a retry by name would have come
    BOOST_TEST(engine.exists(second));
    BOOST_TEST(never_touched(engine, {second}));
}

BOOST_AUTO_TEST_CASE(an_orphan_report_that_names_no_owned_container_of_its_session_is_refused) {
    TempDir dir;
    FakeEngine engine;
    engine.add("aaa1", {{"reaperd.session", "A"}});
    engine.rename("aaa1", "web");
    engine.add("aaa2", {{"reaperd.session", "A"}});
    engine.add("plain", unlabeled);
    Running r(fast_config(dir.path), engine);
    auto refusal = [&](const std::string& container, const std::string& session) {
        try {
            r.daemon.orphan_reported(container, session);
        } catch (const Refused& e) {
            return std::string(e.what());
        }
        return std::string("(accepted)");
    };
    auto wrong_session = refusal("web", "B");
    BOOST_TEST(wrong_session.find("session A, not B") != std::string::npos, wrong_session);
    BOOST_TEST(wrong_session.find("aaa1") != std::string::npos, wrong_session);
    BOOST_TEST(refusal("db", "") == "no container matches \"db\"; not reaped");
    auto ambiguous = refusal("aaa", "A");
    BOOST_TEST(ambiguous.find("multiple IDs found") != std::string::npos, ambiguous);
    BOOST_TEST(refusal("plain", "").find("carries no session label") != std::string::npos);
    r.advance(100ms);
    BOOST_TEST(r.status()->getValue<int>("pending_reaps") == 0);
    BOOST_TEST(engine.destructive_calls().empty());
    // A unique prefix is pinned to its full id.
    r.daemon.orphan_reported("aaa2", "");
    BOOST_TEST(Running::wait([&] { return !engine.exists("aaa2"); }));
    BOOST_TEST(engine.exists("aaa1"));
}

// A full id reported while the engine is away is queued unverified (nothing else can take a
// full id); the door checks it when the engine is back, and leaves an unowned one alone.
BOOST_AUTO_TEST_CASE(a_full_id_reported_while_the_engine_is_away_is_checked_by_the_door) {
    TempDir dir;
    FakeEngine engine;
    const std::string theirs(64, 'c');
    engine.add(theirs, unlabeled);
    Running r(fast_config(dir.path), engine);
    engine.set_down(true);
    BOOST_CHECK_THROW(r.daemon.orphan_reported("cccc", ""), Refused);  // a prefix cannot wait
    r.daemon.orphan_reported(theirs, "");
    BOOST_TEST(r.status()->getValue<int>("pending_reaps") == 1);
    engine.set_down(false);
    BOOST_TEST(Running::wait([&] { return r.status()->getValue<int>("pending_reaps") == 0; }));
    BOOST_TEST(engine.exists(theirs));
    BOOST_TEST(engine.destructive_calls().empty());
    BOOST_TEST(r.status()->getObject("counters")->getObject("guard")->getValue<int>("refused_not_owned") == 1);
}

// A session leased again while a reap of its end is still being retried is alive: the door
// refuses, and its containers are reaped when it ends again.
BOOST_AUTO_TEST_CASE(a_reap_for_a_session_alive_again_waits_for_its_next_end) {
    TempDir dir;
    FakeEngine engine;
    engine.add("c", doomed);
    engine.fail("remove", "c", std::vector<Fault>(1000, test::server_error()));
    Running r(fast_config(dir.path), engine);
    r.daemon.end_session("doomed");
    BOOST_TEST(Running::wait([&] { return r.counter("reaps_failed") >= 1; }));
    r.daemon.lease_opened("doomed", 7);
    // The faults stay until the door has refused an attempt made after the lease: one made
    // before it (for a session still ended) may be in flight meanwhile, and must fail.
    BOOST_TEST(Running::wait([&] {
        return r.status()->getObject("counters")->getObject("guard")->optValue<int>("refused_session_alive", 0) >= 1;
    }));
    engine.clear_faults();
    BOOST_TEST(Running::wait([&] { return r.status()->getValue<int>("pending_reaps") == 0; }));
    BOOST_TEST(engine.exists("c"));
    BOOST_TEST(r.status()->getObject("counters")->getObject("guard")->getValue<int>("refused_session_alive") >= 1);
    r.daemon.lease_closed("doomed", 7);
    r.advance(100ms);  // lease_grace: it ends again
    BOOST_TEST(Running::wait([&] { return !engine.exists("c"); }));
}

// A lease taken and dropped at once, then an explicit end: the door's count of leases opened
// and the loop's agree (the tombstone keeps the loop's), so the reap is not refused as "came
// alive" (a helper's first burst test saw it refused forever while the tombstone lost it).
BOOST_AUTO_TEST_CASE(a_lease_dropped_then_an_end_reaps_without_a_refusal) {
    TempDir dir;
    FakeEngine engine;
    engine.add("c", doomed);
    Running r(fast_config(dir.path), engine);
    r.daemon.lease_opened("doomed", 1);
    r.daemon.lease_closed("doomed", 1);
    r.daemon.end_session("doomed");
    BOOST_TEST(Running::wait([&] { return !engine.exists("c"); }));
    BOOST_TEST(r.status()->getObject("counters")->getObject("guard")->optValue<int>("refused_session_alive", 0) == 0);
}

// The loop's own metrics: sessions ended by reason, each reap's latency from its end, the
// engine's last sync, and state saves that fail (the state dir replaced by a file).
BOOST_AUTO_TEST_CASE(metrics_count_ends_by_reason_reap_latency_syncs_and_failed_saves) {
    TempDir dir;
    FakeEngine engine;
    engine.add("c", doomed);
    engine.add("a", alive);
    const auto before = Clock::now();
    Running r(fast_config(dir.path), engine);
    const auto value = [&](const std::string& line_start) -> std::string {
        const std::string text = r.daemon.metrics_text();
        const auto at = text.find("\n" + line_start + " ");
        if (at == std::string::npos) return "";
        const auto start = at + line_start.size() + 2;
        return text.substr(start, text.find('\n', start) - start);
    };
    const double synced = std::stod(value("reaperd_engine_last_sync_timestamp_seconds"));
    BOOST_TEST(synced >= std::chrono::duration<double>(before.time_since_epoch()).count() - 0.001);
    BOOST_TEST(value("reaperd_state_save_failures_total") == "0");

    fs::remove_all(dir.path);
    std::ofstream(dir.path) << "not a directory\n";
    r.daemon.end_session("doomed");
    BOOST_TEST(Running::wait([&] { return !engine.exists("c"); }));
    r.daemon.lease_opened("alive", 1);
    r.daemon.lease_closed("alive", 1);
    r.advance(100ms);  // lease_grace
    BOOST_TEST(Running::wait([&] { return !engine.exists("a"); }));
    BOOST_TEST(Running::wait([&] { return value("reaperd_reaps_total") == "2"; }));
    BOOST_TEST(value("reaperd_reap_latency_seconds_count") == "2");
    BOOST_TEST(value("reaperd_reap_latency_seconds_bucket{le=\"+Inf\"}") == "2");
    BOOST_TEST(value("reaperd_reap_latency_seconds_bucket{le=\"5\"}") == "2");  // fake: at once
    BOOST_TEST(value("reaperd_sessions_ended_total{reason=\"end\"}") == "1");
    BOOST_TEST(value("reaperd_sessions_ended_total{reason=\"lease_expired\"}") == "1");
    BOOST_TEST(std::stoul(value("reaperd_state_save_failures_total")) >= 1u);
    fs::remove(dir.path);
    fs::create_directory(dir.path);  // the stop's save succeeds again
}

// ---- networks and volumes -------------------------------------------------------------------

namespace {
int status_int(Running& r, const std::string& key) { return r.status()->getValue<int>(key); }
}  // namespace

// An ended session's networks and volume go once its containers are gone, through faults
// (attached, in use, 500); an unlabeled network and volume and a leased session's network are
// never touched. Counted in status.
BOOST_AUTO_TEST_CASE(an_ended_sessions_networks_and_volumes_go_after_its_containers) {
    TempDir dir;
    FakeEngine engine;
    const std::string attached(64, 'a'), loose(64, 'b'), plain(64, 'c'), theirs(64, 'd');
    engine.add("c1", doomed);
    engine.add("c2", doomed);
    engine.add_network(attached, doomed, {"c1"});
    engine.add_network(loose, doomed);
    engine.add_volume("data", doomed, /*in_use=*/true);
    engine.add_network(plain, unlabeled);
    engine.add_volume("plain", {});
    engine.add_network(theirs, alive);
    engine.fail("remove_network", loose, {test::server_error(), test::server_error()});
    Running r(fast_config(dir.path), engine);
    BOOST_TEST(Running::wait([&] { return status_int(r, "tracked_networks") == 3; }));
    BOOST_TEST(status_int(r, "tracked_volumes") == 1);
    r.daemon.lease_opened("alive", 1);
    r.daemon.end_session("doomed");
    BOOST_TEST(Running::wait([&] { return !engine.exists("c1") && !engine.exists("c2"); }));
    // The container is gone, but the engine still says the network is attached (a container
    // of nobody's joined it), and the volume is in use: failures, retried.
    BOOST_TEST(Running::wait([&] { return r.counter("reaps_failed") >= 3; }));
    BOOST_TEST(engine.has_network(attached));
    BOOST_TEST(status_int(r, "pending_network_reaps") >= 1);
    engine.detach_all(attached);
    engine.set_volume_in_use("data", false);
    BOOST_TEST(Running::wait([&] {
        return !engine.has_network(attached) && !engine.has_network(loose) && !engine.has_volume("data");
    }));
    BOOST_TEST(Running::wait([&] {
        return status_int(r, "pending_network_reaps") == 0 && status_int(r, "pending_volume_reaps") == 0;
    }));
    BOOST_TEST(r.counter("networks_reaped") == 2u);
    BOOST_TEST(r.counter("volumes_reaped") == 1u);
    BOOST_TEST(engine.has_network(plain));
    BOOST_TEST(engine.has_volume("plain"));
    BOOST_TEST(engine.has_network(theirs));
    BOOST_TEST(never_touched(engine, {plain, "plain", theirs}));
    BOOST_TEST(r.daemon.metrics_text().find("reaperd_networks_reaped_total 2\n") != std::string::npos);
    BOOST_TEST(r.stop() == 0);
}

// Every removal's order: no network or volume call while a container of the session exists.
BOOST_AUTO_TEST_CASE(no_network_or_volume_call_while_a_container_of_the_session_remains) {
    TempDir dir;
    FakeEngine engine;
    const std::string net(64, 'e');
    engine.add("c", doomed);
    engine.add_network(net, doomed);
    engine.add_volume("data", doomed);
    engine.fail("remove", "c", std::vector<Fault>(1000, test::server_error()));
    Running r(fast_config(dir.path), engine);
    r.daemon.end_session("doomed");
    BOOST_TEST(Running::wait([&] { return r.counter("reaps_failed") >= 3; }));
    BOOST_TEST(engine.calls("inspect_network") == 0);
    BOOST_TEST(engine.calls("inspect_volume") == 0);
    BOOST_TEST(never_touched(engine, {net, "data"}));
    engine.clear_faults();
    BOOST_TEST(Running::wait([&] { return !engine.has_network(net) && !engine.has_volume("data"); }));
    BOOST_TEST(!engine.exists("c"));
}

// A session that only made a volume; its lease drops and lease_grace passes. Dry run first:
// said once, nothing done.
BOOST_AUTO_TEST_CASE(a_lease_dropped_takes_a_volume_only_session_and_dry_run_only_says_so) {
    TempDir dir;
    FakeEngine engine;
    engine.add_volume("only", doomed);
    Config config = fast_config(dir.path);
    config.reaper.dry_run = true;
    {
        Running r(config, engine);
        r.daemon.lease_opened("doomed", 1);
        r.daemon.lease_closed("doomed", 1);
        r.advance(100ms);  // lease_grace
        BOOST_TEST(Running::wait([&] {
            auto actions = r.status()->getObject("counters")->getObject("actions");
            return actions->has("would_reap") && actions->getValue<int>("would_reap") == 1;
        }));
        r.advance(200ms);  // twice lease_grace and past every retry delay
        auto actions = r.status()->getObject("counters")->getObject("actions");
        BOOST_TEST(actions->getValue<int>("would_reap") == 1);  // once
        BOOST_TEST(engine.has_volume("only"));
        BOOST_TEST(engine.destructive_calls().empty());
    }
    // Restarted without dry run (a new client: the old one closed with its daemon): the
    // tombstone was saved, and the list finds the volume again.
    FakeEngine again;
    again.add_volume("only", doomed);
    Running r(fast_config(dir.path), again);
    BOOST_TEST(Running::wait([&] { return !again.has_volume("only"); }));
    // Counted when the removal's answer reaches the loop, a moment after the engine acted.
    BOOST_TEST(Running::wait([&] { return r.counter("volumes_reaped") == 1u; }));
}

// A volume name reused by a live session's volume (behind reaperd's back, no events) after the
// list: the door refuses, and it is not queued again and again.
BOOST_AUTO_TEST_CASE(a_volume_name_taken_by_a_live_session_is_refused_once_and_left_alone) {
    TempDir dir;
    FakeEngine engine;
    engine.add_volume("data", doomed);
    engine.fail("inspect_volume", "data", std::vector<Fault>(1000, test::server_error()));
    Running r(fast_config(dir.path), engine);
    r.daemon.lease_opened("alive", 1);
    r.daemon.end_session("doomed");
    BOOST_TEST(Running::wait([&] { return r.counter("reaps_failed") >= 1; }));
    engine.replace_volume_silently("data", alive);
    engine.clear_faults();
    BOOST_TEST(Running::wait([&] {
        return r.status()->getObject("counters")->getObject("guard")->has("refused_other_session");
    }));
    r.advance(300ms);  // past every retry delay: a second attempt would have come
    BOOST_TEST(r.status()->getObject("counters")->getObject("guard")->getValue<int>("refused_other_session") == 1);
    BOOST_TEST(status_int(r, "pending_volume_reaps") == 0);
    BOOST_TEST(engine.has_volume("data"));
    BOOST_TEST(engine.destructive_calls().empty());
}

// Pending work is bounded in a plain status (a wedged engine can queue tens of thousands of
// reaps): the count in full, the oldest status_default_pending_listed listed; "pending":true
// lists them all (or `limit`), and no session.
BOOST_AUTO_TEST_CASE(status_lists_the_oldest_pending_reaps_and_all_of_them_on_request) {
    TempDir dir;
    FakeEngine engine;
    for (int i = 0; i < 25; ++i) engine.add("c" + std::string(i < 10 ? "0" : "") + std::to_string(i), doomed);
    Running r(fast_config(dir.path), engine);
    r.daemon.lease_opened("doomed", 1);
    r.daemon.lease_opened("alive", 2);
    engine.set_down(true);  // every reap fails, and stays pending
    r.daemon.end_session("doomed");
    BOOST_REQUIRE(Running::wait([&] { return r.status()->getValue<std::uint64_t>("pending_reaps") == 25; }));
    Poco::JSON::Parser parser;
    const auto ask = [&](reaper::control::StatusQuery query) {
        return parser.parse(r.daemon.status_json(query)).extract<Poco::JSON::Object::Ptr>();
    };
    const auto containers = [](const Poco::JSON::Object::Ptr& status) {
        std::vector<std::string> out;
        const auto pending = status->getArray("pending");
        for (std::size_t i = 0; i < pending->size(); ++i)
            out.push_back(pending->getObject(static_cast<unsigned>(i))->getValue<std::string>("container"));
        return out;
    };
    const auto plain = ask({});
    BOOST_TEST(plain->getValue<std::uint64_t>("pending_reaps") == 25u);
    BOOST_TEST(plain->getValue<std::uint64_t>("pending_listed") == reaper::control::status_default_pending_listed);
    const auto listed = containers(plain);
    BOOST_REQUIRE(listed.size() == reaper::control::status_default_pending_listed);
    BOOST_TEST(listed.front() == "c00");  // queued in one turn: oldest first, then by id
    BOOST_TEST(listed.back() == "c19");
    BOOST_TEST(plain->getValue<std::uint64_t>("pending_objects_listed") == 0u);
    BOOST_TEST(plain->getArray("sessions")->size() >= 1u);

    const auto all = ask({false, std::nullopt, true});
    BOOST_TEST(containers(all).size() == 25u);
    BOOST_TEST(all->getValue<std::uint64_t>("pending_listed") == 25u);
    BOOST_TEST(all->getArray("sessions")->size() == 0u);
    BOOST_TEST(all->getValue<std::uint64_t>("ended_listed") == 0u);
    BOOST_TEST(all->getValue<std::uint64_t>("ended_sessions") == 1u);
    BOOST_TEST((containers(ask({false, 3, true})) == std::vector<std::string>{"c00", "c01", "c02"}),
               boost::test_tools::per_element());
    engine.set_down(false);
}
