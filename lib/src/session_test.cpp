#include <reaper/session.hpp>

#include "captured_stderr.hpp"
#include "eventually.hpp"
#include "fake_control_server.hpp"
#include "fake_engine.hpp"

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

using namespace reaper;
using reaper::test::FakeControlServer;
using reaper::test::FakeEngine;
using namespace std::chrono_literals;
using reaper::test::eventually;

namespace {

struct Fixture {
    FakeEngine fake;
    std::shared_ptr<std::vector<LogRecord>> logs = std::make_shared<std::vector<LogRecord>>();
    std::shared_ptr<int> factory_calls = std::make_shared<int>(0);

    SessionOptions options() {
        SessionOptions o;
        o.engine_factory = [fake = &fake, calls = factory_calls]() -> std::unique_ptr<Engine> {
            ++*calls;
            return fake->connection();
        };
        o.use_daemon = false;
        o.ready_timeout = 2s;
        o.ready_poll_interval = 5ms;
        o.ready_settle = 20ms;
        o.teardown_budget = 300ms;
        o.log = [logs = logs](const LogRecord& r) { logs->push_back(r); };
        return o;
    }
    ContainerSpec spec() {
        ContainerSpec s;
        s.image = "busybox";
        s.cmd = {"sleep", "3600"};
        return s;
    }
    bool logged(LogLevel level, const std::string& part) const {
        for (const auto& r : *logs)
            if (r.level == level && r.message.find(part) != std::string::npos) return true;
        return false;
    }
};

// Asserts the state every failed open must leave behind.
void check_cleared(Session& session, const FakeEngine& fake) {
    BOOST_TEST(fake.close_calls() == 1);
    BOOST_TEST(!session.is_open());
    BOOST_TEST(session.container_id().empty());
    BOOST_TEST(!session.holds_lease());
    BOOST_CHECK_THROW(session.engine(), std::logic_error);
    // The object is spent: closing again changes nothing and a second open is refused.
    session.close();
    BOOST_TEST(fake.close_calls() == 1);
}

template <class Error, class F>
void check_original(F open, const std::string& message) {
    try {
        open();
        BOOST_FAIL("open did not throw");
    } catch (const Error& e) {
        BOOST_TEST(typeid(e).name() == typeid(Error).name());
        BOOST_TEST(std::string(e.what()) == message);
    }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(opening)

BOOST_FIXTURE_TEST_CASE(create_labels_caps_and_teardown, Fixture) {
    Session session(options());
    session.create(spec());
    BOOST_TEST(session.is_open());
    BOOST_TEST(session.created_container());
    BOOST_TEST(session.delete_on_exit());
    BOOST_TEST(*factory_calls == 1);
    auto created = fake.spec(session.container_id());
    BOOST_TEST(created.labels.at("reaperd.session") == session.id());
    BOOST_TEST(created.log_config.type == "json-file");
    BOOST_TEST(created.log_config.options.at("max-size") == "536870912");
    BOOST_TEST(created.log_config.options.at("max-file") == "2");
    BOOST_TEST(created.network_mode == "none");
    const auto& marker = created.labels.at(open_marker_label);
    BOOST_TEST(marker.size() == 32u);  // 128 bits in hex
    BOOST_TEST(marker.find_first_not_of("0123456789abcdef") == std::string::npos);

    auto id = session.container_id();
    fake.stop(id, 0s);  // stopped: a plain delete suffices
    auto result = session.close();
    BOOST_TEST(to_string(result.container) == "removed");
    BOOST_TEST(result.container_id == id);
    BOOST_TEST(!result.forced);
    BOOST_TEST(fake.close_calls() == 1);
    BOOST_TEST(!fake.exists(id));
    BOOST_TEST(fake.removes(false) == 1);
    BOOST_TEST(fake.calls("kill") == 0);

    auto again = session.close();
    BOOST_TEST(to_string(again.container) == "removed");
    BOOST_TEST(fake.close_calls() == 1);
}

BOOST_FIXTURE_TEST_CASE(custom_label_key_and_session_id, Fixture) {
    auto o = options();
    o.session_id = "build-42";
    o.label_key = "example.owner";
    Session session(o);
    session.create(spec());
    BOOST_TEST(fake.spec(session.container_id()).labels.at("example.owner") == "build-42");
}

// Docker's own rotation within the cap (reaper/log_rotation.hpp): max-size = half the cap in
// plain bytes, max-file = 2; a spec that sets either keeps all its log options as given.
BOOST_FIXTURE_TEST_CASE(log_rotation_at_creation, Fixture) {
    struct Row {
        const char* what;
        std::string driver;
        std::map<std::string, std::string> own;
        std::map<std::string, std::string> labels;
        std::optional<std::uint64_t> cap;
        bool rotate;
        std::map<std::string, std::string> expected;
    };
    const std::vector<Row> rows{
        {"default cap (reaperd's default logs.max_size, 1 GiB)", "", {}, {}, std::nullopt, true,
         {{"max-size", "536870912"}, {"max-file", "2"}}},
        {"a cap of 2 MiB", "", {}, {}, 2 * 1024 * 1024, true, {{"max-size", "1048576"}, {"max-file", "2"}}},
        {"local driver", "local", {}, {}, 2 * 1024 * 1024, true, {{"max-size", "1048576"}, {"max-file", "2"}}},
        {"own max-size kept, no max-file added", "json-file", {{"max-size", "5m"}}, {}, 2 * 1024 * 1024, true,
         {{"max-size", "5m"}}},
        {"own max-file kept, no max-size added", "json-file", {{"max-file", "7"}}, {}, 2 * 1024 * 1024, true,
         {{"max-file", "7"}}},
        {"other own options stay beside", "local", {{"compress", "false"}}, {}, 4000, true,
         {{"compress", "false"}, {"max-size", "2000"}, {"max-file", "2"}}},
        {"the label's cap, decimal as reaperd reads it", "", {}, {{"reaperd.log-max-size", "10m"}},
         2 * 1024 * 1024, true, {{"max-size", "5000000"}, {"max-file", "2"}}},
        {"a label exempting the container", "", {}, {{"reaperd.log-max-size", "0"}}, std::nullopt, true, {}},
        {"a label that does not parse: the cap", "", {}, {{"reaperd.log-max-size", "lots"}}, 4000, true,
         {{"max-size", "2000"}, {"max-file", "2"}}},
        {"caps off", "", {}, {}, 0, true, {}},
        {"rotation off", "", {}, {}, std::nullopt, false, {}},
        {"a driver that rotates nothing", "journald", {}, {}, std::nullopt, true, {}},
    };
    for (const auto& row : rows) {
        BOOST_TEST_CONTEXT(row.what) {
            FakeEngine engine;
            auto o = options();
            o.engine_factory = [&engine] { return engine.connection(); };
            o.log_cap_bytes = row.cap;
            o.rotate_logs = row.rotate;
            Session session(o);
            auto s = spec();
            s.log_config.type = row.driver;
            s.log_config.options = row.own;
            s.labels.insert(row.labels.begin(), row.labels.end());
            session.create(s);
            const auto created = engine.spec(session.container_id());
            BOOST_TEST(created.log_config.type == (row.driver.empty() ? "json-file" : row.driver));
            BOOST_TEST((created.log_config.options == row.expected));
        }
    }
}

BOOST_FIXTURE_TEST_CASE(other_log_drivers_are_left_alone, Fixture) {
    Session session(options());
    auto s = spec();
    s.log_config.type = "none";
    session.create(s);
    BOOST_TEST(fake.spec(session.container_id()).log_config.options.empty());
}

BOOST_FIXTURE_TEST_CASE(bad_input_fails_before_acquiring_anything, Fixture) {
    {
        Session session(options());
        auto s = spec();
        s.labels["reaperd.session"] = "someone-else";
        BOOST_CHECK_THROW(session.create(s), std::invalid_argument);
    }
    {
        Session session(options());
        BOOST_CHECK_THROW(session.create(ContainerSpec{}), std::invalid_argument);
    }
    {
        Session session(options());
        BOOST_CHECK_THROW(session.create_from_template(TemplateLibrary{}, "nope"), std::out_of_range);
    }
    auto o = options();
    o.session_id = "has space";
    BOOST_CHECK_THROW(Session{o}, std::invalid_argument);
    BOOST_TEST(*factory_calls == 0);
    BOOST_TEST(fake.calls().empty());
}

BOOST_FIXTURE_TEST_CASE(a_session_opens_once, Fixture) {
    Session session(options());
    session.create(spec());
    BOOST_CHECK_THROW(session.create(spec()), std::logic_error);
    session.close();
    BOOST_CHECK_THROW(session.attach("x"), std::logic_error);
    BOOST_TEST(*factory_calls == 1);
}

BOOST_FIXTURE_TEST_CASE(waits_for_health_and_probe, Fixture) {
    fake.set_health("starting");
    fake.script_exec({1, 1, 0});
    auto o = options();
    o.readiness_probe = {"test", "-e", "/ready"};
    Session session(o);
    std::thread healer([this] {
        // Healthy once the session waits for it: a second look means the first, "starting",
        // was answered.
        eventually([this] { return fake.calls("inspect") >= 2; });
        fake.update_containers([](ContainerInfo& c) { c.state.health_status = "healthy"; });
    });
    session.create(spec());
    healer.join();
    BOOST_TEST(fake.calls("exec") == 3);
    BOOST_TEST(session.is_open());
}

BOOST_FIXTURE_TEST_CASE(template_create_uses_its_probe, Fixture) {
    SessionTemplate tmpl;
    tmpl.name = "sandbox";
    tmpl.spec = spec();
    tmpl.spec.name = "ignored";
    tmpl.readiness_probe = {"true"};
    TemplateLibrary library;
    library.add(tmpl);
    Session session(options());
    session.create_from_template(library, "sandbox");
    BOOST_TEST(fake.calls("exec") == 1);
    BOOST_TEST(fake.spec(session.container_id()).name.empty());
}

BOOST_FIXTURE_TEST_CASE(attach_by_name_keeps_the_container, Fixture) {
    auto id = fake.add_running("existing");
    Session session(options());
    session.attach("existing");
    BOOST_TEST(session.container_id() == id);
    BOOST_TEST(!session.created_container());
    BOOST_TEST(!session.delete_on_exit());
    auto result = session.close();
    BOOST_TEST(to_string(result.container) == "kept");
    BOOST_TEST(fake.exists(id));
    BOOST_TEST(fake.calls("remove") == 0);
    BOOST_TEST(fake.close_calls() == 1);
}

BOOST_FIXTURE_TEST_CASE(attach_deleted_when_asked, Fixture) {
    auto id = fake.add_running("existing");
    Session session(options());
    session.attach(id);
    session.set_delete_on_exit(true);
    BOOST_TEST(to_string(session.close().container) == "removed");
    BOOST_TEST(!fake.exists(id));
}

BOOST_AUTO_TEST_SUITE_END()

// ---- fault injection: failures while opening ----------------------------------------------
BOOST_AUTO_TEST_SUITE(failed_open)

BOOST_FIXTURE_TEST_CASE(create_fails, Fixture) {
    fake.before("create", [] { throw ServerError(500, "boom", "create: 500 boom"); });
    Session session(options());
    check_original<ServerError>([&] { session.create(spec()); }, "create: 500 boom");
    check_cleared(session, fake);
    BOOST_TEST(fake.container_count() == 0u);
    BOOST_TEST(to_string(session.teardown_result()->container) == "none");
}

// The request reached the engine, which made the container, but the answer was lost. The
// cleanup finds it by this open's marker and removes it alone: containers of other Sessions
// under the same session id (with another marker, or none) stay, like any other.
BOOST_FIXTURE_TEST_CASE(create_answer_lost_removes_only_the_container_with_its_marker, Fixture) {
    auto o = options();
    o.session_id = "shared";
    const auto sibling = fake.add_running(
        "sibling", {{"reaperd.session", "shared"}, {open_marker_label, std::string(32, 'a')}});
    const auto unmarked = fake.add_running("unmarked", {{"reaperd.session", "shared"}});
    const auto other = fake.add_running("other", {{"reaperd.session", "another-session"}});
    fake.lose_create_answers(1);
    Session session(o);
    check_original<Timeout>([&] { session.create(spec()); }, "create: timed out");
    check_cleared(session, fake);
    const auto& result = *session.teardown_result();
    BOOST_TEST(to_string(result.container) == "removed");
    BOOST_TEST(!result.container_id.empty());
    BOOST_TEST(!fake.exists(result.container_id));
    BOOST_TEST(fake.calls("remove") == 1);
    BOOST_TEST(fake.calls("kill") == 1);
    BOOST_TEST(fake.container_count() == 3u);
    for (const auto& id : {sibling, unmarked, other}) {
        BOOST_TEST(fake.exists(id));
        BOOST_TEST(fake.container(id).state.running);
    }
}

// Tools under one `reaperctl run S` share S: a second Session with that id whose create fails
// (a missing image) must leave the first one's running container alone.
BOOST_FIXTURE_TEST_CASE(failed_create_leaves_a_sibling_sessions_container, Fixture) {
    auto o = options();
    o.session_id = "shared";
    Session first(o);
    first.create(spec());
    fake.before("create",
                [] { throw NotFound(404, "No such image: nope:latest", "create: 404 No such image: nope:latest"); });
    Session second(o);
    check_original<NotFound>([&] { second.create(spec()); }, "create: 404 No such image: nope:latest");
    check_cleared(second, fake);
    BOOST_TEST(to_string(second.teardown_result()->container) == "none");
    BOOST_TEST(fake.exists(first.container_id()));
    BOOST_TEST(fake.container(first.container_id()).state.running);
    BOOST_TEST(fake.calls("remove") == 0);
    BOOST_TEST(fake.calls("kill") == 0);
}

BOOST_FIXTURE_TEST_CASE(template_create_fails, Fixture) {
    fake.before("create",
                [] { throw NotFound(404, "No such image: nope:latest", "create: 404 No such image: nope:latest"); });
    SessionTemplate tmpl;
    tmpl.name = "t";
    tmpl.spec.image = "nope:latest";
    TemplateLibrary library;
    library.add(tmpl);
    Session session(options());
    check_original<NotFound>([&] { session.create_from_template(library, "t"); },
                             "create: 404 No such image: nope:latest");
    check_cleared(session, fake);
    BOOST_TEST(fake.container_count() == 0u);
}

BOOST_FIXTURE_TEST_CASE(start_fails_created_container_force_removed, Fixture) {
    fake.before("start", [] { throw ServerError(500, "oci runtime", "start: 500 oci runtime"); });
    Session session(options());
    check_original<ServerError>([&] { session.create(spec()); }, "start: 500 oci runtime");
    check_cleared(session, fake);
    BOOST_TEST(fake.container_count() == 0u);
    BOOST_TEST(fake.removes(true) == 1);
    BOOST_TEST(fake.removes(false) == 0);
    BOOST_TEST(session.teardown_result()->forced);
}

BOOST_FIXTURE_TEST_CASE(readiness_of_new_container_exited, Fixture) {
    fake.exit_at_start(3);
    Session session(options());
    try {
        session.create(spec());
        BOOST_FAIL("no throw");
    } catch (const NotReady& e) {
        BOOST_TEST(std::string(e.what()).find("exit code 3") != std::string::npos);
    }
    check_cleared(session, fake);
    BOOST_TEST(fake.container_count() == 0u);
    BOOST_TEST(to_string(session.teardown_result()->container) == "removed");
}

BOOST_FIXTURE_TEST_CASE(readiness_of_new_container_dies_while_settling, Fixture) {
    auto o = options();
    o.ready_settle = 200ms;
    fake.before("inspect", [] {});
    fake.before("inspect", [this] {
        fake.update_containers([](ContainerInfo& c) {
            c.state.running = false;
            c.state.status = "exited";
            c.state.exit_code = 1;
        });
    });
    Session session(o);
    BOOST_CHECK_THROW(session.create(spec()), NotReady);
    check_cleared(session, fake);
    BOOST_TEST(fake.container_count() == 0u);
}

BOOST_FIXTURE_TEST_CASE(readiness_of_new_container_times_out, Fixture) {
    fake.script_exec({}, 1);
    auto o = options();
    o.readiness_probe = {"false"};
    o.ready_timeout = 100ms;
    Session session(o);
    auto started = std::chrono::steady_clock::now();
    BOOST_CHECK_THROW(session.create(spec()), NotReady);
    BOOST_TEST((std::chrono::steady_clock::now() - started < 5s));
    check_cleared(session, fake);
    BOOST_TEST(fake.container_count() == 0u);
}

BOOST_FIXTURE_TEST_CASE(readiness_of_new_container_unhealthy, Fixture) {
    fake.set_health("unhealthy");
    Session session(options());
    BOOST_CHECK_THROW(session.create(spec()), NotReady);
    check_cleared(session, fake);
    BOOST_TEST(fake.container_count() == 0u);
}

BOOST_FIXTURE_TEST_CASE(attach_fails, Fixture) {
    Session session(options());
    check_original<NotFound>([&] { session.attach("missing"); }, "missing");  // the fake's what(): the reference
    check_cleared(session, fake);
    BOOST_TEST(fake.calls("remove") == 0);
    BOOST_TEST(to_string(session.teardown_result()->container) == "none");
}

BOOST_FIXTURE_TEST_CASE(readiness_of_attached_container_fails, Fixture) {
    auto id = fake.add_running("existing");
    fake.before_every("exec", [] { throw ServerError(500, "exec failed", "exec: 500 exec failed"); });
    auto o = options();
    o.readiness_probe = {"true"};
    o.delete_on_exit = true;  // even then a failed open never removes an attached container
    Session session(o);
    check_original<ServerError>([&] { session.attach("existing"); }, "exec: 500 exec failed");
    check_cleared(session, fake);
    BOOST_TEST(fake.exists(id));
    BOOST_TEST(fake.calls("remove") == 0);
    BOOST_TEST(fake.calls("kill") == 0);
}

BOOST_FIXTURE_TEST_CASE(attached_container_not_running, Fixture) {
    auto id = fake.add_running("existing");
    fake.update_containers([](ContainerInfo& c) {
        c.state.running = false;
        c.state.status = "exited";
    });
    Session session(options());
    BOOST_CHECK_THROW(session.attach(id), NotReady);
    check_cleared(session, fake);
    BOOST_TEST(fake.exists(id));
}

// The cleanup fails too: the original exception still comes out, the cleanup failure is
// logged and kept.
BOOST_FIXTURE_TEST_CASE(cleanup_failure_never_replaces_the_original, Fixture) {
    fake.before("start", [] { throw std::domain_error("original failure"); });
    fake.before_every("remove", [] { throw ServerError(500, "driver failed", "remove: 500 driver failed"); });
    Session session(options());
    check_original<std::domain_error>([&] { session.create(spec()); }, "original failure");
    check_cleared(session, fake);
    BOOST_TEST(to_string(session.teardown_result()->container) == "orphaned");
    BOOST_TEST(fake.container_count() == 1u);
    BOOST_REQUIRE(session.last_cleanup_error());
    BOOST_CHECK_THROW(std::rethrow_exception(session.last_cleanup_error()), ServerError);
    BOOST_TEST(logged(LogLevel::Warning, "left behind"));
    bool record_has_error = false;
    for (const auto& r : *logs) record_has_error = record_has_error || (r.level == LogLevel::Warning && r.error);
    BOOST_TEST(record_has_error);
}

BOOST_FIXTURE_TEST_CASE(engine_factory_failure_propagates, Fixture) {
    auto o = options();
    o.engine_factory = []() -> std::unique_ptr<Engine> { throw std::runtime_error("no engine"); };
    Session session(o);
    check_original<std::runtime_error>([&] { session.create(spec()); }, "no engine");
    BOOST_TEST(!session.is_open());
}

BOOST_AUTO_TEST_SUITE_END()

// ---- fault injection: teardown ------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(teardown)

BOOST_FIXTURE_TEST_CASE(delete_409_kills_and_forces, Fixture) {
    Session session(options());
    session.create(spec());
    auto id = session.container_id();
    auto result = session.close();  // the fake answers 409 to a plain delete of a running container
    BOOST_TEST(to_string(result.container) == "removed");
    BOOST_TEST(result.forced);
    BOOST_TEST(!fake.exists(id));
    BOOST_TEST(fake.removes(false) == 1);
    BOOST_TEST(fake.calls("kill") == 1);
    BOOST_TEST(fake.removes(true) == 1);
    BOOST_TEST(fake.close_calls() == 1);
    BOOST_TEST(!session.is_open());
    BOOST_TEST(session.container_id().empty());
}

BOOST_FIXTURE_TEST_CASE(delete_500_retries_with_force, Fixture) {
    Session session(options());
    session.create(spec());
    auto id = session.container_id();
    fake.before("remove", [] { throw ServerError(500, "busy", "remove: 500"); });
    fake.before("remove", [] { throw ServerError(500, "busy", "remove: 500"); });
    auto result = session.close();
    BOOST_TEST(to_string(result.container) == "removed");
    BOOST_TEST(result.forced);
    BOOST_TEST(fake.removes(true) == 2);
    BOOST_TEST(!fake.exists(id));
    BOOST_TEST(fake.close_calls() == 1);
}

BOOST_FIXTURE_TEST_CASE(removal_in_progress_ends_when_it_is_gone, Fixture) {
    Session session(options());
    session.create(spec());
    auto id = session.container_id();
    fake.before_every("remove", [this, id] {
        fake.drop_silently(id);  // the engine's own removal finishes
        throw Conflict(409, "removal of container is already in progress", "remove: 409");
    });
    auto result = session.close();
    BOOST_TEST(to_string(result.container) == "removed");
    BOOST_TEST(fake.close_calls() == 1);
}

BOOST_FIXTURE_TEST_CASE(force_remove_failing_orphans_within_budget, Fixture) {
    auto o = options();
    o.teardown_budget = 400ms;
    Session session(o);
    session.create(spec());
    auto id = session.container_id();
    fake.before_every("remove", [] { throw ServerError(500, "device busy", "remove: 500 device busy"); });
    auto started = std::chrono::steady_clock::now();
    auto result = session.close();
    auto took = std::chrono::steady_clock::now() - started;
    BOOST_TEST(to_string(result.container) == "orphaned");
    BOOST_TEST(!result.orphan_reported);  // no daemon in this test
    BOOST_TEST(result.container_id == id);
    BOOST_TEST(fake.removes(true) >= 2);  // retried
    BOOST_TEST((took < 3s));
    BOOST_TEST(fake.exists(id));
    BOOST_TEST(fake.close_calls() == 1);
    BOOST_TEST(logged(LogLevel::Warning, "left behind"));
    BOOST_CHECK_THROW(std::rethrow_exception(session.last_cleanup_error()), ServerError);
}

// Engine::close() is noexcept by contract, so a close that throws cannot be expressed; the
// nearest fault is a client that is already dead (closed under us): every call fails with
// ClientClosed. Teardown must still finish, close exactly once more, and not throw.
BOOST_FIXTURE_TEST_CASE(client_close_failing_and_dead_client, Fixture) {
    Session session(options());
    session.create(spec());
    fake.close();
    auto result = session.close();
    BOOST_TEST(to_string(result.container) == "orphaned");
    BOOST_TEST(fake.close_calls() == 1);
    BOOST_TEST(!session.is_open());
}

BOOST_FIXTURE_TEST_CASE(delete_on_exit_off_keeps_container_closes_client, Fixture) {
    auto o = options();
    o.delete_on_exit = false;
    Session session(o);
    session.create(spec());
    auto id = session.container_id();
    auto result = session.close();
    BOOST_TEST(to_string(result.container) == "kept");
    BOOST_TEST(fake.exists(id));
    BOOST_TEST(fake.calls("remove") == 0);
    BOOST_TEST(fake.close_calls() == 1);
}

BOOST_FIXTURE_TEST_CASE(destructor_tears_down, Fixture) {
    std::string id;
    {
        Session session(options());
        session.create(spec());
        id = session.container_id();
    }
    BOOST_TEST(!fake.exists(id));
    BOOST_TEST(fake.close_calls() == 1);
}

BOOST_FIXTURE_TEST_CASE(throwing_log_sink_is_contained, Fixture) {
    auto o = options();
    o.log = [](const LogRecord&) { throw std::runtime_error("sink broke"); };
    Session session(o);
    session.create(spec());
    fake.before_every("remove", [] { throw ServerError(500, "x", "remove: 500"); });
    BOOST_TEST(to_string(session.close().container) == "orphaned");
    BOOST_TEST(fake.close_calls() == 1);
}

// A session id, a tool's own label or the engine's error text may hold anything: the default
// sink's line is one line, and cannot drive the terminal it lands on.
BOOST_AUTO_TEST_CASE(stderr_sink_lines_are_terminal_safe) {
    const auto line = reaper::test::captured_stderr([] {
        stderr_log_sink()(LogRecord{LogLevel::Warning, "s\x1b[31m\xc2\x9b", "", "line\nforged", {}});
    });
    BOOST_TEST(line == "reaper: warning: session s\\x1b[31m\\xc2\\x9b: line\\x0aforged\n");
}

BOOST_FIXTURE_TEST_CASE(sessions_in_threads_do_not_disturb_each_other, Fixture) {
    constexpr int threads = 8, per_thread = 4;
    std::vector<std::unique_ptr<FakeEngine>> fakes;
    for (int i = 0; i < threads * per_thread; ++i) fakes.push_back(std::make_unique<FakeEngine>());
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t)
        workers.emplace_back([&, t] {
            for (int i = 0; i < per_thread; ++i) {
                auto& engine = *fakes[t * per_thread + i];
                SessionOptions o;
                o.use_daemon = false;
                o.ready_poll_interval = 1ms;
                o.log = {};
                o.engine_factory = [&engine] { return engine.connection(); };
                if (i % 2) engine.exit_at_start(0);
                Session session(o);
                try {
                    session.create(spec());
                } catch (const NotReady&) {
                }
            }
        });
    for (auto& w : workers) w.join();
    for (auto& engine : fakes) {
        BOOST_TEST(engine->close_calls() == 1);
        BOOST_TEST(engine->container_count() == 0u);
    }
}

BOOST_AUTO_TEST_SUITE_END()

// ---- the daemon link ----------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(daemon_link)

BOOST_FIXTURE_TEST_CASE(lease_held_while_open_and_orphan_reported, Fixture) {
    FakeControlServer server;
    auto o = options();
    o.use_daemon = true;
    o.control_socket = server.socket_path();
    Session session(o);
    session.create(spec());
    auto id = session.container_id();
    BOOST_TEST(session.holds_lease());
    BOOST_TEST(eventually([&] { return server.leases_held(session.id()) == 1; }));

    fake.before_every("remove", [] { throw ServerError(500, "stuck", "remove: 500 stuck"); });
    auto result = session.close();
    BOOST_TEST(to_string(result.container) == "orphaned");
    BOOST_TEST(result.orphan_reported);
    BOOST_TEST(eventually([&] { return server.leases_held(session.id()) == 0; }));
    auto requests = server.requests();
    BOOST_REQUIRE(requests.size() == 2u);
    BOOST_TEST(std::string(control::to_string(requests[0].op)) == "lease");
    BOOST_TEST(requests[0].session == session.id());
    BOOST_TEST(std::string(control::to_string(requests[1].op)) == "orphan");
    BOOST_TEST(requests[1].container == id);
    BOOST_TEST(requests[1].session == session.id());
    BOOST_TEST(fake.close_calls() == 1);
}

// Without a cap of its own, a Session keeps its log within the cap reaperd's lease reply names;
// a reply without one (an older reaperd) leaves the default.
BOOST_FIXTURE_TEST_CASE(rotation_follows_the_cap_in_the_lease_reply, Fixture) {
    for (const auto& [told, expected] : std::vector<std::pair<std::optional<std::uint64_t>, std::string>>{
             {2 * 1024 * 1024, "1048576"}, {std::nullopt, "536870912"}}) {
        FakeEngine engine;
        FakeControlServer server;
        control::Reply reply;
        reply.log_max_size = told;
        server.set_lease_reply(reply);
        auto o = options();
        o.engine_factory = [&engine] { return engine.connection(); };
        o.use_daemon = true;
        o.control_socket = server.socket_path();
        Session session(o);
        session.create(spec());
        BOOST_TEST(engine.spec(session.container_id()).log_config.options.at("max-size") == expected);
    }
}

BOOST_FIXTURE_TEST_CASE(failed_open_releases_the_lease, Fixture) {
    FakeControlServer server;
    auto o = options();
    o.use_daemon = true;
    o.control_socket = server.socket_path();
    fake.exit_at_start(0);
    Session session(o);
    BOOST_CHECK_THROW(session.create(spec()), NotReady);
    BOOST_TEST(eventually([&] { return server.leases_held(session.id()) == 0; }));
    BOOST_TEST(server.requests().size() == 1u);
    check_cleared(session, fake);
}

// reaperd is down when the session opens, appears, then restarts: the session's lease follows
// it, and holds_lease() says where it stands at each moment.
BOOST_FIXTURE_TEST_CASE(lease_taken_when_reaperd_appears_and_again_after_a_restart, Fixture) {
    const auto dir = FakeControlServer::make_temp_dir();
    const auto path = dir + "/control.sock";
    auto o = options();
    o.use_daemon = true;
    o.control_socket = path;
    Session session(o);
    session.create(spec());
    BOOST_TEST(session.is_open());
    BOOST_TEST(!session.holds_lease());
    {
        FakeControlServer daemon(path);
        const auto appeared = std::chrono::steady_clock::now();
        BOOST_TEST(eventually([&] { return session.holds_lease(); }));
        BOOST_TEST_MESSAGE("lease taken "
                           << std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::steady_clock::now() - appeared).count()
                           << " ms after the daemon appeared");
        BOOST_TEST(eventually([&] { return daemon.leases_held(session.id()) == 1; }));
    }  // the daemon stops: every connection is closed
    BOOST_TEST(!session.holds_lease());  // at once: the connection is looked at, not a flag
    {
        FakeControlServer restarted(path);
        BOOST_TEST(eventually([&] { return session.holds_lease(); }));
        BOOST_TEST(eventually([&] { return restarted.leases_held(session.id()) == 1; }));
        session.close();
        BOOST_TEST(!session.holds_lease());
        BOOST_TEST(eventually([&] { return restarted.leases_held(session.id()) == 0; }));
        BOOST_TEST(restarted.requests().size() == 1u);
    }
    // The keeper's thread is gone: reading the records the sink got from it is safe now.
    BOOST_TEST(logged(LogLevel::Info, "working without a lease until it answers"));
    BOOST_TEST(logged(LogLevel::Info, "reaperd closed the lease"));
    BOOST_TEST(logged(LogLevel::Info, "holding a reaperd lease"));
    BOOST_TEST(fake.close_calls() == 1);
    std::filesystem::remove_all(dir);
}

BOOST_FIXTURE_TEST_CASE(no_daemon_works_alone, Fixture) {
    auto o = options();
    o.use_daemon = true;
    o.control_socket = "/nonexistent-reaperd-dir/control.sock";
    Session session(o);
    session.create(spec());
    BOOST_TEST(!session.holds_lease());
    BOOST_TEST(logged(LogLevel::Info, "not reachable"));
    fake.before_every("remove", [] { throw ServerError(500, "stuck", "remove: 500"); });
    auto result = session.close();
    BOOST_TEST(to_string(result.container) == "orphaned");
    BOOST_TEST(!result.orphan_reported);
    BOOST_TEST(fake.close_calls() == 1);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- templates ------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(templates)

BOOST_AUTO_TEST_CASE(parses_every_field) {
    auto library = TemplateLibrary::parse(R"(templates:
  sandbox:
    image: reaper-test/busybox:latest
    command: [sleep, "3600"]
    entrypoint: /bin/sh
    env: {MODE: test}
    labels: {team: infra}
    limits: {memory: 256m, cpus: 0.5, pids: 100}
    log: {driver: json-file, max-size: 1m, max-file: 3}
    healthcheck: {command: ["true"], interval: 1s}
    readiness: {command: [test, -e, /tmp/ready], timeout: 20s}
  small:
    image: busybox
    env: ["A=1", "B=2"]
)");
    BOOST_TEST(library.names() == (std::vector<std::string>{"sandbox", "small"}));
    const auto& t = library.get("sandbox");
    BOOST_TEST(t.spec.image == "reaper-test/busybox:latest");
    BOOST_TEST(t.spec.cmd == (std::vector<std::string>{"sleep", "3600"}));
    BOOST_TEST(t.spec.entrypoint == (std::vector<std::string>{"/bin/sh"}));
    BOOST_TEST(t.spec.env == (std::vector<std::string>{"MODE=test"}));
    BOOST_TEST(t.spec.labels.at("team") == "infra");
    BOOST_TEST(t.spec.memory_bytes == 256 * 1024 * 1024);
    BOOST_TEST(t.spec.nano_cpus == 500'000'000);
    BOOST_TEST(t.spec.pids_limit == 100);
    BOOST_TEST(t.spec.log_config.type == "json-file");
    BOOST_TEST(t.spec.log_config.options.at("max-size") == "1m");
    BOOST_TEST(t.spec.log_config.options.at("max-file") == "3");
    BOOST_TEST(t.spec.healthcheck_cmd == (std::vector<std::string>{"true"}));
    BOOST_TEST(t.spec.healthcheck_interval.count() == 1000);
    BOOST_TEST(t.readiness_probe.size() == 3u);
    BOOST_TEST(t.ready_timeout->count() == 20'000);
    BOOST_TEST(library.get("small").spec.env.size() == 2u);
}

struct BadTemplate {
    const char* text;
    int line;
    const char* says;
};

BOOST_AUTO_TEST_CASE(bad_templates_name_the_line) {
    const BadTemplate cases[] = {
        {"templates:\n  a:\n    image: x\n    imgae: y\n", 4, "unknown key 'imgae'"},
        {"templates:\n  a:\n    command: [x]\n", 2, "has no image"},
        {"templates:\n  a:\n    image: x\n    limits: {memory: lots}\n", 4, "limits.memory"},
        {"templates:\n  a:\n    image: x\n    limits:\n      cpus: -1\n", 5, "limits.cpus"},
        {"templates:\n  a:\n    image: x\n    env: [NOEQUALS]\n", 4, "not KEY=value"},
        {"templates:\n  a:\n    image: [x]\n", 3, "image must be a scalar"},
        {"templates:\n  a:\n    image: x\n    readiness: {timeout: 5}\n", 4, "no unit"},
        {"templates:\n  a:\n    image: x\n    log: {max-size: 10MiBs}\n", 4, "log.max-size"},
        {"templates:\n  a: [\n", 3, ""},
        {"templatez: {}\n", 1, "unknown key 'templatez'"},
        {"templates: [a]\n", 1, "must be a mapping"},
    };
    for (const auto& c : cases) {
        BOOST_TEST_CONTEXT(c.text) {
            try {
                TemplateLibrary::parse(c.text, "t.yaml");
                BOOST_ERROR("no error");
            } catch (const TemplateError& e) {
                BOOST_TEST(e.line() == c.line);
                BOOST_TEST(e.source() == "t.yaml");
                std::string what = e.what();
                BOOST_TEST(what.rfind("t.yaml:" + std::to_string(c.line) + ":", 0) == 0);
                BOOST_TEST(what.find(c.says) != std::string::npos, what);
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(load_file_and_missing_file) {
    auto path = std::filesystem::temp_directory_path() / ("session_test_templates_" + std::to_string(::getpid()) + ".yaml");
    {
        std::ofstream out(path);
        out << "templates:\n  t:\n    image: busybox\n";
    }
    auto library = TemplateLibrary::load_file(path.string());
    BOOST_TEST(library.contains("t"));
    std::filesystem::remove(path);
    BOOST_CHECK_THROW(TemplateLibrary::load_file(path.string()), TemplateError);
}

// Templates read units in the config's grammar (issue 13: they took `m` but not `1h` or
// `MiB`); the grammar itself is table-tested in units_test.
BOOST_AUTO_TEST_CASE(templates_read_the_config_units) {
    auto library = TemplateLibrary::parse(
        "templates:\n  t:\n    image: x\n    limits: {memory: 256MiB}\n"
        "    log: {max-size: 10m}\n"
        "    healthcheck: {command: [\"true\"], interval: 1h}\n"
        "    readiness: {timeout: 1d}\n");
    const auto& t = library.get("t");
    BOOST_TEST(t.spec.memory_bytes == 256 * 1024 * 1024);
    BOOST_TEST(t.spec.log_config.options.at("max-size") == "10m");  // passed on as written
    BOOST_TEST(t.spec.healthcheck_interval.count() == 3'600'000);
    BOOST_TEST(t.ready_timeout->count() == 86'400'000);
}

BOOST_AUTO_TEST_SUITE_END()
