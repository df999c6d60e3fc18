#include "fake_engine.hpp"
#include "watcher.hpp"

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>

using namespace reaperd;
using reaperd::test::FakeEngine;
using namespace std::chrono_literals;

namespace {
// Collects what the watcher reports and waits for conditions on it.
struct Recorder {
    std::mutex mutex;
    std::condition_variable changed;
    std::vector<WatchEvent> events;

    void operator()(WatchEvent e) {
        std::lock_guard lock(mutex);
        events.push_back(std::move(e));
        changed.notify_all();
    }
    template <class T>
    std::size_t count() {
        std::lock_guard lock(mutex);
        std::size_t n = 0;
        for (auto& e : events) n += std::holds_alternative<T>(e);
        return n;
    }
    // Polls: some conditions (engine call counts) change without a report.
    bool wait(const std::function<bool()>& condition) {
        auto deadline = std::chrono::steady_clock::now() + 30s;
        while (!condition()) {
            if (std::chrono::steady_clock::now() > deadline) return false;
            std::unique_lock lock(mutex);
            changed.wait_for(lock, 10ms);
        }
        return true;
    }
    bool appeared(const std::string& id) {
        std::lock_guard lock(mutex);
        for (auto& e : events)
            if (auto* a = std::get_if<watch::Appeared>(&e); a && a->info.id == id) return true;
        return false;
    }
    bool gone(const std::string& id) {
        std::lock_guard lock(mutex);
        for (auto& e : events)
            if (auto* g = std::get_if<watch::Gone>(&e); g && g->id == id) return true;
        return false;
    }
};

WatcherOptions fast() { return {10ms, 50ms}; }
}  // namespace

BOOST_AUTO_TEST_CASE(lists_then_follows_events) {
    FakeEngine engine;
    engine.add("a", {{"reaperd.session", "s"}});
    engine.add("b", {});
    Recorder rec;
    Watcher watcher(engine, fast(), std::ref(rec));
    watcher.start();
    BOOST_TEST(rec.wait([&] { return rec.count<watch::EngineUp>() == 1; }));
    BOOST_TEST(rec.appeared("a"));
    BOOST_TEST(rec.appeared("b"));  // every container: ownership is the loop's call
    BOOST_TEST(rec.count<watch::Listed>() == 1u);
    engine.add("c", {});
    BOOST_TEST(rec.wait([&] { return rec.appeared("c"); }));
    engine.drop("a");
    BOOST_TEST(rec.wait([&] { return rec.gone("a"); }));
    watcher.stop();
    BOOST_TEST(engine.open_streams() == 0u);
}

// Podman reports a removal as "remove", never "destroy": the watcher subscribes to both (the
// fake, as the engines do, sends only the events the subscription names).
BOOST_AUTO_TEST_CASE(a_container_removed_on_podman_is_gone_as_on_docker) {
    FakeEngine engine;
    engine.add("docker-style", {});
    engine.add("podman-style", {});
    Recorder rec;
    Watcher watcher(engine, fast(), std::ref(rec));
    watcher.start();
    BOOST_TEST(rec.wait([&] { return rec.count<watch::EngineUp>() == 1; }));
    engine.drop("docker-style", "destroy");
    engine.drop("podman-style", "remove");
    BOOST_TEST(rec.wait([&] { return rec.gone("docker-style") && rec.gone("podman-style"); }));
    BOOST_TEST(rec.count<watch::Listed>() == 1u);  // seen in the events, not by a re-list
    watcher.stop();
}

BOOST_AUTO_TEST_CASE(a_broken_stream_reconnects_and_relists) {
    FakeEngine engine;
    Recorder rec;
    Watcher watcher(engine, fast(), std::ref(rec));
    watcher.start();
    BOOST_TEST(rec.wait([&] { return rec.count<watch::Listed>() == 1; }));
    engine.break_streams();
    // Changes while the stream is down are found by the re-list, not by events.
    engine.add_silently("missed", {{"reaperd.session", "s"}});
    BOOST_TEST(rec.wait([&] { return rec.count<watch::EngineUp>() == 2; }));
    BOOST_TEST(rec.appeared("missed"));
    BOOST_TEST(rec.count<watch::EngineDown>() == 1u);
    watcher.stop();
}

BOOST_AUTO_TEST_CASE(engine_down_is_reported_once_and_retried_until_back) {
    FakeEngine engine;
    engine.set_down(true);
    Recorder rec;
    Watcher watcher(engine, fast(), std::ref(rec));
    watcher.start();
    BOOST_TEST(rec.wait([&] { return engine.calls("events") >= 5; }));
    BOOST_TEST(rec.count<watch::EngineDown>() == 1u);
    BOOST_TEST(rec.count<watch::EngineUp>() == 0u);
    engine.add_silently("x", {});
    engine.set_down(false);
    BOOST_TEST(rec.wait([&] { return rec.count<watch::EngineUp>() == 1; }));
    BOOST_TEST(rec.appeared("x"));
    watcher.stop();
}

// An engine outside the client's API versions answers: it is not down. Reported once per
// reason, retried with the same backoff, and up once the engine speaks our version again.
BOOST_AUTO_TEST_CASE(an_unsupported_engine_is_reported_as_such_not_as_down) {
    FakeEngine engine;
    const reaperd::test::Fault pinned_too_old{reaper::EngineErrorKind::Unsupported, 200, ""};
    engine.fail("events", "", {pinned_too_old, pinned_too_old, pinned_too_old});
    Recorder rec;
    Watcher watcher(engine, fast(), std::ref(rec));
    watcher.start();
    BOOST_TEST(rec.wait([&] { return rec.count<watch::EngineUp>() == 1; }));
    BOOST_TEST(engine.calls("events") >= 4);
    BOOST_TEST(rec.count<watch::EngineUnsupported>() == 1u);
    BOOST_TEST(rec.count<watch::EngineDown>() == 0u);
    watcher.stop();
}

BOOST_AUTO_TEST_CASE(resync_relists_and_reports_what_vanished_silently) {
    FakeEngine engine;
    engine.add("a", {});
    Recorder rec;
    Watcher watcher(engine, fast(), std::ref(rec));
    watcher.start();
    BOOST_TEST(rec.wait([&] { return rec.count<watch::Listed>() == 1; }));
    engine.add_silently("b", {});
    watcher.resync();
    BOOST_TEST(rec.wait([&] { return rec.count<watch::Listed>() == 2; }));
    BOOST_TEST(rec.appeared("b"));
    BOOST_TEST(rec.count<watch::EngineDown>() == 0u);
    watcher.stop();
}

BOOST_AUTO_TEST_CASE(faults_during_list_and_inspect_are_retried) {
    FakeEngine engine;
    engine.add("a", {});
    engine.fail("list", "", {test::server_error(), test::timeout()});
    engine.fail("inspect", "a", {test::unreachable()});
    Recorder rec;
    Watcher watcher(engine, fast(), std::ref(rec));
    watcher.start();
    BOOST_TEST(rec.wait([&] { return rec.count<watch::EngineUp>() == 1; }));
    BOOST_TEST(rec.appeared("a"));
    watcher.stop();
}

BOOST_AUTO_TEST_CASE(appeared_containers_carry_the_engines_data_root) {
    FakeEngine engine;
    engine.docker_root_dir = "/srv/docker";
    engine.add("a", {});
    Recorder rec;
    Watcher watcher(engine, fast(), std::ref(rec));
    watcher.start();
    BOOST_TEST(rec.wait([&] { return rec.appeared("a"); }));
    engine.add("b", {});  // by the events stream, after the list
    BOOST_TEST(rec.wait([&] { return rec.appeared("b"); }));
    watcher.stop();
    std::lock_guard lock(rec.mutex);
    for (auto& e : rec.events)
        if (auto* a = std::get_if<watch::Appeared>(&e)) BOOST_TEST(a->docker_root_dir == "/srv/docker");
}

BOOST_AUTO_TEST_CASE(an_engine_that_will_not_give_its_info_is_still_watched) {
    FakeEngine engine;
    engine.fail("info", "", {test::server_error()});
    engine.add("a", {});
    Recorder rec;
    Watcher watcher(engine, fast(), std::ref(rec));
    watcher.start();
    BOOST_TEST(rec.wait([&] { return rec.appeared("a"); }));
    BOOST_TEST(rec.count<watch::EngineDown>() == 0u);
    watcher.stop();
}

// Networks and volumes: listed after the containers (their lists carry the labels), then
// followed by their create (inspected) and destroy events; a re-list reconciles them.
BOOST_AUTO_TEST_CASE(networks_and_volumes_are_listed_after_containers_then_followed) {
    FakeEngine engine;
    const std::string net(64, 'a'), late(64, 'b');
    engine.add("c", {{"reaperd.session", "s"}});
    engine.add_network(net, {{"reaperd.session", "s"}});
    engine.add_volume("plain", {});
    Recorder rec;
    Watcher watcher(engine, fast(), std::ref(rec));
    watcher.start();
    BOOST_TEST(rec.wait([&] { return rec.count<watch::EngineUp>() == 1; }));
    {
        std::lock_guard lock(rec.mutex);
        std::vector<std::string> order;
        for (auto& e : rec.events) {
            if (std::holds_alternative<watch::Listed>(e)) order.push_back("containers");
            if (auto* l = std::get_if<watch::ObjectsListed>(&e)) {
                order.push_back(std::string(to_string(l->kind)) + "s");
                BOOST_REQUIRE(l->objects.size() == 1u);
                if (l->kind == ObjectKind::network) {
                    BOOST_TEST(l->objects[0].ref.id == net);
                    BOOST_TEST(l->objects[0].labels.at("reaperd.session") == "s");
                } else {
                    BOOST_TEST(l->objects[0].ref.id == "plain");
                }
            }
        }
        BOOST_TEST((order == std::vector<std::string>{"containers", "networks", "volumes"}));
    }
    auto object_appeared = [&](const std::string& id) {
        std::lock_guard lock(rec.mutex);
        for (auto& e : rec.events)
            if (auto* a = std::get_if<watch::ObjectAppeared>(&e); a && a->object.ref.id == id)
                return a->object.labels.count("reaperd.session") == 1;
        return false;
    };
    auto object_gone = [&](const std::string& id) {
        std::lock_guard lock(rec.mutex);
        for (auto& e : rec.events)
            if (auto* g = std::get_if<watch::ObjectGone>(&e); g && g->ref.id == id) return true;
        return false;
    };
    engine.add_network(late, {{"reaperd.session", "t"}});
    engine.add_volume("data", {{"reaperd.session", "t"}});
    BOOST_TEST(rec.wait([&] { return object_appeared(late) && object_appeared("data"); }));
    engine.remove_network(late);  // by someone else: its destroy event
    engine.remove_volume("data");
    BOOST_TEST(rec.wait([&] { return object_gone(late) && object_gone("data"); }));
    watcher.stop();
    BOOST_TEST(engine.open_streams() == 0u);
}

BOOST_AUTO_TEST_CASE(a_failed_network_or_volume_list_is_retried_like_the_containers) {
    FakeEngine engine;
    engine.fail("list_volumes", "", {test::server_error()});
    Recorder rec;
    Watcher watcher(engine, fast(), std::ref(rec));
    watcher.start();
    BOOST_TEST(rec.wait([&] { return rec.count<watch::EngineUp>() == 1; }));
    BOOST_TEST(rec.count<watch::EngineDown>() == 1u);
    BOOST_TEST(rec.count<watch::ObjectsListed>() == 2u);  // from the pass that worked only
    watcher.stop();
}
