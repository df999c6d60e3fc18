#include "fake_engine.hpp"
#include "reaper.hpp"

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <sstream>
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

// ---- the pace of removals (RemovalPace) -----------------------------------------------------

namespace {

// Runs a script against a pace (max 16, slow_answer 2 s, window 10 s) on a clock the script
// moves: "S4" sends 4 attempts now, "+2500" moves the clock 2.5 s, "A3" answers the 3 sent
// longest ago, "T1" times the oldest out. Returns how many answers said "recovered".
int run_pace(RemovalPace& pace, TimePoint& now, std::deque<TimePoint>& flying, const std::string& script) {
    int recovered = 0;
    std::istringstream words(script);
    for (std::string word; words >> word;) {
        const long n = std::stol(word.substr(1));
        switch (word[0]) {
            case 'S':
                for (long i = 0; i < n; ++i) {
                    pace.sent(now);
                    flying.push_back(now);
                }
                break;
            case '+': now += std::chrono::milliseconds{n}; break;
            case 'A':
            case 'T':
                for (long i = 0; i < n; ++i) {
                    BOOST_REQUIRE(!flying.empty());
                    if (word[0] == 'A')
                        recovered += pace.answered(flying.front(), now) ? 1 : 0;
                    else
                        pace.timed_out(flying.front(), now);
                    flying.pop_front();
                }
                break;
            default: BOOST_FAIL("bad script word " << word);
        }
    }
    return recovered;
}

struct PaceRow {
    const char* name;
    const char* script;
    unsigned limit;
    std::size_t in_flight;
    EnginePace pace;
    int recovered;
};

}  // namespace

BOOST_AUTO_TEST_CASE(the_pace_follows_the_engine_table) {
    using P = EnginePace;
    const PaceRow rows[] = {
        {"fresh: reaper.concurrency", "", 16, 0, P::normal, 0},
        {"fast answers keep the limit", "S16 +50 A16", 16, 0, P::normal, 0},
        {"a timeout: a single probe, the others still hang", "S16 +3000 T1", 1, 15, P::slow, 0},
        {"more timeouts in the same silence change nothing", "S16 +3000 T16", 1, 0, P::slow, 0},
        {"silence holds one probe at a time", "S16 +3000 T16 S1 +3000 T1 S1", 1, 1, P::slow, 0},
        {"the first answer after silence recovers, then slow start", "S16 +3000 T16 S1 +50 A1", 2, 0, P::slow, 1},
        {"slow start to half of what worked (8), in one round each", "S16 +3000 T16 S1 +50 A1 S2 +50 A2 S4 +50 A4",
         8, 0, P::slow, 1},
        {"then about one more per limit answers", "S16 +3000 T16 S1 +50 A1 S2 +50 A2 S4 +50 A4 S8 +50 A8 S1 +50 A1",
         9, 0, P::slow, 1},
        {"the probe that ends a silence waited it out: not a slow answer", "S16 +3000 T16 S1 +2900 A1", 2, 0,
         P::slow, 1},
        {"nor those sent before it that the engine answers at last", "S16 +3000 T1 S1 +2900 A1 A15", 9, 0,
         P::slow, 1},
        {"slow answers halve once per slow_answer, not once each", "S16 +2500 A16", 8, 0, P::slow, 0},
        {"and halve again after slow_answer", "S16 +2500 A8 +2100 A8", 4, 0, P::slow, 0},
        {"slow clears 10 s after the last bad news", "S16 +2500 A16 +10001", 8, 0, P::normal, 0},
        {"a timeout keeps slow for 10 s after it", "S1 +3000 T1 S1 +50 A1 +9000", 2, 0, P::slow, 1},
        {"and then clears", "S1 +3000 T1 S1 +50 A1 +10001", 2, 0, P::normal, 1},
        {"an attempt in flight past slow_answer is slow already", "S1 +2001", 16, 1, P::slow, 0},
        {"but not before", "S1 +1999", 16, 1, P::normal, 0},
    };
    for (const auto& row : rows) {
        BOOST_TEST_CONTEXT(row.name) {
            RemovalPace pace;
            TimePoint now{std::chrono::hours{1}};
            std::deque<TimePoint> flying;
            BOOST_TEST(run_pace(pace, now, flying, row.script) == row.recovered);
            BOOST_TEST(pace.limit() == row.limit);
            BOOST_TEST(pace.in_flight() == row.in_flight);
            BOOST_TEST((pace.pace(now) == row.pace));
            BOOST_TEST(pace.may_send() == (row.in_flight < row.limit));
        }
    }
}

// An attempt still unanswered makes the engine slow while every answer so far came fast, and
// the figures say how long it has waited (the warning names it then).
BOOST_AUTO_TEST_CASE(an_attempt_waiting_long_is_in_the_figures_until_its_answer) {
    RemovalPace pace;
    TimePoint now{std::chrono::hours{1}};
    std::deque<TimePoint> flying;
    run_pace(pace, now, flying, "S2 +60 A1 +2440");
    auto f = pace.figures(now);
    BOOST_TEST(f.latency_max_recent.count() == 60);
    BOOST_TEST(f.oldest_in_flight.count() == 2500);
    BOOST_TEST((pace.pace(now) == EnginePace::slow));
    run_pace(pace, now, flying, "A1");
    BOOST_TEST(pace.figures(now).oldest_in_flight.count() == 0);
}

BOOST_AUTO_TEST_CASE(the_pace_says_when_it_changes_by_time_alone_and_gives_its_figures) {
    RemovalPace pace;
    TimePoint now{std::chrono::hours{1}};
    std::deque<TimePoint> flying;
    BOOST_TEST(!pace.next_change(now).has_value());
    run_pace(pace, now, flying, "S2");
    BOOST_TEST((pace.next_change(now) == now + std::chrono::milliseconds{2001}));
    run_pace(pace, now, flying, "+3000 T1");
    const TimePoint timed_out = now;
    run_pace(pace, now, flying, "+1000 A1");  // answered after 4 s: slow, and the recovery
    auto f = pace.figures(now);
    BOOST_TEST(f.timeouts_total == 1u);
    BOOST_TEST(f.timeouts_recent == 1u);
    BOOST_TEST(f.latency.count() == 4000);
    BOOST_TEST(f.latency_max_recent.count() == 4000);
    BOOST_TEST(f.oldest_in_flight.count() == 0);  // nothing in flight
    BOOST_TEST((pace.next_change(now) == timed_out + std::chrono::seconds{10}));
    now = timed_out + std::chrono::seconds{10} + std::chrono::milliseconds{1};
    BOOST_TEST(pace.figures(now).timeouts_recent == 0u);
    BOOST_TEST((pace.pace(now) == EnginePace::slow));  // the slow answer came 1 s later
    now += std::chrono::seconds{1};
    BOOST_TEST((pace.pace(now) == EnginePace::normal));
    BOOST_TEST(!pace.next_change(now).has_value());
}

BOOST_AUTO_TEST_CASE(the_pace_takes_its_limit_and_slow_mark_from_the_config) {
    Config config;
    config.reaper.concurrency = 4;
    config.engine.request_timeout = std::chrono::seconds{3};
    const auto pace = PaceConfig::from(config);
    BOOST_TEST(pace.max_limit == 4u);
    BOOST_TEST(pace.slow_answer.count() == 1500);
    config.engine.request_timeout = std::chrono::seconds{30};
    BOOST_TEST(PaceConfig::from(config).slow_answer.count() == 2000);
    BOOST_TEST(RemovalPace(PaceConfig::from(config)).limit() == 4u);
}
