#include "fake_engine.hpp"
#include "reaper.hpp"

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

using namespace reaperd;
using reaperd::test::FakeEngine;
using reaperd::test::Fault;

namespace {
const std::vector<std::string> keys{"reaperd.session"};
const reaper::Labels owned{{"reaperd.session", "s"}};
}  // namespace

// The fault table: what one attempt makes of each answer the engine can give.
BOOST_AUTO_TEST_CASE(one_attempt_under_each_injected_fault) {
    struct Case {
        const char* name;
        std::string op;  // which call fails ("" = none)
        std::vector<Fault> faults;
        ReapOutcome expected;
        bool removed;
    } cases[] = {
        {"clean", "", {}, ReapOutcome::removed, true},
        {"409 running (force removes it)", "", {}, ReapOutcome::removed, true},
        {"409 removal in progress", "remove", {test::removal_in_progress()}, ReapOutcome::in_progress, false},
        {"409 other conflict", "remove", {test::conflict_running()}, ReapOutcome::failed, false},
        {"500 on remove", "remove", {test::server_error()}, ReapOutcome::failed, false},
        {"500 on inspect", "inspect", {test::server_error()}, ReapOutcome::failed, false},
        {"timeout on remove", "remove", {test::timeout()}, ReapOutcome::failed, false},
        {"unreachable on inspect", "inspect", {test::unreachable()}, ReapOutcome::failed, false},
        {"404 on remove", "remove", {{reaper::EngineErrorKind::NotFound, 404, "No such container"}},
         ReapOutcome::gone, false},
        {"404 on inspect", "inspect", {{reaper::EngineErrorKind::NotFound, 404, "No such container"}},
         ReapOutcome::gone, false},
    };
    for (const auto& c : cases) {
        FakeEngine engine;
        engine.add("c1", owned);
        if (!c.op.empty()) engine.fail(c.op, "c1", c.faults);
        ReapResult r = reap_once(engine, {"c1", keys});
        BOOST_TEST(r.container == "c1");
        BOOST_TEST(to_string(r.outcome) == to_string(c.expected), c.name);
        BOOST_TEST(!engine.exists("c1") == c.removed, c.name);
        if (c.expected == ReapOutcome::failed) BOOST_TEST(!r.error.empty(), c.name);
    }
}

BOOST_AUTO_TEST_CASE(never_removes_a_container_without_an_ownership_label) {
    FakeEngine engine;
    engine.add("mine", {{"reaperd.session", "s"}});
    engine.add("theirs", {{"app", "db"}});
    engine.add("other-key", {{"org.testcontainers.sessionId", "s"}});
    for (const char* id : {"theirs", "other-key"}) {
        ReapResult r = reap_once(engine, {id, keys});
        BOOST_TEST(to_string(r.outcome) == std::string("not_owned"));
        BOOST_TEST(engine.exists(id));
    }
    BOOST_TEST(engine.destructive_calls().empty());
    BOOST_TEST(to_string(reap_once(engine, {"mine", keys}).outcome) == std::string("removed"));
    BOOST_TEST((engine.destructive_calls() == std::vector<std::string>{"mine"}));
}

BOOST_AUTO_TEST_CASE(a_container_already_being_removed_is_waited_for) {
    FakeEngine engine;
    engine.add("c", owned, "removing");
    BOOST_TEST(to_string(reap_once(engine, {"c", keys}).outcome) == std::string("in_progress"));
    BOOST_TEST(engine.destructive_calls().empty());
}

BOOST_AUTO_TEST_CASE(pool_runs_jobs_concurrently_and_reports_each) {
    FakeEngine engine;
    std::mutex mutex;
    std::condition_variable done;
    std::vector<ReapResult> results;
    {
        ReaperPool pool(engine, 4, [&](ReapResult r) {
            std::lock_guard lock(mutex);
            results.push_back(std::move(r));
            done.notify_all();
        });
        for (int i = 0; i < 20; ++i) {
            std::string id = "c" + std::to_string(i);
            engine.add(id, owned);
            if (i % 5 == 0) engine.fail("remove", id, {test::server_error()});
            pool.submit({id, keys});
        }
        pool.submit({"missing", keys});
        std::unique_lock lock(mutex);
        BOOST_TEST(done.wait_for(lock, std::chrono::seconds{30}, [&] { return results.size() == 21; }));
    }
    auto count = [&](ReapOutcome o) {
        return std::count_if(results.begin(), results.end(), [&](auto& r) { return r.outcome == o; });
    };
    BOOST_TEST(count(ReapOutcome::removed) == 16);
    BOOST_TEST(count(ReapOutcome::failed) == 4);
    BOOST_TEST(count(ReapOutcome::gone) == 1);
}

BOOST_AUTO_TEST_CASE(drain_returns_queued_jobs_and_stop_is_idempotent) {
    FakeEngine engine;
    ReaperPool pool(engine, 1, [](ReapResult) {});
    pool.stop();
    pool.submit({"x", keys});
    BOOST_TEST(pool.drain_queue().empty());
    pool.stop();
}
