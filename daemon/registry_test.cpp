#include "registry.hpp"

#include <boost/test/unit_test.hpp>

using namespace reaperd;
using namespace std::chrono_literals;

namespace reaperd {
std::ostream& operator<<(std::ostream& out, SessionState s) { return out << to_string(s); }
}  // namespace reaperd

namespace {
const TimePoint t0 = TimePoint{} + std::chrono::hours{24 * 365 * 56};

reaper::ContainerInfo info(const std::string& id, reaper::Labels labels) {
    reaper::ContainerInfo i;
    i.id = id;
    i.name = "n-" + id;
    i.created = "2026-11-30T13:00:00.5Z";
    i.labels = std::move(labels);
    return i;
}
}  // namespace

BOOST_AUTO_TEST_CASE(ownership_needs_one_of_the_configured_label_keys) {
    struct Case {
        reaper::Labels labels;
        std::vector<std::string> keys;
        std::optional<std::string> session;
    } cases[] = {
        {{}, {"reaperd.session"}, std::nullopt},
        {{{"other", "x"}}, {"reaperd.session"}, std::nullopt},
        {{{"reaperd.session", "s1"}}, {"reaperd.session"}, "s1"},
        {{{"reaperd.session", ""}}, {"reaperd.session"}, ""},
        {{{"org.testcontainers.sessionId", "tc"}}, {"reaperd.session"}, std::nullopt},
        {{{"org.testcontainers.sessionId", "tc"}},
         {"reaperd.session", "org.testcontainers.sessionId"},
         "tc"},
        {{{"b", "from-b"}, {"a", "from-a"}}, {"a", "b"}, "from-a"},
        {{{"reaperd.session.x", "s"}}, {"reaperd.session"}, std::nullopt},
        {{{"reaperd.session", "s"}}, {}, std::nullopt},
    };
    for (const auto& c : cases) BOOST_TEST((owning_session(c.labels, c.keys) == c.session));
}

BOOST_AUTO_TEST_CASE(upsert_derives_session_and_max_age_and_warns_on_a_bad_label) {
    Registry r;
    SessionsConfig config;
    BOOST_TEST(!r.upsert_container(info("a", {{"reaperd.session", "s"}, {"reaperd.max-age", "5m"}}),
                                   config, t0));
    BOOST_TEST(*r.containers.at("a").session == "s");
    BOOST_TEST(r.containers.at("a").max_age->count() == 300000);
    BOOST_TEST(r.sessions.count("s") == 1);
    auto warning = r.upsert_container(info("b", {{"reaperd.session", "s"}, {"reaperd.max-age", "soon"}}),
                                      config, t0);
    BOOST_REQUIRE(warning);
    BOOST_TEST(warning->find("soon") != std::string::npos);
    BOOST_TEST(warning->find("n-b") != std::string::npos);
    BOOST_TEST(!r.containers.at("b").max_age);
    // Refreshed (say, on its start event): warned once only.
    BOOST_TEST(!r.upsert_container(info("b", {{"reaperd.session", "s"}, {"reaperd.max-age", "soon"}}),
                                   config, t0));
    r.upsert_container(info("c", {{"x", "y"}}), config, t0);
    BOOST_TEST(!r.containers.at("c").session);
    BOOST_TEST(r.tracked_count() == 2);
    BOOST_TEST(r.containers_of("s") == 2);
    BOOST_TEST((r.containers.at("a").created == *parse_rfc3339("2026-11-30T13:00:00.5Z")));
}

BOOST_AUTO_TEST_CASE(rederive_follows_a_change_of_label_keys) {
    Registry r;
    SessionsConfig config;
    r.upsert_container(info("a", {{"tc", "x"}}), config, t0);
    BOOST_TEST(!r.containers.at("a").session);
    config.labels.push_back("tc");
    r.rederive_sessions(config, t0);
    BOOST_TEST(*r.containers.at("a").session == "x");
}

BOOST_AUTO_TEST_CASE(session_states_follow_leases_grace_and_end) {
    Registry r;
    r.session("s", t0);
    BOOST_TEST((r.state_of("s") == SessionState::unclaimed));
    r.lease_opened("s", 1, t0);
    r.lease_opened("s", 2, t0);
    BOOST_TEST((r.state_of("s") == SessionState::leased));
    r.lease_closed("s", 1, 10s, t0);
    BOOST_TEST((r.state_of("s") == SessionState::leased));
    r.lease_closed("s", 2, 10s, t0 + 1s);
    BOOST_TEST((r.state_of("s") == SessionState::grace));
    BOOST_TEST((*r.sessions.at("s").grace_deadline == t0 + 11s));
    r.lease_closed("s", 2, 10s, t0 + 5s);  // unknown connection: no change
    BOOST_TEST((*r.sessions.at("s").grace_deadline == t0 + 11s));
    r.lease_opened("s", 3, t0 + 2s);
    BOOST_TEST((r.state_of("s") == SessionState::leased));
    BOOST_TEST(r.end_session("s", EndReason::end, t0 + 3s));
    BOOST_TEST(!r.end_session("s", EndReason::end, t0 + 4s));
    BOOST_TEST((r.state_of("s") == SessionState::ended));
    r.lease_closed("s", 3, 10s, t0 + 5s);
    BOOST_TEST((r.state_of("s") == SessionState::ended));
    r.lease_opened("s", 4, t0 + 6s);
    BOOST_TEST((r.state_of("s") == SessionState::leased));
}

// An ended session that holds nothing is a tombstone only (no Session record: 100,000 may be
// held); one ended while leased keeps its record until its last lease closes.
BOOST_AUTO_TEST_CASE(tombstones_keep_no_record_unless_something_is_held) {
    Registry r;
    BOOST_TEST(r.end_session("idle", EndReason::end, t0));
    BOOST_TEST(r.sessions.count("idle") == 0u);
    BOOST_TEST(r.known("idle"));
    BOOST_TEST((r.state_of("idle") == SessionState::ended));

    r.lease_opened("held", 1, t0);
    BOOST_TEST(r.end_session("held", EndReason::end, t0 + 1s));
    BOOST_TEST(r.sessions.at("held").leases.size() == 1u);
    BOOST_TEST((r.state_of("held") == SessionState::ended));
    BOOST_TEST(r.session_count() == 2u);
    r.lease_closed("held", 1, 10s, t0 + 2s);
    BOOST_TEST(r.sessions.count("held") == 0u);  // nothing held: the tombstone alone
    BOOST_TEST((r.state_of("held") == SessionState::ended));

    // The age order follows every change: oldest first, revived and forgotten ones gone.
    r.end_session("older", EndReason::lease_expired, t0 - 1s);
    std::vector<std::string> order;
    for (const auto& [at, id] : r.tombstones_by_age()) order.push_back(*id);
    BOOST_TEST((order == std::vector<std::string>{"older", "idle", "held"}));
    r.lease_opened("idle", 2, t0 + 3s);
    r.forget_session("older");
    order.clear();
    for (const auto& [at, id] : r.tombstones_by_age()) order.push_back(*id);
    BOOST_TEST((order == std::vector<std::string>{"held"}));
    BOOST_TEST(r.tombstones().size() == 1u);
    BOOST_TEST((r.state_of("idle") == SessionState::leased));
    Registry moved = std::move(r);  // the order points into the map: it moves with it
    BOOST_TEST(*moved.tombstones_by_age().begin()->second == "held");
}

BOOST_AUTO_TEST_CASE(persisted_then_restored_gives_leased_sessions_a_fresh_grace) {
    Registry r;
    r.lease_opened("leased", 1, t0);
    r.lease_opened("grace", 2, t0);
    r.lease_closed("grace", 2, 10s, t0);
    r.end_session("ended", EndReason::end, t0);
    r.session("unclaimed", t0);
    r.add_pending("c1", "name1", "ended", ReapReason::session_ended, t0);
    r.pending.at("c1").failures = 3;
    r.pending.at("c1").in_flight = true;
    PersistedState p = r.persisted();
    BOOST_TEST(p.sessions.size() == 3u);
    BOOST_TEST(p.pending.size() == 1u);
    BOOST_TEST(!p.pending[0].in_flight);

    Registry back;
    TimePoint later = t0 + 1h;
    back.restore(p, 10s, later);
    BOOST_TEST((back.state_of("leased") == SessionState::grace));
    BOOST_TEST((*back.sessions.at("leased").grace_deadline == later + 10s));
    BOOST_TEST((*back.sessions.at("grace").grace_deadline == t0 + 10s));
    BOOST_TEST((back.state_of("ended") == SessionState::ended));
    BOOST_REQUIRE(back.tombstone("ended"));
    BOOST_TEST((back.tombstone("ended")->ended_at == t0));
    BOOST_TEST((back.tombstone("ended")->reason == EndReason::end));
    BOOST_TEST(back.sessions.count("ended") == 0u);  // a tombstone only
    BOOST_TEST(!back.known("unclaimed"));
    BOOST_TEST(back.pending.at("c1").failures == 3u);
    BOOST_TEST((back.pending.at("c1").next_attempt == later));
}

BOOST_AUTO_TEST_CASE(rfc3339_parses_what_the_engine_writes) {
    auto t = parse_rfc3339("2026-11-30T13:26:20.123456789Z");
    BOOST_REQUIRE(t);
    BOOST_TEST(format_rfc3339(*t) == "2026-11-30T13:26:20.123Z");
    BOOST_TEST((*parse_rfc3339("2026-11-30T14:26:20+01:00") == *parse_rfc3339("2026-11-30T13:26:20Z")));
    for (const char* bad : {"", "yesterday", "2026-11-30", "2026-11-30T13:26:20", "2026-11-30T13:26:20Q"})
        BOOST_TEST(!parse_rfc3339(bad), bad);
}

BOOST_AUTO_TEST_CASE(networks_and_volumes_are_tracked_by_kind_and_id_with_their_session) {
    Registry r;
    SessionsConfig config;
    const ObjectRef net{ObjectKind::network, std::string(64, 'a')};
    const ObjectRef vol{ObjectKind::volume, std::string(64, 'a')};  // same id, other kind
    const ObjectRef plain{ObjectKind::volume, "plain"};
    r.upsert_object(net, "web", {{"reaperd.session", "s"}}, config, t0);
    r.upsert_object(vol, "anon", {{"reaperd.session", "s"}}, config, t0);
    r.upsert_object(plain, "plain", {}, config, t0);
    BOOST_TEST(r.objects.size() == 3u);
    BOOST_TEST(r.sessions.count("s") == 1u);
    BOOST_TEST(r.tracked_objects(ObjectKind::network) == 1u);
    BOOST_TEST(r.tracked_objects(ObjectKind::volume) == 1u);  // the unlabeled one is not tracked
    BOOST_TEST(r.objects_of("s", ObjectKind::volume) == 1u);
    BOOST_TEST(!r.objects.at(plain).session);

    BOOST_TEST(r.add_pending_object(net, "web", "s", t0));
    BOOST_TEST(r.add_pending_object(vol, "anon", "s", t0));
    BOOST_TEST(r.pending_objects_of(ObjectKind::network) == 1u);
    r.pending_objects.at(vol).in_flight = true;
    r.erase_object(net);
    r.erase_object(vol);  // its attempt in flight settles it
    BOOST_TEST(r.objects.size() == 1u);
    BOOST_TEST(r.pending_objects.size() == 1u);
    BOOST_TEST(r.pending_objects.count(vol) == 1u);

    config.labels = {"other"};
    r.upsert_object(net, "web", {{"reaperd.session", "s"}}, config, t0);
    BOOST_TEST(!r.objects.at(net).session);
    r.rederive_sessions(SessionsConfig{}, t0);
    BOOST_TEST(r.objects.at(net).session.value_or("") == "s");
}
