// The engine client against a real, private dockerd: every call, its errors, streams, and
// that closing clients gives every fd back.
#include "engine.hpp"
#include "eventually.hpp"

#include <reaper/client.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <future>
#include <thread>

using namespace reaper;
using namespace std::chrono_literals;
using reaper::test::engine;
using reaper::test::eventually;
using reaper::test::unique_name;
using Clock = std::chrono::steady_clock;

namespace {

ContainerSpec sleeper(const std::string& name, const std::string& seconds = "300") {
    ContainerSpec spec;
    spec.name = name;
    spec.image = test::PrivateEngine::image;
    spec.cmd = {"sleep", seconds};
    spec.labels = {{"reaper.test", "client"}};
    return spec;
}

template <typename Error, typename F>
Error expect_error(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return e;
    } catch (const std::exception& e) {
        BOOST_FAIL(std::string("wrong exception: ") + e.what());
    }
    BOOST_FAIL("no exception");
    throw std::logic_error("unreachable");
}

// Reads events until one matches, or fails after `limit`.
Event expect_event(EventStream& stream, const std::string& id, const std::string& action) {
    for (;;) {
        auto event = stream.next();
        BOOST_REQUIRE_MESSAGE(event, "stream ended before " + action);
        if (event->id == id && event->action == action) return *event;
    }
}

}  // namespace

BOOST_AUTO_TEST_CASE(ping_version_and_negotiation) {
    Client client(engine().client_options());
    client.ping();
    auto version = client.version();
    BOOST_TEST(!version.version.empty());
    BOOST_TEST(!version.api_version.empty());
    auto negotiated = client.api_version();
    BOOST_TEST_MESSAGE("engine " << version.version << " API " << version.api_version << ", negotiated " << negotiated);
    BOOST_TEST(compare_api_versions(negotiated, version.api_version) <= 0);
    BOOST_TEST(compare_api_versions(negotiated, "1.40") >= 0);
}

BOOST_AUTO_TEST_CASE(info_gives_the_engines_data_root) {
    Client client(engine().client_options());
    BOOST_TEST(client.info().docker_root_dir == engine().dir() + "/data");  // the harness's --data-root
}

BOOST_AUTO_TEST_CASE(engine_too_old_for_the_client_is_refused) {
    auto options = engine().client_options();
    options.min_api_version = "9.99";
    options.max_api_version = "9.99";
    Client client(options);
    auto e = expect_error<UnsupportedVersion>([&] { client.list_containers({}); });
    BOOST_TEST(std::string(e.what()).find("this client speaks API 9.99 to 9.99") != std::string::npos, e.what());
}

BOOST_AUTO_TEST_CASE(create_inspect_start_list_with_every_field) {
    Client client(engine().client_options());
    auto name = unique_name("fields");
    auto spec = sleeper(name);
    spec.env = {"A=1", "B=two"};
    spec.labels["reaper.test.extra"] = "x y=z";
    spec.log_config = {"json-file", {{"max-size", "1m"}, {"max-file", "2"}}};
    spec.memory_bytes = 64 * 1024 * 1024;
    spec.pids_limit = 50;
    auto id = client.create(spec);
    auto info = client.inspect(id);
    BOOST_TEST(info.id == id);
    BOOST_TEST(info.name == name);
    BOOST_TEST(info.labels.at("reaper.test.extra") == "x y=z");
    BOOST_TEST(info.log_driver == "json-file");
    BOOST_TEST(info.log_options.at("max-size") == "1m");
    BOOST_TEST(info.state.status == "created");
    BOOST_TEST(!info.state.running);

    client.start(id);
    info = client.inspect(name);  // by name too
    BOOST_TEST(info.state.running);
    BOOST_TEST(info.state.pid > 0);
    BOOST_TEST(!info.log_path.empty());

    auto by_label = client.list_containers({.all = false, .filters = {{"label", {"reaper.test.extra=x y=z"}}}});
    BOOST_REQUIRE_EQUAL(by_label.size(), 1u);
    BOOST_TEST(by_label[0].id == id);
    BOOST_TEST(by_label[0].names.at(0) == name);
    BOOST_TEST(by_label[0].state == "running");
    BOOST_TEST(by_label[0].labels.at("reaper.test") == "client");

    client.stop(id, 1s);
    const auto running_list = [&] { return client.list_containers({.all = false, .filters = {{"name", {name}}}}); };
    if (engine().major_version() < 23) {
        BOOST_TEST(running_list().empty());
    } else {
        // Since 23 the list reads a replica of the containers' state that catches up after
        // the stop has answered: on 26.1 a list right after it still showed "running".
        BOOST_TEST(eventually([&] { return running_list().empty(); }, 5s));
    }
    BOOST_TEST(client.list_containers({.all = true, .filters = {{"name", {name}}}}).size() == 1u);
    client.remove(id, {});
}

BOOST_AUTO_TEST_CASE(delete_running_conflicts_force_succeeds_then_not_found) {
    Client client(engine().client_options());
    auto id = client.create(sleeper(unique_name("conflict")));
    client.start(id);

    auto conflict = expect_error<Conflict>([&] { client.remove(id, {}); });
    BOOST_TEST(conflict.status() == 409);
    BOOST_TEST(conflict.kind() == EngineErrorKind::Conflict);
    BOOST_TEST_MESSAGE("engine said: " << conflict.engine_message());
    // The engine's words, which nothing in reaperd reads (the status is what counts): 20.10
    // says "You cannot remove a running container <id>. Stop the container before
    // attempting removal or force remove", 26.1 and 28.5 "cannot remove container "/<name>":
    // container is running: stop the container before removing or force remove".
    BOOST_TEST(conflict.engine_message().find(engine().major_version() < 23 ? "cannot remove a running container"
                                                                            : "container is running") != std::string::npos);

    client.remove(id, {.force = true, .volumes = true});

    auto gone = expect_error<NotFound>([&] { client.remove(id, {.force = true}); });
    BOOST_TEST(gone.status() == 404);
    BOOST_TEST(gone.engine_message().find("No such container") != std::string::npos);
    expect_error<NotFound>([&] { client.inspect(id); });
}

BOOST_AUTO_TEST_CASE(kill_wait_and_exit_codes) {
    Client client(engine().client_options());
    auto spec = sleeper(unique_name("exit"));
    spec.cmd = {"sh", "-c", "exit 7"};
    auto id = client.create(spec);
    client.start(id);
    BOOST_TEST(client.wait(id, 30s) == 7);
    // Killing a container that is not running is a conflict.
    auto e = expect_error<Conflict>([&] { client.kill(id); });
    BOOST_TEST(e.status() == 409);
    client.remove(id, {});

    auto sleeping = client.create(sleeper(unique_name("kill")));
    client.start(sleeping);
    client.kill(sleeping, "SIGKILL");
    BOOST_TEST(client.wait(sleeping, 30s) == 137);
    client.remove(sleeping, {});
}

// On Docker and on Podman (which reports an exec started detached Running for ever): the
// exec is started attached and its output read to its end.
BOOST_AUTO_TEST_CASE(exec_returns_the_commands_exit_code) {
    Client client(engine().client_options());
    auto id = client.create(sleeper(unique_name("exec")));
    client.start(id);
    BOOST_TEST(client.exec(id, {"true"}, 20s) == 0);
    BOOST_TEST(client.exec(id, {"sh", "-c", "exit 3"}, 20s) == 3);
    // Output on both streams (a few MB), dropped as it comes.
    BOOST_TEST(client.exec(id, {"sh", "-c", "seq 1 300000; seq 1 300000 >&2; exit 4"}, 60s) == 4);
    // A command that outlives its timeout: Timeout, at the deadline.
    auto start = Clock::now();
    auto e = expect_error<Timeout>([&] { client.exec(id, {"sleep", "30"}, 1s); });
    auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    BOOST_TEST_MESSAGE(e.what() << " (after " << took.count() << " ms)");
    BOOST_TEST(took < 10s);
    BOOST_TEST(client.exec(id, {"true"}, 20s) == 0);  // the client goes on
    client.remove(id, {.force = true});
}

BOOST_AUTO_TEST_CASE(missing_image_is_not_found) {
    Client client(engine().client_options());
    auto spec = sleeper(unique_name("noimage"));
    spec.image = "reaper-test/does-not-exist:1";
    auto e = expect_error<NotFound>([&] { client.create(spec); });
    BOOST_TEST(e.status() == 404);
    BOOST_TEST(e.engine_message().find("No such image") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(import_image_from_a_tar_stream) {
    Client client(engine().client_options());
    auto reference = "reaper-test/imported:" + unique_name("t");
    test::import_busybox_image(client, reference);
    auto spec = sleeper(unique_name("imported"));
    spec.image = reference;
    spec.cmd = {"echo", "hi"};
    auto id = client.create(spec);
    client.start(id);
    BOOST_TEST(client.wait(id, 30s) == 0);
    client.remove(id, {});

    std::istringstream not_a_tar("this is not a tarball");
    BOOST_CHECK_THROW(client.import_image(not_a_tar, "reaper-test/broken:1"), EngineError);
}

BOOST_AUTO_TEST_CASE(auto_remove_container_disappears_after_exit) {
    Client client(engine().client_options());
    auto spec = sleeper(unique_name("autorm"));
    spec.cmd = {"true"};
    spec.auto_remove = true;
    auto id = client.create(spec);
    BOOST_TEST(client.inspect(id).auto_remove);
    client.start(id);
    auto deadline = Clock::now() + 30s;
    int server_errors = 0;
    for (;;) {
        try {
            client.inspect(id);
        } catch (const NotFound&) {
            break;
        } catch (const ServerError& e) {
            // Podman 4.3 answers an inspect that races its container's exit with a 500 ("read
            // /proc/<pid>/cgroup: no such process", seen once in CI): asked again, and told.
            BOOST_TEST_MESSAGE("inspect during the exit: " << e.what());
            BOOST_REQUIRE(++server_errors <= 3);
        }
        BOOST_REQUIRE(Clock::now() < deadline);
        std::this_thread::sleep_for(50ms);
    }
}

BOOST_AUTO_TEST_CASE(events_see_create_start_die_destroy_each_within_a_second) {
    Client client(engine().client_options());
    Client events_client(engine().client_options());
    auto stream = events_client.events({.filters = {{"type", {"container"}}, {"label", {"reaper.test=client"}}}});

    auto spec = sleeper(unique_name("events"));
    spec.cmd = {"sleep", "0.3"};
    // Each latency runs from the moment the engine finished the action (the call returned)
    // to the event's arrival: how late the stream is, not how slow the engine is.
    auto id = client.create(spec);
    auto t0 = Clock::now();
    expect_event(*stream, id, "create");
    BOOST_TEST((Clock::now() - t0) < 1s);

    client.start(id);
    t0 = Clock::now();
    expect_event(*stream, id, "start");
    BOOST_TEST((Clock::now() - t0) < 1s);

    BOOST_TEST(client.wait(id, 30s) == 0);
    t0 = Clock::now();
    auto die = expect_event(*stream, id, "die");
    BOOST_TEST((Clock::now() - t0) < 1s);
    BOOST_TEST(die.attributes.at("exitCode") == "0");
    BOOST_TEST(die.attributes.at("reaper.test") == "client");

    client.remove(id, {});
    t0 = Clock::now();
    expect_event(*stream, id, "destroy");
    BOOST_TEST((Clock::now() - t0) < 1s);
}

BOOST_AUTO_TEST_CASE(events_with_until_end_normally) {
    Client client(engine().client_options());
    auto now = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch());
    auto stream = client.events({.filters = {}, .since = now.count() - 60, .until = now.count() + 1});
    auto deadline = Clock::now() + 10s;
    while (stream->next()) BOOST_REQUIRE(Clock::now() < deadline);
}

BOOST_AUTO_TEST_CASE(cancelling_a_blocked_events_read_returns_within_100ms) {
    Client client(engine().client_options());
    std::vector<double> latencies_ms;
    for (int i = 0; i < 5; ++i) {
        auto stream = client.events({.filters = {{"label", {"reaper.test=nothing-ever"}}}});
        auto reader = std::async(std::launch::async, [&] { return stream->next(); });
        BOOST_REQUIRE(reader.wait_for(200ms) == std::future_status::timeout);  // really blocked
        auto t0 = Clock::now();
        stream->cancel();
        BOOST_REQUIRE(reader.wait_for(5s) == std::future_status::ready);
        latencies_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        BOOST_TEST(!reader.get().has_value());
    }
    std::sort(latencies_ms.begin(), latencies_ms.end());
    BOOST_TEST_MESSAGE("cancel latency median " << latencies_ms[2] << " ms, max " << latencies_ms[4] << " ms");
    BOOST_TEST(latencies_ms[2] < 100.0);
}

BOOST_AUTO_TEST_CASE(close_ends_streams_and_in_flight_calls_and_is_idempotent) {
    Client client(engine().client_options());
    auto id = client.create(sleeper(unique_name("close")));
    client.start(id);
    auto stream = client.events({.filters = {{"label", {"reaper.test=nothing-ever"}}}});
    auto reader = std::async(std::launch::async, [&] { return stream->next(); });
    auto waiter = std::async(std::launch::async, [&] { return client.wait(id, 60s); });
    std::this_thread::sleep_for(300ms);
    auto t0 = Clock::now();
    client.close();
    BOOST_REQUIRE(reader.wait_for(5s) == std::future_status::ready);
    BOOST_REQUIRE(waiter.wait_for(5s) == std::future_status::ready);
    BOOST_TEST((Clock::now() - t0) < 1s);
    BOOST_TEST(!reader.get().has_value());
    BOOST_CHECK_THROW(waiter.get(), ClientClosed);
    client.close();
    BOOST_CHECK_THROW(client.ping(), ClientClosed);
    BOOST_CHECK_THROW(client.events({}), ClientClosed);
    // A cancelled stream keeps its (shut down) fd until its owner destroys it: closing the
    // fd under a reader in another thread could hand the number to an unrelated open().
    BOOST_TEST(client.open_connections() == 1u);
    stream.reset();
    BOOST_TEST(client.open_connections() == 0u);

    Client other(engine().client_options());
    other.remove(id, {.force = true});
}

BOOST_AUTO_TEST_CASE(request_timeout_is_a_typed_timeout) {
    auto options = engine().client_options();
    Client client(options);
    auto id = client.create(sleeper(unique_name("timeout")));
    client.start(id);
    auto t0 = Clock::now();
    auto e = expect_error<Timeout>([&] { client.wait(id, 300ms); });
    BOOST_TEST((Clock::now() - t0) < 5s);
    BOOST_TEST(e.kind() == EngineErrorKind::Timeout);
    client.ping();  // the timed-out connection was dropped, the client still works
    client.remove(id, {.force = true});
}

BOOST_AUTO_TEST_CASE(no_engine_at_the_address_is_unreachable) {
    ClientOptions options;
    options.address = EngineAddress::parse("unix://" + engine().dir() + "/no-such.sock");
    Client client(options);
    auto e = expect_error<Unreachable>([&] { client.ping(); });
    BOOST_TEST(std::string(e.what()).find("no-such.sock") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(hundred_clients_twenty_requests_each_give_back_every_fd) {
    Client warm(engine().client_options());
    warm.ping();
    warm.close();
    auto baseline = test::open_fd_count();
    {
        std::vector<std::unique_ptr<Client>> clients;
        for (int i = 0; i < 100; ++i) clients.push_back(std::make_unique<Client>(engine().client_options()));
        std::vector<std::thread> threads;
        for (int t = 0; t < 4; ++t) {
            threads.emplace_back([&, t] {
                for (int i = t; i < 100; i += 4) {
                    for (int r = 0; r < 20; ++r) {
                        if (r % 2) clients[i]->ping();
                        else clients[i]->list_containers({.all = false, .filters = {{"label", {"reaper.test=none"}}}});
                    }
                }
            });
        }
        for (auto& t : threads) t.join();
        BOOST_TEST(test::open_fd_count() > baseline);
        for (auto& c : clients) c->close();
        BOOST_TEST(test::open_fd_count() == baseline);
    }
    BOOST_TEST(test::open_fd_count() == baseline);
}

// Last: it kills this process's engine (and starts it again).
BOOST_AUTO_TEST_CASE(engine_killed_mid_stream_ends_it_with_a_typed_error) {
    Client client(engine().client_options());
    auto stream = client.events({.filters = {{"type", {"container"}}}});
    auto reader = std::async(std::launch::async, [&]() -> std::string {
        try {
            while (stream->next()) {
            }
            return "ended without error";
        } catch (const Unreachable& e) {
            return "unreachable";
        } catch (const std::exception& e) {
            return std::string("other: ") + e.what();
        }
    });
    std::this_thread::sleep_for(200ms);
    engine().kill();
    BOOST_REQUIRE(reader.wait_for(10s) == std::future_status::ready);
    BOOST_TEST(reader.get() == "unreachable");
    BOOST_CHECK_THROW(client.ping(), Unreachable);
    engine().start();
    client.ping();  // a fresh connection after the engine came back
}
