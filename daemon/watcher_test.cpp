#include "fake_engine.hpp"
#include "watcher.hpp"

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

using namespace reaperd;
namespace test = reaper::test;
using test::FakeEngine;
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

// Issue 23: when the daemon learns that the engine answers again (a removal's answer), its
// resync cuts the watcher's backoff short: the relist comes now, not after up to retry_max.
// Asked again while the engine stays away, the next pause is whole.
BOOST_AUTO_TEST_CASE(a_resync_cuts_the_backoff_after_a_failure_short) {
    FakeEngine engine;
    engine.set_down(true);
    Recorder rec;
    Watcher watcher(engine, {1h, 1h}, std::ref(rec));
    watcher.start();
    BOOST_TEST(rec.wait([&] { return rec.count<watch::EngineDown>() == 1; }));
    watcher.resync();  // still down: one more try, then the whole hour again
    BOOST_TEST(rec.wait([&] { return engine.calls("events") == 2; }));
    engine.add_silently("x", {});
    engine.set_down(false);
    watcher.resync();
    BOOST_TEST(rec.wait([&] { return rec.count<watch::EngineUp>() == 1; }));
    BOOST_TEST(rec.appeared("x"));
    BOOST_TEST(engine.calls("events") == 3);
    watcher.stop();
}

// An engine outside the client's API versions answers: it is not down. Reported once per
// reason, retried with the same backoff, and up once the engine speaks our version again.
BOOST_AUTO_TEST_CASE(an_unsupported_engine_is_reported_as_such_not_as_down) {
    FakeEngine engine;
    const test::Fault pinned_too_old{reaper::EngineErrorKind::Unsupported, 200, ""};
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

// Issue 21 point 6: a container the first list of a connection missed and whose event is
// late (Podman's file events backend) is reported by one catch-up list shortly after, which
// reports nothing else (no Listed: the vanished are the next full list's to find).
BOOST_AUTO_TEST_CASE(a_container_the_first_list_missed_is_caught_up_without_its_event) {
    FakeEngine engine;
    engine.add("a", {});
    engine.before("list", [] {});
    engine.before("list", [&] { engine.add_silently("b", {}); });  // made after the first list
    Recorder rec;
    auto options = fast();
    options.catch_up_after = 200ms;
    Watcher watcher(engine, options, std::ref(rec));
    watcher.start();
    BOOST_TEST_REQUIRE(rec.wait([&] { return rec.count<watch::Listed>() == 1; }));
    BOOST_TEST(rec.wait([&] { return rec.appeared("b"); }));
    std::this_thread::sleep_for(400ms);  // real time: no second catch-up comes
    BOOST_TEST(engine.calls("list") == 2);
    BOOST_TEST(rec.count<watch::Listed>() == 1u);
    watcher.stop();
}

// A catch-up list answered with a container whose removal the stream told while the list was
// out (the engine listed before it removed) does not bring it back.
BOOST_AUTO_TEST_CASE(a_catch_up_list_never_revives_a_container_removed_meanwhile) {
    FakeEngine engine;
    engine.add("a", {});
    engine.before("list", [] {});
    engine.before("list", [&] {
        engine.add_silently("b", {});
        engine.drop("b");              // its destroy event, to the watcher's stream
        std::this_thread::sleep_for(100ms);  // real time: the watcher has read it
        engine.add_silently("b", {});  // and the list still has the row
    });
    Recorder rec;
    auto options = fast();
    options.catch_up_after = 50ms;
    Watcher watcher(engine, options, std::ref(rec));
    watcher.start();
    BOOST_TEST_REQUIRE(rec.wait([&] { return engine.calls("list") == 2; }));
    std::this_thread::sleep_for(200ms);  // real time: the catch-up's answer is handled
    BOOST_TEST(!rec.appeared("b"));
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

// Local-driver logs are found under the data root, so their answers wait for it; a json-file
// answer may come before /info does (a_slow_info_holds_...), and under load did.
BOOST_AUTO_TEST_CASE(log_info_answers_carry_the_engines_data_root) {
    FakeEngine engine;
    engine.docker_root_dir = "/srv/docker";
    const auto local_driver = [](reaper::ContainerInfo& c) { c.log_driver = "local"; };
    engine.add("a", {});
    engine.update_containers(local_driver);
    Recorder rec;
    Watcher watcher(engine, fast(), std::ref(rec));
    watcher.start();
    BOOST_TEST(rec.wait([&] { return rec.appeared("a"); }));
    watcher.want_log_info("a");
    engine.add("b", {});  // by the events stream, after the list
    engine.update_containers(local_driver);
    BOOST_TEST(rec.wait([&] { return rec.appeared("b"); }));
    watcher.want_log_info("b");
    auto answers = [&] {
        std::lock_guard lock(rec.mutex);
        return std::count_if(rec.events.begin(), rec.events.end(), [](const WatchEvent& e) {
            auto* a = std::get_if<watch::Appeared>(&e);
            return a && a->log_info;
        });
    };
    BOOST_TEST(rec.wait([&] { return answers() == 2; }));
    watcher.stop();
    std::lock_guard lock(rec.mutex);
    for (auto& e : rec.events)
        if (auto* a = std::get_if<watch::Appeared>(&e); a && a->log_info) BOOST_TEST(a->docker_root_dir == "/srv/docker");
}

// Issue 21: Podman answers GET /info in ~1.7 s, and it was asked before each list, so a
// container created while reaperd started was known, and its log capped, only after it (a
// `yes` log reached 356 MB under a 10 MiB cap). The list, the events and the lookups of logs
// that do not need the data root go on while /info is out; a local-driver lookup waits for it.
BOOST_AUTO_TEST_CASE(a_slow_info_holds_neither_the_list_nor_the_events_nor_json_file_lookups) {
    FakeEngine engine;
    engine.docker_root_dir = "/srv/docker";
    engine.add("a", {});
    engine.add("l", {});
    engine.update_containers([](reaper::ContainerInfo& c) {
        c.log_driver = c.id == "l" ? "local" : "json-file";
        if (c.id == "a") c.log_path = "/srv/docker/containers/a/a-json.log";
    });
    std::mutex gate_mutex;
    std::condition_variable gate_cv;
    bool open = false;
    engine.before("info", [&] {
        std::unique_lock lock(gate_mutex);
        gate_cv.wait(lock, [&] { return open; });
    });
    Recorder rec;
    Watcher watcher(engine, fast(), std::ref(rec));
    watcher.start();
    BOOST_TEST_REQUIRE(rec.wait([&] { return rec.count<watch::EngineUp>() == 1; }));
    BOOST_TEST(rec.appeared("a"));
    engine.add("b", {});  // by the events stream, while /info is still out
    BOOST_TEST(rec.wait([&] { return rec.appeared("b"); }));
    auto answer = [&](const std::string& id) -> std::optional<watch::Appeared> {
        std::lock_guard lock(rec.mutex);
        for (auto& e : rec.events)
            if (auto* a = std::get_if<watch::Appeared>(&e); a && a->log_info && a->info.id == id) return *a;
        return std::nullopt;
    };
    watcher.want_log_info("a");
    watcher.want_log_info("l");
    BOOST_TEST(rec.wait([&] { return answer("a").has_value(); }));
    BOOST_TEST(!answer("l").has_value());  // waits for the data root
    {
        std::lock_guard lock(gate_mutex);
        open = true;
    }
    gate_cv.notify_all();
    BOOST_TEST_REQUIRE(rec.wait([&] { return answer("l").has_value(); }));
    BOOST_TEST(answer("l")->docker_root_dir == "/srv/docker");
    watcher.stop();
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

namespace {
// The Appeared events of `id`, in the order sent.
std::vector<watch::Appeared> appeared_of(Recorder& rec, const std::string& id) {
    std::lock_guard lock(rec.mutex);
    std::vector<watch::Appeared> out;
    for (auto& e : rec.events)
        if (auto* a = std::get_if<watch::Appeared>(&e); a && a->info.id == id) out.push_back(*a);
    return out;
}
std::size_t log_infos_of(Recorder& rec, const std::string& id) {
    std::size_t n = 0;
    for (auto& a : appeared_of(rec, id)) n += a.log_info;
    return n;
}
}  // namespace

// A create event carries the labels, name and image: the container is reported from it, with
// no inspect, until the loop asks for its log info.
BOOST_AUTO_TEST_CASE(a_created_container_is_reported_from_its_event_without_an_inspect) {
    FakeEngine engine;
    engine.add("listed", {{"reaperd.session", "s"}});
    Recorder rec;
    Watcher watcher(engine, fast(), std::ref(rec));
    watcher.start();
    BOOST_TEST(rec.wait([&] { return rec.count<watch::EngineUp>() == 1; }));
    engine.add("new", {{"reaperd.session", "s"}, {"reaperd.max-age", "1h"}});
    BOOST_TEST(rec.wait([&] { return rec.appeared("new"); }));
    BOOST_TEST(engine.calls("inspect") == 0);
    auto listed = appeared_of(rec, "listed");
    BOOST_REQUIRE(listed.size() == 1u);
    BOOST_TEST(!listed[0].log_info);
    BOOST_TEST(listed[0].info.name == "name-listed");
    BOOST_TEST(listed[0].info.labels.at("reaperd.session") == "s");
    auto created = appeared_of(rec, "new");
    BOOST_REQUIRE(created.size() == 1u);
    BOOST_TEST(!created[0].log_info);
    BOOST_TEST(created[0].info.name == "name-new");
    BOOST_TEST(created[0].info.image == "busybox");
    BOOST_TEST(created[0].info.created == "2026-01-01T00:00:00.000Z");
    // The labels are the attributes without the engine's own keys.
    BOOST_TEST((created[0].info.labels ==
                reaper::Labels{{"reaperd.session", "s"}, {"reaperd.max-age", "1h"}}));
    watcher.want_log_info("new");
    BOOST_TEST(rec.wait([&] { return log_infos_of(rec, "new") == 1; }));
    BOOST_TEST(engine.calls("inspect") == 1);
    watcher.stop();
}

BOOST_AUTO_TEST_CASE(attributes_become_labels_without_the_engines_own_keys) {
    reaper::Event event{"container", "create", "abc",
                        {{"name", "web"}, {"image", "nginx"}, {"containerExitCode", "0"},
                         {"podId", ""}, {"reaperd.session", "s"}, {"team", "x"}},
                        1767225600123456789};
    auto info = Watcher::from_event(event);
    BOOST_REQUIRE(info.has_value());
    BOOST_TEST(info->id == "abc");
    BOOST_TEST(info->name == "web");
    BOOST_TEST(info->image == "nginx");
    BOOST_TEST((info->labels == reaper::Labels{{"reaperd.session", "s"}, {"team", "x"}}));
    BOOST_TEST(info->created == "2026-01-01T00:00:00.123Z");
    BOOST_TEST(info->state.status == "created");
    // An engine that sends no attributes: nothing to go by (the watcher inspects instead).
    BOOST_TEST(!Watcher::from_event({"container", "create", "abc", {}, 5}).has_value());
}

// An engine whose events carry no attributes is still followed: by an inspect.
BOOST_AUTO_TEST_CASE(an_event_without_attributes_is_inspected) {
    FakeEngine engine;
    Recorder rec;
    Watcher watcher(engine, fast(), std::ref(rec));
    watcher.start();
    BOOST_TEST(rec.wait([&] { return rec.count<watch::EngineUp>() == 1; }));
    engine.attributes_in_events = false;
    engine.add("bare", {{"reaperd.session", "s"}});
    BOOST_TEST(rec.wait([&] { return rec.appeared("bare"); }));
    BOOST_TEST(appeared_of(rec, "bare")[0].info.labels.at("reaperd.session") == "s");
    BOOST_TEST(engine.calls("inspect") == 1);
    watcher.stop();
}

// The engine answers a starting container's inspect only once the start is done: a lookup
// waiting on it must not hold up the next event, nor other containers' lookups.
BOOST_AUTO_TEST_CASE(a_slow_lookup_delays_neither_the_next_event_nor_other_lookups) {
    FakeEngine engine;
    engine.add("slow", {{"reaperd.session", "s"}});
    Recorder rec;
    Watcher watcher(engine, fast(), std::ref(rec));
    watcher.start();
    BOOST_TEST(rec.wait([&] { return rec.count<watch::EngineUp>() == 1; }));
    engine.hold_inspects("slow");
    watcher.want_log_info("slow");
    BOOST_TEST(rec.wait([&] { return engine.held_inspects() == 1; }));
    engine.add("next", {{"reaperd.session", "s"}});
    BOOST_TEST(rec.wait([&] { return rec.appeared("next"); }));
    watcher.want_log_info("next");
    BOOST_TEST(rec.wait([&] { return log_infos_of(rec, "next") == 1; }));
    BOOST_TEST(log_infos_of(rec, "slow") == 0u);
    engine.release_inspects();
    BOOST_TEST(rec.wait([&] { return log_infos_of(rec, "slow") == 1; }));
    watcher.stop();
}

// A lookup answered after the container's Gone is not sent: the loop never hears of a
// container after its Gone.
BOOST_AUTO_TEST_CASE(a_lookup_that_loses_the_race_with_the_removal_is_dropped) {
    FakeEngine engine;
    engine.add("a", {{"reaperd.session", "s"}});
    Recorder rec;
    Watcher watcher(engine, fast(), std::ref(rec));
    watcher.start();
    BOOST_TEST(rec.wait([&] { return rec.count<watch::EngineUp>() == 1; }));
    engine.hold_inspects("a");
    watcher.want_log_info("a");
    BOOST_TEST(rec.wait([&] { return engine.held_inspects() == 1; }));  // its answer is in flight
    engine.drop("a");
    BOOST_TEST(rec.wait([&] { return rec.gone("a"); }));
    engine.release_inspects();
    BOOST_TEST(rec.wait([&] { return engine.held_inspects() == 0; }));
    watcher.want_log_info("a");  // asked late by the loop: ignored
    engine.add("b", {});  // an event after both, to be sure they were handled
    BOOST_TEST(rec.wait([&] { return rec.appeared("b"); }));
    std::this_thread::sleep_for(50ms);  // real time: a lookup wrongly started would show by now
    BOOST_TEST(log_infos_of(rec, "a") == 0u);
    BOOST_TEST(engine.calls("inspect") == 1);
    watcher.stop();
}

// A start sets LogPath; its lookup follows the create's and the older answer never comes
// last, even when the create's lookup is still in flight when the start arrives.
BOOST_AUTO_TEST_CASE(a_starts_log_info_is_never_overtaken_by_the_creates) {
    FakeEngine engine;
    Recorder rec;
    Watcher watcher(engine, fast(), std::ref(rec));
    watcher.start();
    BOOST_TEST(rec.wait([&] { return rec.count<watch::EngineUp>() == 1; }));
    engine.add("a", {{"reaperd.session", "s"}}, "created");
    BOOST_TEST(rec.wait([&] { return rec.appeared("a"); }));
    engine.hold_inspects("a");
    watcher.want_log_info("a");
    BOOST_TEST(rec.wait([&] { return engine.held_inspects() == 1; }));  // sees it "created"
    engine.start_container("a", "/var/lib/docker/containers/a/a-json.log");
    engine.add("b", {});  // an event after the start, to be sure it was handled meanwhile
    BOOST_TEST(rec.wait([&] { return rec.appeared("b"); }));
    std::this_thread::sleep_for(50ms);  // real time: a second lookup wrongly started would show by now
    BOOST_TEST(engine.held_inspects() == 1u);  // one container's lookups never overlap
    engine.release_inspects();
    BOOST_TEST(rec.wait([&] { return log_infos_of(rec, "a") == 2; }));
    auto seen = appeared_of(rec, "a");
    BOOST_TEST(seen.back().info.log_path == "/var/lib/docker/containers/a/a-json.log");
    BOOST_TEST(seen.back().info.state.status == "running");
    BOOST_TEST(engine.calls("inspect") == 2);
    watcher.stop();
}

// Stop drops the lookups not started; those in flight are cut by closing the engine (the
// daemon closes it before stopping the watcher), so stop does not wait on a stuck engine.
BOOST_AUTO_TEST_CASE(stop_does_not_wait_for_queued_lookups_or_a_stuck_inspect) {
    FakeEngine engine;
    for (int i = 0; i < 10; ++i) engine.add("c" + std::to_string(i), {{"reaperd.session", "s"}});
    Recorder rec;
    Watcher watcher(engine, fast(), std::ref(rec));
    watcher.start();
    BOOST_TEST(rec.wait([&] { return rec.count<watch::EngineUp>() == 1; }));
    for (int i = 0; i < 10; ++i) engine.hold_inspects("c" + std::to_string(i));
    for (int i = 0; i < 10; ++i) watcher.want_log_info("c" + std::to_string(i));
    BOOST_TEST(rec.wait([&] { return engine.held_inspects() == Watcher::lookup_threads; }));
    BOOST_REQUIRE(rec.wait([&] { return engine.open_streams() == 1u; }));
    std::thread stopper([&] { watcher.stop(); });
    // stop() drops the queued six as it cancels the stream; the stream is gone once the
    // watcher's thread has seen that.
    BOOST_TEST(rec.wait([&] { return engine.open_streams() == 0u; }));
    auto begin = std::chrono::steady_clock::now();
    engine.close();
    stopper.join();
    auto took = std::chrono::steady_clock::now() - begin;
    BOOST_TEST(took < 1s);
    BOOST_TEST(engine.calls("inspect") == static_cast<int>(Watcher::lookup_threads));
    BOOST_TEST(rec.count<watch::Appeared>() == 10u);  // the list's only: no log info
}

// A lookup that met an engine error is asked again at the next list.
BOOST_AUTO_TEST_CASE(a_failed_lookup_is_asked_again_at_the_next_list) {
    FakeEngine engine;
    engine.add("a", {{"reaperd.session", "s"}});
    engine.fail("inspect", "a", {test::timeout()});
    Recorder rec;
    Watcher watcher(engine, fast(), std::ref(rec));
    watcher.start();
    BOOST_TEST(rec.wait([&] { return rec.count<watch::EngineUp>() == 1; }));
    watcher.want_log_info("a");
    BOOST_TEST(rec.wait([&] { return engine.calls("inspect") == 1; }));
    watcher.resync();
    BOOST_TEST(rec.wait([&] { return log_infos_of(rec, "a") == 1; }));
    watcher.stop();
}
