// The whole main loop against the scripted fake engine: faults injected into every call it
// makes, the engine going away, leases, and the ownership rule throughout.
#include "daemon.hpp"
#include "fake_engine.hpp"

#include <Poco/JSON/Object.h>
#include <Poco/JSON/Parser.h>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <thread>

using namespace reaperd;
using reaperd::test::FakeEngine;
using reaperd::test::Fault;
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

// A daemon turning on its own thread, without signals, control socket or log caps.
struct Running {
    Daemon daemon;
    std::thread thread;
    int exit_code = -1;

    Running(Config config, FakeEngine& engine, bool wait_until_ready = true)
        : daemon(std::move(config), engine, [] {
              DaemonOptions o;
              o.handle_signals = false;
              o.control_server = false;
              o.log_caps = false;
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
    static bool wait(const std::function<bool()>& condition, std::chrono::milliseconds limit = 30s) {
        auto deadline = std::chrono::steady_clock::now() + limit;
        while (!condition()) {
            if (std::chrono::steady_clock::now() > deadline) return false;
            std::this_thread::sleep_for(5ms);
        }
        return true;
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
        {"timeout x2", "remove", {test::timeout(), test::timeout()}, 2},
        {"unreachable x2", "remove", {test::unreachable(), test::unreachable()}, 2},
        {"inspect 500 then timeout", "inspect", {test::server_error(), test::timeout()}, 2},
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

BOOST_AUTO_TEST_CASE(an_unsupported_engine_is_its_own_state_and_blocks_readiness_until_it_changes) {
    TempDir dir;
    FakeEngine engine;
    const reaperd::test::Fault refused{reaper::EngineErrorKind::Unsupported, 200, ""};
    engine.fail("events", "", std::vector<reaperd::test::Fault>(40, refused));
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
    std::this_thread::sleep_for(400ms);  // 4x lease_grace, with one lease still open
    BOOST_TEST(engine.exists("a"));
    r.daemon.lease_closed("alive", 2);
    BOOST_TEST(Running::wait([&] { return !engine.exists("a"); }));
    auto sessions = r.status()->getArray("sessions");
    BOOST_REQUIRE(sessions->size() == 1u);
    BOOST_TEST(sessions->getObject(0)->getValue<std::string>("state") == "ended");
    BOOST_TEST(sessions->getObject(0)->getValue<std::string>("end_reason") == "lease_expired");
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
    std::this_thread::sleep_for(200ms);
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
    std::this_thread::sleep_for(200ms);
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
    std::this_thread::sleep_for(100ms);
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
    engine.clear_faults();
    BOOST_TEST(Running::wait([&] { return r.status()->getValue<int>("pending_reaps") == 0; }));
    BOOST_TEST(engine.exists("c"));
    BOOST_TEST(r.status()->getObject("counters")->getObject("guard")->getValue<int>("refused_session_alive") >= 1);
    r.daemon.lease_closed("doomed", 7);  // lease_grace 100ms, then it ends again
    BOOST_TEST(Running::wait([&] { return !engine.exists("c"); }));
}
