#include "policy.hpp"

#include <boost/test/unit_test.hpp>

#include <algorithm>

using namespace reaperd;
using namespace std::chrono_literals;

namespace {
const TimePoint t0 = *parse_rfc3339("2026-11-30T12:00:00Z");

reaper::ContainerInfo info(const std::string& id, reaper::Labels labels,
                           const std::string& created = "2026-11-30T12:00:00Z") {
    reaper::ContainerInfo i;
    i.id = id;
    i.name = "n-" + id;
    i.created = created;
    i.labels = std::move(labels);
    return i;
}

std::vector<std::string> reaped(const Decision& d) {
    std::vector<std::string> ids;
    for (const auto& r : d.reap) ids.push_back(r.container);
    std::sort(ids.begin(), ids.end());
    return ids;
}

reaper::Labels owned(const std::string& session) { return {{"reaperd.session", session}}; }
}  // namespace

BOOST_AUTO_TEST_CASE(never_reaps_unlabeled_or_leased_while_reaping_the_ended) {
    Config config;
    config.sessions.max_age = 1s;  // even an expired max_age must not touch unlabeled ones
    Registry r;
    r.upsert_container(info("unlabeled", {{"app", "db"}}, "2020-01-01T00:00:00Z"), config.sessions, t0);
    r.upsert_container(info("other-key", {{"org.testcontainers.sessionId", "x"}}), config.sessions, t0);
    r.upsert_container(info("leased-1", owned("alive")), config.sessions, t0);
    r.upsert_container(info("ended-1", owned("dead")), config.sessions, t0);
    r.upsert_container(info("ended-2", owned("dead")), config.sessions, t0);
    r.lease_opened("alive", 1, t0);
    r.lease_opened("dead", 2, t0);
    r.end_session("dead", "end", t0);
    Decision d = decide(r, config, t0 + 500ms);
    BOOST_TEST((reaped(d) == std::vector<std::string>{"ended-1", "ended-2"}));
    for (const auto& reap : d.reap) BOOST_TEST(reap.reason == "session_ended");

    d = decide(r, config, t0 + 1h);  // max_age reaps the leased one too, never the unlabeled
    BOOST_TEST((reaped(d) == std::vector<std::string>{"ended-1", "ended-2", "leased-1"}));
}

BOOST_AUTO_TEST_CASE(lease_grace_ends_a_session_at_its_deadline) {
    Config config;
    Registry r;
    r.upsert_container(info("c", owned("s")), config.sessions, t0);
    r.lease_opened("s", 1, t0);
    r.lease_closed("s", 1, config.sessions.lease_grace, t0);
    Decision before = decide(r, config, t0 + 9s);
    BOOST_TEST(before.end.empty());
    BOOST_TEST(before.reap.empty());
    BOOST_TEST((before.next_wake == t0 + 10s));
    Decision at = decide(r, config, t0 + 10s);
    BOOST_REQUIRE(at.end.size() == 1u);
    BOOST_TEST(at.end[0].session == "s");
    BOOST_TEST(at.end[0].reason == "lease_expired");
    BOOST_TEST((reaped(at) == std::vector<std::string>{"c"}));
}

BOOST_AUTO_TEST_CASE(never_leased_sessions_are_left_alone_unless_unclaimed_grace) {
    Config config;
    Registry r;
    r.upsert_container(info("c", owned("s")), config.sessions, t0);
    Decision d = decide(r, config, t0 + 24h * 365);
    BOOST_TEST(d.end.empty());
    BOOST_TEST(d.reap.empty());

    config.sessions.unclaimed_grace = 1min;
    BOOST_TEST(decide(r, config, t0 + 59s).end.empty());
    BOOST_TEST((decide(r, config, t0 + 59s).next_wake == t0 + 60s));
    d = decide(r, config, t0 + 60s);
    BOOST_REQUIRE(d.end.size() == 1u);
    BOOST_TEST(d.end[0].reason == "unclaimed");
    BOOST_TEST((reaped(d) == std::vector<std::string>{"c"}));
}

BOOST_AUTO_TEST_CASE(max_age_label_overrides_the_default_per_container) {
    Config config;
    Registry r;
    r.upsert_container(info("default", owned("s")), config.sessions, t0);
    r.upsert_container(info("short", {{"reaperd.session", "s"}, {"reaperd.max-age", "30s"}}),
                       config.sessions, t0);
    r.upsert_container(info("bad", {{"reaperd.session", "s"}, {"reaperd.max-age", "x"}}),
                       config.sessions, t0);
    BOOST_TEST(decide(r, config, t0 + 29s).reap.empty());
    Decision d = decide(r, config, t0 + 30s);
    BOOST_TEST((reaped(d) == std::vector<std::string>{"short"}));
    BOOST_TEST(d.reap[0].reason == "max_age");
    config.sessions.max_age = 1h;
    BOOST_TEST((reaped(decide(r, config, t0 + 1h)) ==
                std::vector<std::string>{"bad", "default", "short"}));
}

BOOST_AUTO_TEST_CASE(tombstones_reap_later_containers_until_they_expire) {
    Config config;
    config.sessions.tombstone_ttl = 1h;
    Registry r;
    r.end_session("s", "end", t0);
    r.upsert_container(info("late", owned("s")), config.sessions, t0 + 30min);
    Decision d = decide(r, config, t0 + 30min);
    BOOST_TEST((reaped(d) == std::vector<std::string>{"late"}));
    BOOST_TEST((d.next_wake == t0 + 1h));
    d = decide(r, config, t0 + 1h);
    BOOST_TEST((d.forget == std::vector<std::string>{"s"}));
    BOOST_TEST(d.reap.empty());
}

BOOST_AUTO_TEST_CASE(pending_reaps_are_attempted_when_due_and_not_twice) {
    Config config;
    Registry r;
    r.upsert_container(info("c", owned("s")), config.sessions, t0);
    r.end_session("s", "end", t0);
    r.add_pending("c", "n-c", "s", "session_ended", t0);
    Decision d = decide(r, config, t0);
    BOOST_TEST(d.reap.empty());
    BOOST_TEST((d.attempt == std::vector<std::string>{"c"}));
    r.pending.at("c").in_flight = true;
    BOOST_TEST(decide(r, config, t0).attempt.empty());
    r.pending.at("c").in_flight = false;
    r.pending.at("c").next_attempt = t0 + 4s;
    d = decide(r, config, t0 + 1s);
    BOOST_TEST(d.attempt.empty());
    BOOST_TEST((d.next_wake == t0 + 4s));
}

BOOST_AUTO_TEST_CASE(dry_run_reports_each_container_once_and_attempts_nothing) {
    Config config;
    config.reaper.dry_run = true;
    Registry r;
    r.upsert_container(info("c", owned("s")), config.sessions, t0);
    r.end_session("s", "end", t0);
    r.add_pending("orphan", "", "s", "orphan", t0);
    Decision d = decide(r, config, t0);
    BOOST_TEST((reaped(d) == std::vector<std::string>{"c"}));
    BOOST_TEST(d.attempt.empty());
    r.would_reap_logged.insert("c");
    BOOST_TEST(decide(r, config, t0).reap.empty());
}

BOOST_AUTO_TEST_CASE(idle_unclaimed_session_records_are_forgotten) {
    Config config;
    Registry r;
    r.session("nobody", t0);
    BOOST_TEST((decide(r, config, t0).forget == std::vector<std::string>{"nobody"}));
}

BOOST_AUTO_TEST_CASE(retry_delay_doubles_caps_and_jitters) {
    struct Case {
        unsigned failures;
        double jitter;
        long expected_ms;
    } cases[] = {
        {0, 1.0, 0},      {1, 1.0, 1000},  {2, 1.0, 2000},  {3, 1.0, 4000},
        {6, 1.0, 32000},  {7, 1.0, 60000}, {1000, 1.0, 60000}, {1, 0.0, 500},
        {7, 0.0, 30000},  {3, 0.5, 3000},  {3, 7.0, 4000},  {3, -1.0, 2000},
    };
    for (const auto& c : cases)
        BOOST_TEST(retry_delay(c.failures, 1s, 60s, c.jitter).count() == c.expected_ms,
                   "failures=" << c.failures << " jitter=" << c.jitter);
}

// What the loop tells the door with each attempt: the session the reap was queued for, and
// whether that session is alive now. Only a reap because the session ended depends on it.
BOOST_AUTO_TEST_CASE(each_attempt_tells_the_door_the_session_and_its_liveness) {
    Registry r;
    r.lease_opened("leased", 1, t0);
    r.lease_opened("grace", 2, t0);
    r.lease_closed("grace", 2, 10s, t0);
    r.end_session("ended", "end", t0);
    r.lease_opened("revived", 3, t0);  // ended, then leased again: alive
    r.end_session("revived", "end", t0);
    r.lease_opened("revived", 4, t0);
    r.lease_opened("ended-while-leased", 5, t0);  // an explicit end wins over its open lease
    r.end_session("ended-while-leased", "end", t0);
    struct Row {
        std::string session;
        std::string reason;
        Expectation expected;
    } rows[] = {
        {"leased", "session_ended", {"leased", true}},
        {"grace", "session_ended", {"grace", true}},
        {"revived", "session_ended", {"revived", true}},
        {"ended", "session_ended", {"ended", false}},
        {"ended-while-leased", "session_ended", {"ended-while-leased", false}},
        {"forgotten", "session_ended", {"forgotten", false}},
        {"leased", "orphan", {"leased", false}},   // its owner's own report
        {"leased", "max_age", {"leased", false}},  // its age is the reason
        {"", "orphan", {std::nullopt, false}},     // an unverified full id: the door checks
    };
    for (const auto& row : rows) {
        PendingReap reap;
        reap.container = "c";
        reap.session = row.session;
        reap.reason = row.reason;
        BOOST_TEST((expectation_for(reap, r) == row.expected), row.session << "/" << row.reason);
    }
}
