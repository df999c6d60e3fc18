// Session against a real private engine.
#include <reaper/session.hpp>

#include "control_server.hpp"
#include "daemon_fixture.hpp"
#include "engine.hpp"
#include "session_fixture.hpp"

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <mutex>
#include <thread>

using namespace reaper;
using namespace std::chrono_literals;

using namespace session_itest;

BOOST_FIXTURE_TEST_CASE(missing_image_create_fails, Fixture) {
    auto spec = sleeper();
    spec.image = "reaper-test/no-such-image:latest";
    Session session(options());
    BOOST_CHECK_THROW(session.create(spec), NotFound);
    BOOST_TEST(record->close_calls == 1);
    BOOST_TEST(record->connections_after_close == 0u);
    BOOST_TEST(!session.is_open());
    BOOST_TEST(containers_of(session.id()).empty());
}

// Tools under one `reaperctl run S` share S ($REAPERD_SESSION): when a second Session with
// that id fails to create (a missing image), the first one's running container stays.
BOOST_FIXTURE_TEST_CASE(failed_create_leaves_a_sibling_sessions_container, Fixture) {
    auto o = options();
    o.session_id = test::unique_name("shared");
    Session first(o);
    first.create(sleeper());
    auto missing = sleeper();
    missing.image = "reaper-test/no-such-image:latest";
    Session second(o);
    BOOST_CHECK_THROW(second.create(missing), NotFound);
    BOOST_TEST(exists(first.container_id()));
    BOOST_TEST(observer.inspect(first.container_id()).state.running);
    BOOST_TEST(containers_of(o.session_id).size() == 1u);
    BOOST_TEST(to_string(first.close().container) == "removed");
}

BOOST_FIXTURE_TEST_CASE(container_exiting_at_once_is_removed, Fixture) {
    auto spec = sleeper();
    spec.cmd = {"sh", "-c", "exit 7"};
    Session session(options());
    try {
        session.create(spec);
        BOOST_FAIL("opened a container that exited");
    } catch (const NotReady& e) {
        BOOST_TEST_MESSAGE(e.what());
    }
    BOOST_TEST(record->close_calls == 1);
    BOOST_TEST(!session.is_open());
    BOOST_TEST(containers_of(session.id()).empty());
    BOOST_TEST(to_string(session.teardown_result()->container) == "removed");
}

BOOST_FIXTURE_TEST_CASE(created_container_has_label_and_log_caps, Fixture) {
    Session session(options());
    session.create(sleeper());
    auto info = observer.inspect(session.container_id());
    BOOST_TEST(info.labels.at(label_key) == session.id());
    BOOST_TEST(info.log_driver == "json-file");
    BOOST_TEST(info.log_options.at("max-size") == "536870912");  // half of the default 1 GiB cap
    BOOST_TEST(info.log_options.at("max-file") == "2");
    BOOST_TEST(info.state.running);
}

BOOST_FIXTURE_TEST_CASE(delete_of_running_container_409_then_force, Fixture) {
    Session session(options());
    session.create(sleeper());
    auto id = session.container_id();
    auto result = session.close();
    BOOST_TEST(to_string(result.container) == "removed");
    BOOST_TEST(result.forced);
    std::vector<std::string> removes;
    {
        std::lock_guard lock(record->mutex);
        removes = record->removes;
    }
    BOOST_REQUIRE(removes.size() >= 2u);
    BOOST_TEST(removes.front() == "force=0 conflict");
    BOOST_TEST(removes.back() == "force=1 ok");
    BOOST_TEST(!exists(id));
    BOOST_TEST(record->close_calls == 1);
    BOOST_TEST(record->connections_after_close == 0u);
}

BOOST_FIXTURE_TEST_CASE(delete_on_exit_off_keeps_container, Fixture) {
    auto o = options();
    o.delete_on_exit = false;
    std::string id;
    {
        Session session(o);
        session.create(sleeper());
        id = session.container_id();
    }
    BOOST_TEST(record->close_calls == 1);
    BOOST_TEST(record->connections_after_close == 0u);
    BOOST_TEST(exists(id));
    BOOST_TEST(observer.inspect(id).state.running);
    observer.remove(id, {.force = true});
}

BOOST_FIXTURE_TEST_CASE(readiness_probe_waits, Fixture) {
    auto spec = sleeper();
    spec.cmd = {"sh", "-c", "sleep 1; touch /tmp/ready; exec sleep 3600"};
    auto o = options();
    o.readiness_probe = {"test", "-e", "/tmp/ready"};
    Session session(o);
    auto started = std::chrono::steady_clock::now();
    session.create(spec);
    BOOST_TEST((std::chrono::steady_clock::now() - started >= 1s));
    BOOST_TEST(session.engine().exec(session.container_id(), {"test", "-e", "/tmp/ready"}, 10s) == 0);
}

BOOST_FIXTURE_TEST_CASE(healthcheck_waits_for_healthy, Fixture) {
    auto spec = sleeper();
    spec.healthcheck_cmd = {"true"};
    spec.healthcheck_interval = 200ms;
    Session session(options());
    session.create(spec);
    auto info = observer.inspect(session.container_id());
    BOOST_TEST(info.has_healthcheck);
    BOOST_TEST(info.state.health_status == "healthy");
}

BOOST_FIXTURE_TEST_CASE(attach_by_name_never_removes, Fixture) {
    auto spec = sleeper();
    spec.name = test::unique_name("attach");
    auto id = observer.create(spec);
    observer.start(id);
    {
        Session session(options());
        session.attach(spec.name);
        BOOST_TEST(session.container_id() == id);
        BOOST_TEST(to_string(session.close().container) == "kept");
    }
    {
        auto o = options();
        o.readiness_probe = {"false"};
        o.ready_timeout = 500ms;
        Session session(o);
        BOOST_CHECK_THROW(session.attach(id), NotReady);
    }
    BOOST_TEST(record->close_calls == 2);
    BOOST_TEST(exists(id));
    observer.remove(id, {.force = true});
}

BOOST_FIXTURE_TEST_CASE(template_from_yaml_against_engine, Fixture) {
    auto library = TemplateLibrary::parse(std::string("templates:\n  box:\n    image: ") + test::PrivateEngine::image +
                                          "\n    command: [sleep, \"3600\"]\n    env: {MODE: test}\n"
                                          "    limits: {memory: 64m, pids: 50}\n"
                                          "    readiness: {command: [sh, -c, 'test \"$MODE\" = test']}\n");
    Session session(options());
    session.create_from_template(library, "box");
    auto info = observer.inspect(session.container_id());
    BOOST_TEST(info.labels.at(label_key) == session.id());
}


namespace {

// The daemon's side, as far as these tests need it: records what the control server reports.
struct RecordingHandler final : reaperd::ControlHandler {
    std::mutex mutex;
    std::map<std::string, int> live_leases;
    std::vector<std::pair<std::string, std::string>> orphans;  // container, session

    void lease_opened(const std::string& session, std::uint64_t) override {
        std::lock_guard lock(mutex);
        ++live_leases[session];
    }
    void lease_closed(const std::string& session, std::uint64_t) override {
        std::lock_guard lock(mutex);
        --live_leases[session];
    }
    reaper::control::Reply end_session(const std::string&) override { return {}; }
    reaper::control::Reply orphan_reported(const std::string& container, const std::string& session) override {
        std::lock_guard lock(mutex);
        orphans.emplace_back(container, session);
        return {};
    }
    std::string status_json(const reaper::control::StatusQuery&) override { return "{}"; }
    std::string metrics_text() override { return ""; }
    int leases(const std::string& session) {
        std::lock_guard lock(mutex);
        return live_leases[session];
    }
};

}  // namespace

// With the daemon's real control server: the lease is held while the session lives, and a
// container that cannot be removed is reported as an orphan before the lease goes.
BOOST_FIXTURE_TEST_CASE(lease_held_and_orphan_reported_to_control_server, Fixture) {
    RecordingHandler handler;
    reaperd::ControlConfig config;
    config.socket = test::engine().dir() + "/reaperd-control.sock";
    reaperd::ControlServer server(config, handler);
    server.start();

    auto o = options();
    o.use_daemon = true;
    o.control_socket = config.socket;
    o.teardown_budget = 1s;
    Session session(o);
    session.create(sleeper());
    auto id = session.container_id();
    BOOST_TEST(session.holds_lease());
    BOOST_TEST(reaper::test::eventually([&] { return handler.leases(session.id()) == 1; }, 10s));

    record->fail_removes = true;
    auto result = session.close();
    BOOST_TEST(to_string(result.container) == "orphaned");
    BOOST_TEST(result.orphan_reported);
    BOOST_TEST(reaper::test::eventually([&] { return handler.leases(session.id()) == 0; }, 10s));
    {
        std::lock_guard lock(handler.mutex);
        BOOST_REQUIRE(handler.orphans.size() == 1u);
        BOOST_TEST(handler.orphans[0].first == id);
        BOOST_TEST(handler.orphans[0].second == session.id());
    }
    BOOST_TEST(record->close_calls == 1);
    BOOST_TEST(exists(id));  // the daemon would reap it; here the test does
    observer.remove(id, {.force = true});
}

// With the real reaperd: the daemon sees the session's lease while it lives and does not reap
// its container past the lease grace; a container the session cannot remove is reported as an
// orphan and the daemon reaps it.
BOOST_FIXTURE_TEST_CASE(real_reaperd_lease_and_orphan_reap, Fixture) {
    reaperd::itest::Reaperd daemon;  // lease_grace 2s
    daemon.start();

    auto o = options();
    o.label_key = "reaperd.session";  // the daemon's default key
    o.use_daemon = true;
    o.control_socket = daemon.socket;
    o.teardown_budget = 1s;
    Session session(o);
    session.create(sleeper());
    auto id = session.container_id();
    BOOST_TEST(session.holds_lease());
    BOOST_TEST(reaperd::itest::eventually([&] { return daemon.session_state(session.id()) == "leased"; }));
    BOOST_TEST(reaperd::itest::eventually([&] { return daemon.containers_of(session.id()) == 1; }));
    std::this_thread::sleep_for(3s);  // past the lease grace: a held lease keeps it alive
    BOOST_TEST(exists(id));
    BOOST_TEST(session.holds_lease());

    record->fail_removes = true;
    auto result = session.close();
    BOOST_TEST(to_string(result.container) == "orphaned");
    BOOST_TEST(result.orphan_reported);
    BOOST_TEST(record->close_calls == 1);
    BOOST_CHECK_MESSAGE(reaperd::itest::eventually([&] { return !exists(id); }),
                        "reaperd did not reap the orphan; its log:\n" << daemon.log_text());
}
