#include "fake_engine.hpp"
#include "reaper.hpp"

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

using namespace reaperd;
namespace test = reaper::test;
using test::FakeEngine;
using test::Fault;

namespace {
const reaper::Labels owned{{"reaperd.session", "s"}};
LogSink quiet() {
    return [](Priority, std::string_view, std::string_view, std::vector<LogField>) {};
}
ReapJob job(const std::string& container, ReapReason reason,
            const std::string& session = "", bool alive = false) {
    ReapJob j;
    j.container = container;
    j.reason = reason;
    if (!session.empty()) j.expect.session = session;
    j.expect.session_alive = alive;
    return j;
}
}  // namespace

// One attempt is the door's remove: force, volumes, by the job's full id, with what the loop
// knows of the session. (The door's own fault table is in guard_test.)
BOOST_AUTO_TEST_CASE(an_attempt_passes_what_the_loop_knows_to_the_door) {
    FakeEngine engine;
    Guard guard(engine, {}, quiet());
    engine.add("mine", {{"reaperd.session", "s"}});
    engine.add("theirs", {{"app", "db"}});
    engine.add("other", {{"reaperd.session", "t"}});
    engine.add("alive", {{"reaperd.session", "s"}});
    const std::pair<ReapJob, Outcome> rows[] = {
        {job("theirs", ReapReason::orphan), Outcome::refused_not_owned},
        {job("other", ReapReason::orphan, "s"), Outcome::refused_other_session},
        {job("alive", ReapReason::session_ended, "s", true), Outcome::refused_session_alive},
        {job("missing", ReapReason::orphan), Outcome::gone},
        {job("mine", ReapReason::session_ended, "s"), Outcome::acted},
    };
    for (const auto& [j, expected] : rows) {
        ReapResult r = reap_once(guard, j);
        BOOST_TEST(r.container == j.container);
        BOOST_TEST(to_string(r.result.outcome) == to_string(expected), j.container);
    }
    BOOST_TEST((engine.destructive_calls() == std::vector<std::string>{"mine"}));
    BOOST_TEST((engine.removed() == std::vector<std::string>{"mine"}));
}

BOOST_AUTO_TEST_CASE(a_container_already_being_removed_is_waited_for) {
    FakeEngine engine;
    Guard guard(engine, {}, quiet());
    engine.add("c", owned, "removing");
    BOOST_TEST(to_string(reap_once(guard, job("c", ReapReason::orphan)).result.outcome) == std::string("removing"));
    BOOST_TEST(engine.destructive_calls().empty());
}

BOOST_AUTO_TEST_CASE(pool_runs_jobs_concurrently_and_reports_each) {
    FakeEngine engine;
    Guard guard(engine, {}, quiet());
    std::mutex mutex;
    std::condition_variable done;
    std::vector<ReapResult> results;
    {
        ReaperPool pool(guard, 4, [&](ReapResult r) {
            std::lock_guard lock(mutex);
            results.push_back(std::move(r));
            done.notify_all();
        });
        for (int i = 0; i < 20; ++i) {
            std::string id = "c" + std::to_string(i);
            engine.add(id, owned);
            if (i % 5 == 0) engine.fail("remove", id, {test::server_error()});
            pool.submit(job(id, ReapReason::session_ended, "s"));
        }
        pool.submit(job("missing", ReapReason::orphan));
        std::unique_lock lock(mutex);
        BOOST_TEST(done.wait_for(lock, std::chrono::seconds{30}, [&] { return results.size() == 21; }));
    }
    auto count = [&](Outcome o) {
        return std::count_if(results.begin(), results.end(), [&](auto& r) { return r.result.outcome == o; });
    };
    BOOST_TEST(count(Outcome::acted) == 16);
    BOOST_TEST(count(Outcome::failed) == 4);
    BOOST_TEST(count(Outcome::gone) == 1);
}

BOOST_AUTO_TEST_CASE(drain_returns_queued_jobs_and_stop_is_idempotent) {
    FakeEngine engine;
    Guard guard(engine, {}, quiet());
    ReaperPool pool(guard, 1, [](ReapResult) {});
    pool.stop();
    pool.submit(job("x", ReapReason::orphan));
    BOOST_TEST(pool.drain_queue().empty());
    pool.stop();
}

// A job naming a network or volume goes to the door's object removal, with the same
// expectation; the result names the object it was about.
BOOST_AUTO_TEST_CASE(a_network_or_volume_job_removes_that_object_only) {
    FakeEngine engine;
    Guard guard(engine, {}, quiet());
    const std::string net(64, 'e');
    const std::string plain(64, 'f');
    engine.add_network(net, owned);
    engine.add_network(plain, {});
    engine.add_volume("vol", owned);
    engine.add("c", owned);
    auto object_job = [](ObjectKind kind, const std::string& id, bool alive = false) {
        ReapJob j = job("", ReapReason::session_ended, "s", alive);
        j.object = ObjectRef{kind, id};
        return j;
    };
    const std::pair<ReapJob, Outcome> rows[] = {
        {object_job(ObjectKind::network, plain), Outcome::refused_not_owned},
        {object_job(ObjectKind::volume, "vol", true), Outcome::refused_session_alive},
        {object_job(ObjectKind::network, net), Outcome::acted},
        {object_job(ObjectKind::volume, "vol"), Outcome::acted},
        {object_job(ObjectKind::volume, "vol"), Outcome::gone},
    };
    for (const auto& [j, expected] : rows) {
        ReapResult r = reap_once(guard, j);
        BOOST_TEST((r.object == j.object));
        BOOST_TEST(to_string(r.result.outcome) == to_string(expected), j.object->id);
    }
    BOOST_TEST((engine.removed() == std::vector<std::string>{net, "vol"}));
    BOOST_TEST(engine.exists("c"));
    BOOST_TEST(engine.has_network(plain));
}
