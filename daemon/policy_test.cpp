#include "policy.hpp"

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <functional>

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
    r.end_session("dead", EndReason::end, t0);
    Decision d = decide(r, config, t0 + 500ms);
    BOOST_TEST((reaped(d) == std::vector<std::string>{"ended-1", "ended-2"}));
    for (const auto& reap : d.reap) BOOST_TEST((reap.reason == ReapReason::session_ended));

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
    BOOST_TEST((at.end[0].reason == EndReason::lease_expired));
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
    BOOST_TEST((d.end[0].reason == EndReason::unclaimed));
    BOOST_TEST((reaped(d) == std::vector<std::string>{"c"}));
}

// One deadline per session, the one decide() acts on and status shows: a lease grace's end,
// an unclaimed grace's (only for a session that never leased), a tombstone's expiry.
BOOST_AUTO_TEST_CASE(a_sessions_deadline_is_the_one_decide_acts_on) {
    Config config;
    config.sessions.unclaimed_grace = 1min;
    config.sessions.lease_grace = 10s;
    Registry r;
    r.upsert_container(info("u", owned("unclaimed")), config.sessions, t0);
    r.upsert_container(info("g", owned("grace")), config.sessions, t0);
    r.upsert_container(info("l", owned("leased")), config.sessions, t0);
    r.lease_opened("grace", 1, t0);
    r.lease_closed("grace", 1, config.sessions.lease_grace, t0 + 5s);
    r.lease_opened("leased", 2, t0);
    r.end_session("ended", EndReason::end, t0 + 1s);

    const auto& sc = config.sessions;
    BOOST_TEST((deadline_of(r.sessions.at("unclaimed"), sc) == std::optional<TimePoint>(t0 + 1min)));
    BOOST_TEST((deadline_of(r.sessions.at("grace"), sc) == std::optional<TimePoint>(t0 + 15s)));
    BOOST_TEST(!deadline_of(r.sessions.at("leased"), sc).has_value());
    BOOST_TEST((deadline_of(*r.tombstone("ended"), sc) == t0 + 1s + sc.tombstone_ttl));
    // A session that leased once is not unclaimed-graced, even with no lease or grace now.
    Session once;
    once.ever_leased = true;
    BOOST_TEST(!deadline_of(once, sc).has_value());
    config.sessions.unclaimed_grace = 0s;
    BOOST_TEST(!deadline_of(r.sessions.at("unclaimed"), config.sessions).has_value());
    config.sessions.unclaimed_grace = 1min;

    // decide() ends each at its deadline, not a moment before.
    BOOST_TEST((decide(r, config, t0 + 14s).next_wake == t0 + 15s));
    Decision d = decide(r, config, t0 + 15s);
    BOOST_REQUIRE(d.end.size() == 1u);
    BOOST_TEST(d.end[0].session == "grace");
    BOOST_TEST((d.end[0].reason == EndReason::lease_expired));
    BOOST_TEST(decide(r, config, t0 + 59s).end.size() == 1u);
    BOOST_TEST(decide(r, config, t0 + 1min).end.size() == 2u);
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
    BOOST_TEST((d.reap[0].reason == ReapReason::max_age));
    config.sessions.max_age = 1h;
    BOOST_TEST((reaped(decide(r, config, t0 + 1h)) ==
                std::vector<std::string>{"bad", "default", "short"}));
}

BOOST_AUTO_TEST_CASE(tombstones_reap_later_containers_until_they_expire) {
    Config config;
    config.sessions.tombstone_ttl = 1h;
    Registry r;
    r.end_session("s", EndReason::end, t0);
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
    r.end_session("s", EndReason::end, t0);
    r.add_pending("c", "n-c", "s", ReapReason::session_ended, t0);
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
    r.end_session("s", EndReason::end, t0);
    r.add_pending("orphan", "", "s", ReapReason::orphan, t0);
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
    r.end_session("ended", EndReason::end, t0);
    r.lease_opened("revived", 3, t0);  // ended, then leased again: alive
    r.end_session("revived", EndReason::end, t0);
    r.lease_opened("revived", 4, t0);
    r.lease_opened("ended-while-leased", 5, t0);  // an explicit end wins over its open lease
    r.end_session("ended-while-leased", EndReason::end, t0);
    // Its record goes at the end (nothing held), its lease count stays, for the door.
    r.lease_opened("lease-expired", 6, t0);
    r.lease_closed("lease-expired", 6, 10s, t0);
    r.end_session("lease-expired", EndReason::lease_expired, t0 + 10s);
    BOOST_TEST(r.sessions.count("lease-expired") == 0u);
    struct Row {
        std::string session;
        ReapReason reason;
        Expectation expected;
    } rows[] = {
        {"leased", ReapReason::session_ended, {"leased", true, 1}},
        {"grace", ReapReason::session_ended, {"grace", true, 1}},
        {"revived", ReapReason::session_ended, {"revived", true, 2}},
        {"ended", ReapReason::session_ended, {"ended", false, 0}},
        {"ended-while-leased", ReapReason::session_ended, {"ended-while-leased", false, 1}},
        {"lease-expired", ReapReason::session_ended, {"lease-expired", false, 1}},
        {"forgotten", ReapReason::session_ended, {"forgotten", false, 0}},
        {"leased", ReapReason::orphan, {"leased", false}},   // its owner's own report
        {"leased", ReapReason::max_age, {"leased", false}},  // its age is the reason
        {"", ReapReason::orphan, {std::nullopt, false}},     // an unverified full id: the door checks
    };
    for (const auto& row : rows) {
        PendingReap reap;
        reap.container = "c";
        reap.session = row.session;
        reap.reason = row.reason;
        BOOST_TEST((expectation_for(reap, r) == row.expected), row.session << "/" << to_string(row.reason));
    }
}

// ---- networks and volumes -------------------------------------------------------------------

namespace {
const ObjectRef net_a{ObjectKind::network, std::string(64, 'a')};
const ObjectRef net_b{ObjectKind::network, std::string(64, 'b')};
const ObjectRef vol_a{ObjectKind::volume, "vol-a"};
const ObjectRef vol_b{ObjectKind::volume, "vol-b"};

std::vector<ObjectRef> removed(const Decision& d) {
    std::vector<ObjectRef> refs;
    for (const auto& r : d.remove) refs.push_back(r.object);
    std::sort(refs.begin(), refs.end());
    return refs;
}
std::vector<ObjectRef> sorted(std::vector<ObjectRef> refs) {
    std::sort(refs.begin(), refs.end());
    return refs;
}
}  // namespace

// Row by row: who owns the object, the state of its session, what of its containers is left
// -> removed now or not.
BOOST_AUTO_TEST_CASE(past_max_tombstones_the_oldest_idle_ones_are_evicted) {
    Config config;
    config.sessions.max_tombstones = 3;
    Registry r;
    // Ended one minute apart, in an order unlike their ids: "e0" oldest.
    for (int i = 0; i < 6; ++i) r.end_session("e" + std::to_string(i), EndReason::end, t0 + i * 1min);
    const TimePoint now = t0 + 10min;
    Decision d = decide(r, config, now);
    BOOST_TEST((d.evict == std::vector<std::string>{"e0", "e1", "e2"}));
    BOOST_TEST(d.forget.empty());

    // Never one still needed to reap something: a container, a pending reap, a network, or
    // a pending removal keeps it (over the limit); the next oldest go instead.
    r.upsert_container(info("c", owned("e0")), config.sessions, now);
    r.add_pending("gone-soon", "n", "e1", ReapReason::session_ended, now);
    r.upsert_object({ObjectKind::network, "net"}, "net", owned("e2"), config.sessions, now);
    d = decide(r, config, now);
    BOOST_TEST((d.evict == std::vector<std::string>{"e3", "e4", "e5"}));

    r.upsert_object({ObjectKind::volume, "vol"}, "vol", owned("e3"), config.sessions, now);
    r.add_pending_object({ObjectKind::volume, "vol2"}, "vol2", "e4", now);
    d = decide(r, config, now);
    BOOST_TEST((d.evict == std::vector<std::string>{"e5"}));  // 5 busy, 1 idle: over, as allowed

    // At or under the limit nothing is evicted.
    config.sessions.max_tombstones = 6;
    BOOST_TEST(decide(r, config, now).evict.empty());
    // A live session is never a tombstone: leasing one again takes it out of the count.
    config.sessions.max_tombstones = 5;
    r.lease_opened("e5", 1, now);
    BOOST_TEST(decide(r, config, now).evict.empty());
}

// Tombstones are taken from the front of their age order: the expired ones (the oldest) are
// forgotten and the next expiry is the wake-up; the kept ones are never walked, nor expired
// ones counted against max_tombstones.
BOOST_AUTO_TEST_CASE(tombstones_expire_oldest_first_and_the_next_expiry_wakes) {
    Config config;
    config.sessions.tombstone_ttl = 1h;
    config.sessions.max_tombstones = 2;
    Registry r;
    for (int i = 0; i < 6; ++i) r.end_session("e" + std::to_string(i), EndReason::end, t0 + i * 1min);
    Decision d = decide(r, config, t0 + 1h + 2min);  // e0, e1, e2 are due (at or past expiry)
    BOOST_TEST((d.forget == std::vector<std::string>{"e0", "e1", "e2"}));
    BOOST_TEST((d.evict == std::vector<std::string>{"e3"}));  // 3 kept, over 2 by one
    BOOST_REQUIRE(d.next_wake);
    BOOST_TEST((*d.next_wake == t0 + 3min + 1h));
    for (const auto& id : d.forget) r.forget_session(id);
    for (const auto& id : d.evict) r.forget_session(id);
    BOOST_TEST(r.tombstones().size() == 2u);
    BOOST_TEST(r.tombstones_by_age().size() == 2u);
    BOOST_TEST(decide(r, config, t0 + 1h + 2min).forget.empty());
}

// A container that appears under an ended session's id gets a record beside its tombstone;
// the session stays ended (its containers are reaped), the record is not forgotten as idle,
// and the tombstone's expiry drops both.
BOOST_AUTO_TEST_CASE(a_container_under_a_tombstoned_id_is_reaped_and_keeps_it_ended) {
    Config config;
    config.sessions.tombstone_ttl = 1h;
    config.sessions.unclaimed_grace = 1s;
    Registry r;
    r.end_session("s", EndReason::end, t0);
    BOOST_TEST(r.sessions.empty());  // a tombstone only: no record
    r.upsert_container(info("late", owned("s")), config.sessions, t0 + 1min);
    BOOST_TEST(r.sessions.count("s") == 1u);
    BOOST_TEST((r.state_of("s") == SessionState::ended));
    Decision d = decide(r, config, t0 + 2min);
    BOOST_TEST((reaped(d) == std::vector<std::string>{"late"}));
    BOOST_TEST((d.reap[0].reason == ReapReason::session_ended));
    BOOST_TEST(d.end.empty());  // not "unclaimed": it has ended already
    BOOST_TEST(d.forget.empty());
    r.erase_container("late");
    BOOST_TEST(decide(r, config, t0 + 2min).forget.empty());  // the record goes with its tombstone
    d = decide(r, config, t0 + 1h);
    BOOST_TEST((d.forget == std::vector<std::string>{"s"}));
    r.forget_session("s");
    BOOST_TEST(!r.known("s"));
}

BOOST_AUTO_TEST_CASE(networks_and_volumes_go_once_their_ended_sessions_containers_are_gone) {
    Config config;
    struct Row {
        const char* name;
        std::function<void(Registry&)> setup;
        reaper::Labels labels;
        bool removed;
    } rows[] = {
        {"ended, no container", [](Registry& r) { r.end_session("s", EndReason::end, t0); }, owned("s"), true},
        {"unlabeled, whatever ends", [](Registry& r) { r.end_session("s", EndReason::end, t0); },
         {{"com.docker.compose.project", "s"}}, false},
        {"a key not in sessions.labels", [](Registry& r) { r.end_session("s", EndReason::end, t0); },
         {{"org.testcontainers.sessionId", "s"}}, false},
        {"leased", [](Registry& r) { r.lease_opened("s", 1, t0); }, owned("s"), false},
        {"in lease grace",
         [](Registry& r) {
             r.lease_opened("s", 1, t0);
             r.lease_closed("s", 1, 10s, t0);
         },
         owned("s"), false},
        {"never leased (unclaimed)", [](Registry&) {}, owned("s"), false},
        {"ended, a container of it still known",
         [](Registry& r) {
             r.end_session("s", EndReason::end, t0);
             r.upsert_container(info("c", owned("s")), SessionsConfig{}, t0);
         },
         owned("s"), false},
        {"ended, a reap of it still pending",
         [](Registry& r) {
             r.end_session("s", EndReason::end, t0);
             r.add_pending("gone-from-list", "", "s", ReapReason::orphan, t0);
         },
         owned("s"), false},
        {"ended, only another session's container left",
         [](Registry& r) {
             r.end_session("s", EndReason::end, t0);
             r.upsert_container(info("c", owned("t")), SessionsConfig{}, t0);
             r.lease_opened("t", 1, t0);
         },
         owned("s"), true},
        {"ended and leased again (revived)",
         [](Registry& r) {
             r.end_session("s", EndReason::end, t0);
             r.lease_opened("s", 1, t0);
         },
         owned("s"), false},
        {"another session ended", [](Registry& r) { r.end_session("t", EndReason::end, t0); }, owned("s"), false},
    };
    for (const auto& row : rows) {
        BOOST_TEST_CONTEXT(row.name) {
            Registry r;
            row.setup(r);
            r.upsert_object(net_a, "net-a", row.labels, config.sessions, t0);
            r.upsert_object(vol_a, "vol-a", row.labels, config.sessions, t0);
            Decision d = decide(r, config, t0 + 1s);
            auto expected = row.removed ? std::vector<ObjectRef>{net_a, vol_a} : std::vector<ObjectRef>{};
            BOOST_TEST((removed(d) == sorted(expected)));
            for (const auto& remove : d.remove) BOOST_TEST(remove.session == "s");
        }
    }
}

BOOST_AUTO_TEST_CASE(containers_first_then_their_networks_and_volumes) {
    Config config;
    Registry r;
    r.upsert_container(info("c1", owned("s")), config.sessions, t0);
    r.upsert_container(info("c2", owned("s")), config.sessions, t0);
    r.upsert_object(net_a, "net-a", owned("s"), config.sessions, t0);
    r.upsert_object(vol_a, "vol-a", owned("s"), config.sessions, t0);
    r.lease_opened("s", 1, t0);
    r.lease_closed("s", 1, config.sessions.lease_grace, t0);
    Decision d = decide(r, config, t0 + 10s);  // the grace passes: the session ends now
    BOOST_TEST(d.end.size() == 1u);
    BOOST_TEST((reaped(d) == std::vector<std::string>{"c1", "c2"}));
    BOOST_TEST(d.remove.empty());
    r.end_session("s", EndReason::lease_expired, t0 + 10s);
    r.add_pending("c1", "n-c1", "s", ReapReason::session_ended, t0 + 10s);
    r.add_pending("c2", "n-c2", "s", ReapReason::session_ended, t0 + 10s);
    r.erase_container("c1");  // reaped; c2 is still being removed
    r.containers.erase("c2");
    BOOST_TEST(decide(r, config, t0 + 11s).remove.empty());
    r.pending.erase("c2");
    BOOST_TEST((removed(decide(r, config, t0 + 11s)) == sorted({net_a, vol_a})));
}

// A session that only ever made a network: its lease drops, the grace passes, the network goes.
BOOST_AUTO_TEST_CASE(a_session_with_only_a_network_gets_it_removed_when_its_lease_drops) {
    Config config;
    Registry r;
    r.lease_opened("s", 1, t0);
    r.upsert_object(net_a, "net-a", owned("s"), config.sessions, t0);
    r.lease_closed("s", 1, config.sessions.lease_grace, t0);
    Decision d = decide(r, config, t0 + 10s);
    BOOST_REQUIRE(d.end.size() == 1u);
    BOOST_TEST((removed(d) == std::vector<ObjectRef>{net_a}));
}

// An unclaimed session record holding only networks or volumes is kept (not an idle record),
// and unclaimed_grace ends it like one with containers.
BOOST_AUTO_TEST_CASE(unclaimed_sessions_with_only_objects_follow_unclaimed_grace) {
    Config config;
    Registry r;
    r.upsert_object(vol_a, "vol-a", owned("s"), config.sessions, t0);
    Decision d = decide(r, config, t0 + 24h);
    BOOST_TEST(d.forget.empty());
    BOOST_TEST(d.remove.empty());
    config.sessions.unclaimed_grace = 1min;
    d = decide(r, config, t0 + 60s);
    BOOST_REQUIRE(d.end.size() == 1u);
    BOOST_TEST((removed(d) == std::vector<ObjectRef>{vol_a}));
}

BOOST_AUTO_TEST_CASE(pending_removals_are_attempted_when_due_never_twice_never_in_dry_run) {
    Config config;
    Registry r;
    r.end_session("s", EndReason::end, t0);
    r.upsert_object(net_a, "net-a", owned("s"), config.sessions, t0);
    r.upsert_object(net_b, "net-b", owned("s"), config.sessions, t0);
    BOOST_TEST(r.add_pending_object(net_a, "net-a", "s", t0));
    BOOST_TEST(!r.add_pending_object(net_a, "net-a", "s", t0));
    Decision d = decide(r, config, t0);
    BOOST_TEST((removed(d) == std::vector<ObjectRef>{net_b}));  // net_a is queued already
    BOOST_TEST((d.attempt_objects == std::vector<ObjectRef>{net_a}));
    r.pending_objects.at(net_a).in_flight = true;
    BOOST_TEST(decide(r, config, t0).attempt_objects.empty());
    r.pending_objects.at(net_a).in_flight = false;
    r.pending_objects.at(net_a).next_attempt = t0 + 4s;
    d = decide(r, config, t0 + 1s);
    BOOST_TEST(d.attempt_objects.empty());
    BOOST_TEST((d.next_wake == t0 + 4s));

    config.reaper.dry_run = true;
    r.pending_objects.at(net_a).next_attempt = t0;
    d = decide(r, config, t0 + 1s);
    BOOST_TEST(d.attempt_objects.empty());
    BOOST_TEST((removed(d) == std::vector<ObjectRef>{net_b}));
    r.would_remove_logged.insert(net_b);  // logged once
    BOOST_TEST(decide(r, config, t0 + 1s).remove.empty());
}

BOOST_AUTO_TEST_CASE(a_reload_of_the_label_keys_rederives_objects_too) {
    Config config;
    Registry r;
    r.end_session("s", EndReason::end, t0);
    r.upsert_object(vol_a, "vol-a", {{"org.testcontainers.sessionId", "s"}}, config.sessions, t0);
    r.upsert_object(vol_b, "vol-b", owned("s"), config.sessions, t0);
    BOOST_TEST((removed(decide(r, config, t0)) == std::vector<ObjectRef>{vol_b}));
    config.sessions.labels = {"org.testcontainers.sessionId"};
    r.rederive_sessions(config.sessions, t0);
    BOOST_TEST((removed(decide(r, config, t0)) == std::vector<ObjectRef>{vol_a}));
}

BOOST_AUTO_TEST_CASE(each_removal_tells_the_door_its_session_and_its_liveness) {
    Registry r;
    r.lease_opened("leased", 1, t0);
    r.lease_opened("grace", 2, t0);
    r.lease_closed("grace", 2, 10s, t0);
    r.end_session("ended", EndReason::end, t0);
    struct Row {
        std::string session;
        bool alive;
        std::uint64_t leases_opened;
    } rows[] = {{"leased", true, 1}, {"grace", true, 1}, {"ended", false, 0}, {"forgotten", false, 0}};
    for (const auto& row : rows) {
        PendingRemoval removal;
        removal.ref = net_a;
        removal.session = row.session;
        BOOST_TEST((expectation_for(removal, r) == Expectation{row.session, row.alive, row.leases_opened}),
                   row.session);
    }
}
