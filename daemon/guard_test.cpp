// The guarded door: its pure decision as a table (ownership under the config in force, the
// expected session, liveness, dry run, pinning, gone), then act() against the scripted engine
// under every fault, and a reload racing with callers.
#include "fake_engine.hpp"
#include "guard.hpp"

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <thread>

using namespace reaperd;
namespace test = reaper::test;
using test::FakeEngine;
using test::Fault;

namespace {

const std::string full_a(64, 'a');
const std::string full_b(64, 'b');

reaper::ContainerInfo container(const std::string& id, reaper::Labels labels,
                                const std::string& status = "running") {
    reaper::ContainerInfo info;
    info.id = id;
    info.name = "web";
    info.labels = std::move(labels);
    info.state.status = status;
    info.state.running = status == "running";
    return info;
}

GuardRequest request(const std::string& id, ContainerAct act = ContainerAct::remove,
                     Expectation expect = {}) {
    GuardRequest r;
    r.container = id;
    r.act = act;
    r.expect = std::move(expect);
    return r;
}

const GuardConfig default_labels{};  // [reaperd.session], no dry run
const GuardConfig both_keys{{"reaperd.session", "org.testcontainers.sessionId"}, false};
const GuardConfig testcontainers_only{{"org.testcontainers.sessionId"}, false};
const GuardConfig dry{{"reaperd.session"}, true};

struct Records {
    std::mutex mutex;
    std::vector<std::map<std::string, std::string>> all;
    LogSink sink() {
        return [this](Priority, std::string_view, std::string_view, std::vector<LogField> fields) {
            std::map<std::string, std::string> m;
            for (auto& f : fields) m[f.name] = f.value;
            std::lock_guard lock(mutex);
            all.push_back(std::move(m));
        };
    }
    std::size_t with(const std::string& field, const std::string& value) {
        std::lock_guard lock(mutex);
        return static_cast<std::size_t>(std::count_if(all.begin(), all.end(), [&](const auto& m) {
            auto it = m.find(field);
            return it != m.end() && it->second == value;
        }));
    }
};

}  // namespace

// The decision, row by row: inspect result + config + what the caller expects -> outcome.
BOOST_AUTO_TEST_CASE(the_decision_table) {
    const reaper::Labels of_a{{"reaperd.session", "A"}};
    struct Row {
        const char* name;
        std::optional<reaper::ContainerInfo> inspected;
        GuardRequest request;
        GuardConfig config;
        Outcome expected;
    } rows[] = {
        {"owned, remove", container(full_a, of_a), request(full_a), default_labels, Outcome::acted},
        {"gone (404 at inspect)", std::nullopt, request(full_a), default_labels, Outcome::gone},
        {"no labels at all", container(full_a, {}), request(full_a), default_labels,
         Outcome::refused_not_owned},
        {"a near-miss key is not the label", container(full_a, {{"reaperd.sessionx", "A"}}),
         request(full_a), default_labels, Outcome::refused_not_owned},
        {"a key not in sessions.labels", container(full_a, {{"org.testcontainers.sessionId", "A"}}),
         request(full_a), default_labels, Outcome::refused_not_owned},
        {"the same key once configured", container(full_a, {{"org.testcontainers.sessionId", "A"}}),
         request(full_a), both_keys, Outcome::acted},
        {"labels changed by a reload: owned no more", container(full_a, of_a), request(full_a),
         testcontainers_only, Outcome::refused_not_owned},
        {"the expected session", container(full_a, of_a),
         request(full_a, ContainerAct::remove, {"A", false}), default_labels, Outcome::acted},
        {"another session than expected", container(full_a, {{"reaperd.session", "B"}}),
         request(full_a, ContainerAct::remove, {"A", false}), default_labels,
         Outcome::refused_other_session},
        {"the first configured key names the session",
         container(full_a, {{"org.testcontainers.sessionId", "B"}, {"reaperd.session", "A"}}),
         request(full_a, ContainerAct::remove, {"A", false}),
         GuardConfig{{"org.testcontainers.sessionId", "reaperd.session"}, false},
         Outcome::refused_other_session},
        {"the caller knows its session is alive", container(full_a, of_a),
         request(full_a, ContainerAct::remove, {"A", true}), default_labels,
         Outcome::refused_session_alive},
        {"dry run", container(full_a, of_a), request(full_a), dry, Outcome::dry_run},
        {"dry run refuses first what it would refuse anyway", container(full_a, {}), request(full_a),
         dry, Outcome::refused_not_owned},
        {"a name is not pinned", container(full_a, of_a), request("web"), default_labels,
         Outcome::refused_not_pinned},
        {"an id prefix is not pinned", container(full_a, of_a), request(full_a.substr(0, 12)),
         default_labels, Outcome::refused_not_pinned},
        {"a reused name resolves to another id", container(full_b, {{"reaperd.session", "B"}}),
         request(full_a, ContainerAct::remove, {"A", false}), default_labels,
         Outcome::refused_not_pinned},
        {"already being removed", container(full_a, of_a, "removing"), request(full_a),
         default_labels, Outcome::removing},
        {"remove of an exited container", container(full_a, of_a, "exited"), request(full_a),
         default_labels, Outcome::acted},
        {"stop of a running container", container(full_a, of_a), request(full_a, ContainerAct::stop),
         default_labels, Outcome::acted},
        {"stop of an exited container", container(full_a, of_a, "exited"),
         request(full_a, ContainerAct::stop), default_labels, Outcome::not_running},
        {"kill of an unowned running container", container(full_a, {}),
         request(full_a, ContainerAct::kill), default_labels, Outcome::refused_not_owned},
        {"kill after a reload to dry run", container(full_a, of_a), request(full_a, ContainerAct::kill),
         dry, Outcome::dry_run},
    };
    for (const auto& row : rows) {
        BOOST_TEST_CONTEXT(row.name) {
            BOOST_TEST(to_string(judge(row.inspected, row.request, row.config)) == to_string(row.expected));
        }
    }
}

BOOST_AUTO_TEST_CASE(only_a_full_id_pins_a_container) {
    BOOST_TEST(is_full_container_id(full_a));
    BOOST_TEST(!is_full_container_id(full_a.substr(1)));
    BOOST_TEST(!is_full_container_id(std::string(64, 'A')));
    BOOST_TEST(!is_full_container_id("web"));
    BOOST_TEST(!is_full_container_id(std::string(63, 'a') + "g"));
}

// act(): one attempt under each fault the engine can give; destructive calls only when the
// decision says so, and only by the full id.
BOOST_AUTO_TEST_CASE(one_act_under_each_injected_fault) {
    struct Case {
        const char* name;
        std::string op;  // which call fails ("" = none)
        std::vector<Fault> faults;
        Outcome expected;
        bool removed;
    } cases[] = {
        {"clean", "", {}, Outcome::acted, true},
        {"409 removal in progress", "remove", {test::removal_in_progress()}, Outcome::removing, false},
        {"409 other conflict", "remove", {test::conflict_running()}, Outcome::failed, false},
        {"500 on remove", "remove", {test::server_error()}, Outcome::failed, false},
        {"500 on inspect", "inspect", {test::server_error()}, Outcome::failed, false},
        {"timeout on remove", "remove", {test::timeout()}, Outcome::failed, false},
        {"unreachable on inspect", "inspect", {test::unreachable()}, Outcome::failed, false},
        {"404 on remove", "remove", {{reaper::EngineErrorKind::NotFound, 404, "No such container"}},
         Outcome::gone, false},
        {"404 on inspect", "inspect", {{reaper::EngineErrorKind::NotFound, 404, "No such container"}},
         Outcome::gone, false},
    };
    for (const auto& c : cases) {
        BOOST_TEST_CONTEXT(c.name) {
            FakeEngine engine;
            Records records;
            Guard guard(engine, default_labels, records.sink());
            engine.add(full_a, {{"reaperd.session", "s"}});
            if (!c.op.empty()) engine.fail(c.op, full_a, c.faults);
            GuardResult r = guard.act(request(full_a));
            BOOST_TEST(to_string(r.outcome) == to_string(c.expected));
            BOOST_TEST(!engine.exists(full_a) == c.removed);
            if (c.expected == Outcome::failed) BOOST_TEST(!r.error.empty());
            BOOST_TEST(records.all.empty());  // only refusals and dry runs are the door's to log
            // No answer in time: whether the engine acted is unknown, and counted as such.
            const bool unanswered = c.faults.size() == 1 && c.faults[0].kind == reaper::EngineErrorKind::Timeout;
            BOOST_TEST(r.unanswered == unanswered);
            BOOST_TEST(guard.counts()[unanswered ? "unanswered" : std::string(to_string(c.expected))] == 1u);
        }
    }
}

BOOST_AUTO_TEST_CASE(refusals_make_no_call_and_are_logged_once_with_their_reason) {
    FakeEngine engine;
    Records records;
    Guard guard(engine, default_labels, records.sink());
    engine.add(full_a, {{"app", "db"}});
    engine.add(full_b, {{"reaperd.session", "B"}});
    engine.rename(full_b, "web");
    GuardResult unowned = guard.act(request(full_a, ContainerAct::stop));
    GuardResult other = guard.act(request(full_b, ContainerAct::remove, {"A", false}));
    GuardResult by_name = guard.act(request("web"));
    GuardResult alive = guard.act(request(full_b, ContainerAct::kill, {"B", true}));
    BOOST_TEST(to_string(unowned.outcome) == "refused_not_owned");
    BOOST_TEST(to_string(other.outcome) == "refused_other_session");
    BOOST_TEST(other.session.value_or("") == "B");
    BOOST_TEST(other.name == "web");
    BOOST_TEST(to_string(by_name.outcome) == "refused_not_pinned");
    BOOST_TEST(to_string(alive.outcome) == "refused_session_alive");
    BOOST_TEST(engine.destructive_calls().empty());
    BOOST_TEST(records.with("ACTION", "refused") == 4u);
    BOOST_TEST(records.with("REFUSAL", "refused_other_session") == 1u);
    BOOST_TEST(records.with("CONTAINER_ID", full_b) == 2u);
}

// The loop judged session B ended and sent the reap to the pool; before the door acts, a
// lease on B is accepted by the control server (the loop has not heard of it yet). The
// reap must not go through; one the loop sent after seeing that lease, with B ended again,
// does. (daemon_loop_test once removed a re-leased session's container in this window.)
BOOST_AUTO_TEST_CASE(a_lease_accepted_after_the_loop_judged_is_a_refusal) {
    FakeEngine engine;
    Records records;
    Guard guard(engine, default_labels, records.sink());
    engine.add(full_b, {{"reaperd.session", "B"}});
    engine.add(full_a, {{"reaperd.session", "A"}});
    engine.add_volume("vol-b", {{"reaperd.session", "B"}});
    guard.lease_opening("B");  // an earlier lease the loop had seen: leases_opened 1 below
    guard.lease_opening("B");  // the new one, not yet seen by the loop
    const Expectation judged_ended{"B", false, 1};
    BOOST_TEST(to_string(guard.act(request(full_b, ContainerAct::remove, judged_ended)).outcome) ==
               "refused_session_alive");
    BOOST_TEST(to_string(guard.act(ObjectRequest{{ObjectKind::volume, "vol-b"}, judged_ended, ReapReason::session_ended})
                             .outcome) == "refused_session_alive");
    BOOST_TEST(engine.destructive_calls().empty());
    // A session nobody leased meanwhile, and one whose count the door forgot, are reaped.
    BOOST_TEST(to_string(guard.act(request(full_a, ContainerAct::remove, {"A", false, 0})).outcome) == "acted");
    guard.forget_session("B");
    BOOST_TEST(to_string(guard.act(request(full_b, ContainerAct::remove, {"B", false, 2})).outcome) == "acted");
    BOOST_TEST(engine.destructive_calls().size() == 2u);
}

BOOST_AUTO_TEST_CASE(a_reload_reaches_the_next_act) {
    FakeEngine engine;
    Records records;
    Guard guard(engine, default_labels, records.sink());
    engine.add(full_a, {{"reaperd.session", "s"}});
    guard.configure(dry);
    BOOST_TEST(to_string(guard.act(request(full_a)).outcome) == "dry_run");
    BOOST_TEST(records.with("ACTION", "would_remove") == 1u);
    guard.configure(testcontainers_only);
    BOOST_TEST(to_string(guard.act(request(full_a)).outcome) == "refused_not_owned");
    BOOST_TEST(engine.destructive_calls().empty());
    guard.configure(default_labels);
    BOOST_TEST(to_string(guard.act(request(full_a)).outcome) == "acted");
    BOOST_TEST((engine.destructive_calls() == std::vector<std::string>{full_a}));
}

// Callers on several threads while the loop installs configs: every act sees a whole
// config (under TSan: no race), and with dry run on throughout nothing is ever called.
BOOST_AUTO_TEST_CASE(configure_races_with_callers) {
    FakeEngine engine;
    Records records;
    Guard guard(engine, dry, records.sink());
    for (int i = 0; i < 8; ++i) engine.add(std::string(63, 'a') + char('0' + i), {{"reaperd.session", "s"}});
    std::atomic<bool> done{false};
    std::thread reloader([&] {
        for (int i = 0; !done; ++i)
            guard.configure(i % 2 ? dry : GuardConfig{{"reaperd.session", "x"}, true});
    });
    std::vector<std::thread> callers;
    for (int t = 0; t < 4; ++t)
        callers.emplace_back([&, t] {
            for (int i = 0; i < 200; ++i)
                guard.act(request(std::string(63, 'a') + char('0' + (t + i) % 8), ContainerAct::kill));
        });
    for (auto& c : callers) c.join();
    done = true;
    reloader.join();
    BOOST_TEST(engine.destructive_calls().empty());
    BOOST_TEST(guard.counts()["dry_run"] == 800u);
}

// ---- networks and volumes: the same door ----------------------------------------------------

namespace {

InspectedObject network(const std::string& id, reaper::Labels labels, std::size_t attached = 0) {
    return {id, "net", std::move(labels), attached};
}
InspectedObject volume(const std::string& name, reaper::Labels labels) {
    return {name, name, std::move(labels), 0};
}
ObjectRequest remove_network(const std::string& id, Expectation expect = {}) {
    return {{ObjectKind::network, id}, std::move(expect), ReapReason::session_ended};
}
ObjectRequest remove_volume(const std::string& name, Expectation expect = {}) {
    return {{ObjectKind::volume, name}, std::move(expect), ReapReason::session_ended};
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_decision_table_for_networks_and_volumes) {
    const reaper::Labels of_a{{"reaperd.session", "A"}};
    const Expectation a{"A", false};
    struct Row {
        const char* name;
        std::optional<InspectedObject> inspected;
        ObjectRequest request;
        GuardConfig config;
        Outcome expected;
    } rows[] = {
        {"owned network of the ended session", network(full_a, of_a), remove_network(full_a, a),
         default_labels, Outcome::acted},
        {"owned volume of the ended session", volume("data", of_a), remove_volume("data", a),
         default_labels, Outcome::acted},
        {"network gone (404 at inspect)", std::nullopt, remove_network(full_a, a), default_labels,
         Outcome::gone},
        {"volume gone", std::nullopt, remove_volume("data", a), default_labels, Outcome::gone},
        {"unlabeled network", network(full_a, {}), remove_network(full_a, a), default_labels,
         Outcome::refused_not_owned},
        {"unlabeled volume", volume("data", {{"com.docker.compose.project", "x"}}),
         remove_volume("data", a), default_labels, Outcome::refused_not_owned},
        {"a key dropped by a reload", volume("data", of_a), remove_volume("data", a),
         testcontainers_only, Outcome::refused_not_owned},
        {"another key once configured", network(full_a, {{"org.testcontainers.sessionId", "A"}}),
         remove_network(full_a, a), both_keys, Outcome::acted},
        {"a volume name reused by another session", volume("data", {{"reaperd.session", "B"}}),
         remove_volume("data", a), default_labels, Outcome::refused_other_session},
        {"its session alive again", network(full_a, of_a), remove_network(full_a, {"A", true}),
         default_labels, Outcome::refused_session_alive},
        {"a network by name is not pinned", network(full_a, of_a), remove_network("net", a),
         default_labels, Outcome::refused_not_pinned},
        {"a network by id prefix is not pinned", network(full_a, of_a),
         remove_network(full_a.substr(0, 12), a), default_labels, Outcome::refused_not_pinned},
        {"a network id resolving to another network", network(full_b, of_a), remove_network(full_a, a),
         default_labels, Outcome::refused_not_pinned},
        {"a volume answering under another name", volume("data2", of_a), remove_volume("data", a),
         default_labels, Outcome::refused_not_pinned},
        {"a network with a container attached", network(full_a, of_a, 1), remove_network(full_a, a),
         default_labels, Outcome::failed},
        {"an unowned attached network is refused first", network(full_a, {}, 2),
         remove_network(full_a, a), default_labels, Outcome::refused_not_owned},
        {"dry run", network(full_a, of_a), remove_network(full_a, a), dry, Outcome::dry_run},
        {"dry run refuses the unowned all the same", volume("data", {}), remove_volume("data", a), dry,
         Outcome::refused_not_owned},
    };
    for (const auto& row : rows) {
        BOOST_TEST_CONTEXT(row.name) {
            BOOST_TEST(to_string(judge(row.inspected, row.request, row.config)) == to_string(row.expected));
        }
    }
}

BOOST_AUTO_TEST_CASE(network_and_volume_removal_under_each_injected_fault) {
    const Fault in_use_403{reaper::EngineErrorKind::BadRequest, 403, "error while removing network: has active endpoints"};
    const Fault in_use_409{reaper::EngineErrorKind::Conflict, 409, "remove data: volume is in use"};
    const Fault not_found{reaper::EngineErrorKind::NotFound, 404, "not found"};
    struct Case {
        const char* name;
        ObjectKind kind;
        std::string op;
        std::vector<Fault> faults;
        Outcome expected;
        bool removed;
    } cases[] = {
        {"network, clean", ObjectKind::network, "", {}, Outcome::acted, true},
        {"volume, clean", ObjectKind::volume, "", {}, Outcome::acted, true},
        {"network in use (403)", ObjectKind::network, "remove_network", {in_use_403}, Outcome::failed, false},
        {"volume in use (409)", ObjectKind::volume, "remove_volume", {in_use_409}, Outcome::failed, false},
        {"network 500 on inspect", ObjectKind::network, "inspect_network", {test::server_error()},
         Outcome::failed, false},
        {"volume timeout on remove", ObjectKind::volume, "remove_volume", {test::timeout()}, Outcome::failed,
         false},
        {"network 404 on remove", ObjectKind::network, "remove_network", {not_found}, Outcome::gone, false},
        {"volume 404 on inspect", ObjectKind::volume, "inspect_volume", {not_found}, Outcome::gone, false},
    };
    for (const auto& c : cases) {
        BOOST_TEST_CONTEXT(c.name) {
            FakeEngine engine;
            Records records;
            Guard guard(engine, default_labels, records.sink());
            engine.add_network(full_a, {{"reaperd.session", "s"}});
            engine.add_volume("data", {{"reaperd.session", "s"}});
            const std::string id = c.kind == ObjectKind::network ? full_a : "data";
            if (!c.op.empty()) engine.fail(c.op, id, c.faults);
            ObjectRequest request;
            request.object = {c.kind, id};
            request.expect.session = "s";
            GuardResult r = guard.act(request);
            BOOST_TEST(to_string(r.outcome) == to_string(c.expected));
            const bool exists = c.kind == ObjectKind::network ? engine.has_network(full_a) : engine.has_volume("data");
            BOOST_TEST(!exists == c.removed);
            if (c.expected == Outcome::failed) BOOST_TEST(!r.error.empty());
            BOOST_TEST(records.all.empty());
        }
    }
}

BOOST_AUTO_TEST_CASE(an_attached_network_gets_no_call_and_unowned_ones_are_refused_and_logged) {
    FakeEngine engine;
    Records records;
    Guard guard(engine, default_labels, records.sink());
    engine.add_network(full_a, {{"reaperd.session", "s"}}, {full_b});
    engine.add_network(full_b, {});
    engine.add_volume("plain", {});
    engine.add_volume("theirs", {{"reaperd.session", "t"}});
    GuardResult attached = guard.act(remove_network(full_a, {"s", false}));
    BOOST_TEST(to_string(attached.outcome) == "failed");
    BOOST_TEST(attached.error == "still attached to 1 container");
    BOOST_TEST(to_string(guard.act(remove_network(full_b, {"s", false})).outcome) == "refused_not_owned");
    BOOST_TEST(to_string(guard.act(remove_volume("plain", {"s", false})).outcome) == "refused_not_owned");
    BOOST_TEST(to_string(guard.act(remove_volume("theirs", {"s", false})).outcome) == "refused_other_session");
    BOOST_TEST(engine.destructive_calls().empty());
    BOOST_TEST(records.with("ACTION", "refused") == 3u);
    BOOST_TEST(records.with("NETWORK_ID", full_b) == 1u);
    BOOST_TEST(records.with("VOLUME_NAME", "theirs") == 1u);

    engine.detach_all(full_a);
    guard.configure(dry);
    BOOST_TEST(to_string(guard.act(remove_network(full_a, {"s", false})).outcome) == "dry_run");
    BOOST_TEST(records.with("ACTION", "would_remove") == 1u);
    BOOST_TEST(engine.destructive_calls().empty());
    guard.configure(default_labels);
    BOOST_TEST(to_string(guard.act(remove_network(full_a, {"s", false})).outcome) == "acted");
    BOOST_TEST((engine.destructive_calls() == std::vector<std::string>{full_a}));
}
