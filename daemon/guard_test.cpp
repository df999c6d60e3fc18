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
using reaperd::test::FakeEngine;
using reaperd::test::Fault;

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
            BOOST_TEST(guard.counts()[std::string(to_string(c.expected))] == 1u);
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

BOOST_AUTO_TEST_CASE(a_reload_reaches_the_next_act) {
    FakeEngine engine;
    Records records;
    Guard guard(engine, default_labels, records.sink());
    engine.add(full_a, {{"reaperd.session", "s"}});
    guard.configure(dry);
    BOOST_TEST(to_string(guard.act(request(full_a)).outcome) == "dry_run");
    BOOST_TEST(records.with("ACTION", "would-remove") == 1u);
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
