// reaperd and the client against Podman (issue 12): Debian 12's podman 4.3.1 serving its
// Docker-compatible API (`podman system service`), run privately by tests/harness/podman-guard;
// also Debian 13's 5.4 and Debian unstable's 5.8 (scripts/test-podman.sh --engine trixie|sid).
// This process always uses Podman, whatever REAPER_TEST_ENGINE says; scripts/test-podman.sh
// runs it, with the engine-neutral cases of the other integration tests under
// REAPER_TEST_ENGINE=podman (the list is in tests/CMakeLists.txt).
//
// What Podman does differently from dockerd, each checked below where it matters:
// - GET /version takes ~4 s and GET /info ~1.7 s: podman names conmon's and runc's packages
//   by running rpm, dpkg -S and dpkg-query on every call. reaperd negotiates with /version and
//   asks /info at every (re)list, so it is ready 3-10 s after its start and after the engine
//   comes back (dockerd: 0.1-0.2 s). /_ping answers in ~10 ms.
// - A container in the wrong state (plain delete of a running one, kill of a stopped one,
//   exec in one not running) is answered 500 "...: container state improper" where dockerd
//   answers 409; an inspect racing a removal is 500 "...: no such container", not 404. The
//   client maps both to Conflict and NotFound (lib/src/client.cpp, throw_error_for).
// - The event of a removal is "remove", not "destroy"; a filter on "destroy" matches nothing.
//   reaperd's watcher subscribes to both.
// - An exec started detached stays Running for ever in GET /exec/{id}/json: Client::exec starts
//   it attached. An image import ignores tag=: Client::import_image sends repo=NAME:TAG.
// - The "json-file" log is conmon's k8s-file format (`<RFC 3339 time> stdout F <line>`) at
//   <graph root>/vfs-containers/<id>/userdata/ctr.log, its inspect LogPath, opened O_APPEND.
//   It grows ~3x faster than dockerd's for the same writer (`yes`: ~230 MB/s here, 70 MB/s).
//   There is no `local` driver, no rotation (max-size makes conmon truncate the file itself)
//   and LogConfig.Config is null in inspect.
// - A SIGKILLed service leaves its containers running under conmon; the next service on the
//   same dirs takes them over.
#include "daemon_fixture.hpp"
#include "engine.hpp"
#include "logcap/logcap_file.hpp"

#include <reaper/client.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace reaperd::itest;
using reaper::test::engine;
using reaper::test::EngineKind;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::uint64_t MiB = 1024 * 1024;

// Before anything asks for the engine: this test is about Podman.
struct UsePodman {
    UsePodman() { ::setenv("REAPER_TEST_ENGINE", "podman", 1); }
};

// The bytes a log holds on disk, as the capper counts them: a punched cut leaves its apparent
// size growing.
std::uint64_t size_of(const fs::path& path) { return reaperd::logcap::allocated_bytes(path.string()); }

// The largest size of `log` sampled at 100 Hz over `duration`.
std::uint64_t max_size_over(const fs::path& log, std::chrono::milliseconds duration) {
    std::uint64_t max = 0;
    for (auto next = Clock::now(), end = next + duration; next < end; next += 10ms) {
        max = std::max(max, size_of(log));
        std::this_thread::sleep_until(next);
    }
    return max;
}

std::string first_line(const fs::path& path) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);
    return line;
}

std::string ms_since(Clock::time_point start) {
    return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count()) +
           " ms";
}

}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(UsePodman);

// The Podman releases the suite runs on, and the Docker API each serves (its /version's
// ApiVersion; MinAPIVersion is 1.24 in all three).
struct PodmanRelease {
    std::string_view version_prefix;
    std::string_view api_version;
};
constexpr PodmanRelease podman_releases[] = {
    {"4.3.", "1.41"},  // Debian 12
    {"5.4.", "1.41"},  // Debian 13, scripts/test-podman.sh --engine trixie
    {"5.8.", "1.44"},  // Debian unstable, scripts/test-podman.sh --engine sid
};

BOOST_AUTO_TEST_CASE(the_engine_is_podman_speaking_the_docker_api_of_its_release) {
    BOOST_TEST_REQUIRE(engine().kind() == EngineKind::podman);
    auto& client = engine_client();
    auto version = client.version();
    BOOST_TEST_MESSAGE("podman " << version.version << ", API " << version.min_api_version << "-"
                                 << version.api_version);
    const auto* release = std::find_if(std::begin(podman_releases), std::end(podman_releases), [&](const auto& r) {
        return version.version.rfind(r.version_prefix, 0) == 0u;
    });
    BOOST_TEST_REQUIRE((release != std::end(podman_releases)),
                       "Podman " << version.version << ": add its release here");
    BOOST_TEST(version.api_version == release->api_version);
    BOOST_TEST(version.min_api_version == "1.24");
    BOOST_TEST(client.api_version() == release->api_version);
    // The graph root is what /info names as DockerRootDir, as dockerd names its data root.
    BOOST_TEST(client.info().docker_root_dir == engine().data_root());
}

BOOST_AUTO_TEST_CASE(states_podman_answers_with_500_come_out_as_the_docker_kinds) {
    Cleanup cleanup;
    auto& client = engine_client();
    std::string running = run_container({});
    std::string created = run_container({}, false);
    cleanup.ids = {running, created};
    // dockerd: 409 for each; podman: 500 "...: container state improper".
    try {
        client.remove(running, {});
        BOOST_FAIL("a plain delete of a running container succeeded");
    } catch (const reaper::Conflict& e) {
        BOOST_TEST_MESSAGE("plain delete: HTTP " << e.status() << ": " << e.engine_message());
    }
    BOOST_CHECK_THROW(client.kill(created), reaper::Conflict);
    BOOST_CHECK_THROW(client.exec(created, {"true"}, 10s), reaper::Conflict);
    client.remove(running, {true, true});
    BOOST_CHECK_THROW(client.inspect(running), reaper::NotFound);
    BOOST_CHECK_THROW(client.remove(running, {true, true}), reaper::NotFound);
}

BOOST_AUTO_TEST_CASE(a_log_is_ctr_log_under_the_graph_root_and_survives_a_cut) {
    Cleanup cleanup;
    auto& client = engine_client();
    reaper::ContainerSpec spec;
    spec.name = reaper::test::unique_name("podman-log");
    spec.image = reaper::test::PrivateEngine::image;
    spec.cmd = {"sh", "-c", "while true; do echo line; sleep 0.01; done"};
    auto id = client.create(spec);
    cleanup.ids.push_back(id);
    client.start(id);
    auto info = client.inspect(id);
    BOOST_TEST(info.log_driver == "json-file");
    BOOST_TEST(info.log_path == engine().data_root() + "/vfs-containers/" + id + "/userdata/ctr.log");
    BOOST_TEST_REQUIRE(eventually([&] { return size_of(info.log_path) > 0; }, 10s));
    // conmon's k8s-file lines, not dockerd's JSON: reaperd caps by size and never parses them.
    auto line = first_line(info.log_path);
    BOOST_TEST(line.find(" stdout F line") != std::string::npos, line);
    // Appended: a truncation leaves a file that goes on from its start with whole lines.
    fs::resize_file(info.log_path, 0);
    BOOST_TEST_REQUIRE(eventually([&] { return size_of(info.log_path) > 0; }, 10s));
    line = first_line(info.log_path);
    BOOST_TEST(line.find(" stdout F line") != std::string::npos, line);
    BOOST_TEST(line.find('\0') == std::string::npos);
}

// ---- reaperd: one daemon for the session rules ---------------------------------------------

namespace {

// One reaperd for the cases of this suite (each uses sessions of its own): it takes 3-10 s to
// be ready against Podman. Stopped when the suite ends, so the cases after it each have the
// engine to one reaperd (two would both cap the same logs, each with its own config).
struct OneReaperd {
    OneReaperd() : daemon("  labels: [reaperd.session, org.testcontainers.sessionId]\n") {
        auto started = Clock::now();
        daemon.start();
        BOOST_TEST_MESSAGE("reaperd ready " << ms_since(started) << " after its start");
        instance = &daemon;
    }
    ~OneReaperd() { instance = nullptr; }
    Reaperd daemon;
    static inline Reaperd* instance = nullptr;
};

Reaperd& shared_daemon() {
    BOOST_REQUIRE(OneReaperd::instance);
    return *OneReaperd::instance;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(one_reaperd, *boost::unit_test::fixture<OneReaperd>())

BOOST_AUTO_TEST_CASE(a_dropped_lease_reaps_after_the_grace) {
    auto& d = shared_daemon();
    auto lease = d.control().lease("pm-grace");
    std::string a = run_container(session_label("pm-grace"));
    std::string b = run_container(session_label("pm-grace"), false);  // created, never started
    BOOST_REQUIRE(eventually([&] { return d.containers_of("pm-grace") == 2; }));
    lease->release();
    BOOST_REQUIRE(eventually([&] { return d.session_state("pm-grace") != "leased"; }));
    auto released = Clock::now();
    BOOST_TEST(exists(a));
    BOOST_TEST(eventually([&] { return !exists(a) && !exists(b); }));
    BOOST_TEST_MESSAGE("lease dropped to both removed: " << ms_since(released) << " (lease_grace 2 s)");
    BOOST_TEST((Clock::now() - released >= 1500ms));
    BOOST_TEST(d.session_state("pm-grace") == "ended");
}

BOOST_AUTO_TEST_CASE(an_explicit_end_reaps_now_and_a_later_container_too) {
    auto& d = shared_daemon();
    auto lease = d.control().lease("pm-end");
    std::string a = run_container(session_label("pm-end"));
    BOOST_REQUIRE(eventually([&] { return d.containers_of("pm-end") == 1; }));
    auto ended = Clock::now();
    d.control().end("pm-end");
    BOOST_TEST(eventually([&] { return !exists(a); }, 30s));
    BOOST_TEST_MESSAGE("end to removed: " << ms_since(ended));
    // The tombstone: created later under the ended id, it goes too.
    std::string late = run_container(session_label("pm-end"), false);
    BOOST_TEST(eventually([&] { return !exists(late); }, 30s));
}

// A container whose stop timeout is long (Podman's CLI gives 10 s, as Podman 5 gives every
// container; --stop-timeout here) and whose process ignores SIGTERM (sleep as PID 1): the
// compat DELETE with force waited that long before it killed (10.1 s measured on 5.4, and on
// 4.3 for such a container), the libpod one the client sends kills at once, as Docker does.
BOOST_AUTO_TEST_CASE(a_running_container_with_a_long_stop_timeout_is_reaped_without_that_wait) {
    auto& d = shared_daemon();
    auto lease = d.control().lease("pm-stop-timeout");
    const auto made = shell_output(engine().podman_cli(
        "run -d --stop-timeout 60 --label reaperd.session=pm-stop-timeout " +
        std::string(reaper::test::PrivateEngine::image) + " sleep 600"));
    const std::string id = made.substr(0, made.find_first_of(" \n"));
    Cleanup cleanup;
    cleanup.ids = {id};
    BOOST_REQUIRE_MESSAGE(id.size() == 64u, "podman run: " << made);
    BOOST_REQUIRE(engine_client().inspect(id).state.running);
    BOOST_REQUIRE(eventually([&] { return d.containers_of("pm-stop-timeout") == 1; }));
    auto ended = Clock::now();
    d.control().end("pm-stop-timeout");
    BOOST_TEST(eventually([&] { return !exists(id); }, 20s));
    BOOST_TEST_MESSAGE("end to removed, under a 60 s stop timeout: " << ms_since(ended));
}

BOOST_AUTO_TEST_CASE(an_orphan_report_reaps_a_running_container_that_plain_delete_refused) {
    auto& d = shared_daemon();
    auto lease = d.control().lease("pm-orphan");  // alive: only the report may reap it
    std::string id = run_container(session_label("pm-orphan"));
    std::string sibling = run_container(session_label("pm-orphan"));
    BOOST_CHECK_THROW(engine_client().remove(id, {}), reaper::Conflict);
    BOOST_REQUIRE(eventually([&] { return d.containers_of("pm-orphan") == 2; }));
    d.control().report_orphan(id, "pm-orphan");
    BOOST_TEST(eventually([&] { return !exists(id); }, 30s));
    std::this_thread::sleep_for(1s);
    BOOST_TEST(exists(sibling));
    BOOST_TEST(engine_client().inspect(sibling).state.running);
    engine_client().remove(sibling, {true, true});
}

BOOST_AUTO_TEST_CASE(unlabeled_and_leased_containers_survive_while_a_session_is_reaped) {
    auto& d = shared_daemon();
    auto keep = d.control().lease("pm-keep");
    Cleanup cleanup;
    cleanup.ids = {
        run_container({}),
        run_container({{"app", "database"}}),
        run_container({{"reaperd.sessionx", "pm-doomed"}}),  // a near miss is not the label
        run_container(session_label("pm-keep")),
        run_container({{"org.testcontainers.sessionId", "pm-keep"}}),
    };
    std::vector<std::string> doomed;
    for (int i = 0; i < 4; ++i)
        doomed.push_back(run_container(i % 2 ? session_label("pm-doomed")
                                             : reaper::Labels{{"org.testcontainers.sessionId", "pm-doomed"}}));
    BOOST_REQUIRE(eventually([&] { return d.containers_of("pm-doomed") == 4 && d.containers_of("pm-keep") == 2; }));
    d.control().end("pm-doomed");
    BOOST_TEST(eventually([&] {
        return std::none_of(doomed.begin(), doomed.end(), [](const auto& id) { return exists(id); });
    }));
    std::this_thread::sleep_for(2s);
    for (const auto& id : cleanup.ids) {
        BOOST_TEST(exists(id), id);
        BOOST_TEST(engine_client().inspect(id).state.running, id);
    }
    BOOST_TEST(d.session_state("pm-keep") == "leased");
    BOOST_TEST(d.pending_reaps() == 0u);
}

// Podman reports a removal as "remove", where dockerd says "destroy": the watcher subscribes to
// both and takes either as the container gone (daemon/watcher.cpp). Were it to follow
// "destroy" alone, a container removed by its owner would stay tracked until the next resync
// (reaper.resync_interval, 60 s).
BOOST_AUTO_TEST_CASE(a_container_removed_by_its_owner_leaves_reaperds_registry) {
    auto& d = shared_daemon();
    std::string id = run_container(session_label("pm-gone"));
    BOOST_REQUIRE(eventually([&] { return d.containers_of("pm-gone") == 1; }));
    engine_client().remove(id, {true, true});
    BOOST_TEST(eventually([&] { return d.containers_of("pm-gone") == 0; }, 5s),
               "still tracked 5 s after its removal");
}

BOOST_AUTO_TEST_SUITE_END()

// ---- reaperd: log caps -----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(reaperd_caps_a_runaway_log_and_stops_only_an_owned_writer) {
    Reaperd d("", "logs:\n  max_size: 8MiB\n  action: stop\n  scope: all\n");
    d.start();
    Cleanup cleanup;
    // An unlabeled runaway: only ever truncated.
    std::string runaway = [&] {
        reaper::ContainerSpec spec;
        spec.name = reaper::test::unique_name("podman-runaway");
        spec.image = reaper::test::PrivateEngine::image;
        spec.cmd = {"yes"};
        return engine_client().create(spec);
    }();
    cleanup.ids.push_back(runaway);
    engine_client().start(runaway);
    auto started_at = engine_client().inspect(runaway).state.started_at;
    const fs::path log = engine_client().inspect(runaway).log_path;
    BOOST_TEST_REQUIRE(eventually([&] { return d.log_count("ACTION=truncate") > 0; }, 30s));
    auto max = max_size_over(log, 3s);
    BOOST_TEST_MESSAGE("largest runaway log over 3 s under an 8 MiB cap: " << max << " bytes");
    // conmon writes `yes` at ~230 MB/s here, 1 MiB every ~4.5 ms, and the writer and conmon
    // keep both cores busy: reaperd's cuts come late (seen: 5 MB alone, 42 MB under a 4 MiB
    // cap beside another test). What this holds is that the log is capped at all: 3 s of
    // writing make ~700 MB uncapped.
    BOOST_TEST(max < 64 * MiB);
    BOOST_TEST(engine_client().inspect(runaway).state.running);
    BOOST_TEST(engine_client().inspect(runaway).state.started_at == started_at);

    // A session-owned writer past its (label) cap is stopped, once.
    std::string owned = [&] {
        reaper::ContainerSpec spec;
        spec.name = reaper::test::unique_name("podman-owned");
        spec.image = reaper::test::PrivateEngine::image;
        spec.cmd = {"sh", "-c", "yes 0123456789012345678901234567890123456789 | head -n 100000; exec sleep 600"};
        spec.labels = {{"reaperd.session", "pm-logs"}, {"reaperd.log-max-size", "1MiB"}};
        return engine_client().create(spec);
    }();
    cleanup.ids.push_back(owned);
    engine_client().start(owned);
    BOOST_TEST(eventually([&] { return !engine_client().inspect(owned).state.running; }, 30s),
               "the owned writer still runs; reaperd's log:\n" << d.log_text());
    BOOST_TEST(eventually([&] { return d.log_count("ACTION=stop") == 1u; }, 10s));
    BOOST_TEST(d.log_count("CONTAINER_ID=" + owned) >= 1u);
    BOOST_TEST(engine_client().inspect(runaway).state.running);
    BOOST_TEST(d.log_count("ACTION=stop") == 1u);
    BOOST_TEST(d.terminate() == 0);
}

// Issue 21, point 6: a `yes` container created while reaperd started (its control socket
// answering, READY not yet sent) reached 356 MB under a 10 MiB cap in 1 of 3 runs. Two waits
// made that window, measured on an idle machine with conmon writing ~470 MB/s: negotiating
// the API by GET /version, which Podman answers in ~0.4 s (now /_ping's header, <1 ms), and a
// container created during the first list, whose create event Podman's file events backend
// delivered ~250 ms late (now a catch-up list 100 ms after the first). Before: the first cut
// at 140-270 MB; after: 14-30 MB, where one created after READY peaked at 10-83 MB.
BOOST_AUTO_TEST_CASE(a_log_that_appears_during_start_up_is_capped_as_promptly_as_later) {
    Reaperd d("", "logs:\n  max_size: 10MiB\n  scope: all\n");
    d.start(false);  // returns once the control socket answers
    // READY now follows the socket by ~10 ms, often before the create is answered: the
    // create is asked at the socket's first answer either way, and the message says which.
    const bool ready_at_create = d.ready();
    Cleanup cleanup;
    auto runaway = [&] {
        reaper::ContainerSpec spec;
        spec.name = reaper::test::unique_name("podman-startup");
        spec.image = reaper::test::PrivateEngine::image;
        spec.cmd = {"yes"};
        auto id = engine_client().create(spec);
        cleanup.ids.push_back(id);
        engine_client().start(id);
        return id;
    };
    const std::string early = runaway();
    auto early_max = max_size_over(engine_client().inspect(early).log_path, 8s);
    BOOST_TEST_REQUIRE(eventually([&] { return d.ready(); }, 60s));
    // One runaway at a time: two of them at ~230 MB/s each starve everything else of CPU.
    engine_client().remove(early, {true, true});
    const std::string late = runaway();
    auto late_max = max_size_over(engine_client().inspect(late).log_path, 8s);
    BOOST_TEST_MESSAGE("made during start-up (reaperd " << (ready_at_create ? "already" : "not yet")
                                                        << " ready): largest log " << early_max << " bytes; made after READY: " << late_max
                                                            << " bytes");
    // As promptly: within twice the later one's peak, or 96 MiB (the later one alone varied
    // from 10 to 83 MB in one series: its create event comes when Podman's events backend
    // next polls). Both are capped at all: 8 s of writing make ~1.8 GB uncapped.
    BOOST_TEST(early_max <= std::max<std::uint64_t>(2 * late_max, 96 * MiB), d.log_text());
    BOOST_TEST(late_max < 512 * MiB, d.log_text());
    BOOST_TEST(d.terminate() == 0);
}

// ---- reaperd across a restart of the engine ---------------------------------------------------

BOOST_AUTO_TEST_CASE(the_engine_killed_and_started_again_is_reconnected_and_the_pending_reap_done) {
    Reaperd d;
    d.start();
    const pid_t pid = d.pid();
    std::string a = run_container(session_label("pm-restart"));
    std::string bystander = run_container({{"app", "keep-me"}});
    Cleanup cleanup;
    cleanup.ids = {bystander};
    auto lease = d.control().lease("pm-restart");
    BOOST_REQUIRE(eventually([&] { return d.containers_of("pm-restart") == 1; }));

    engine().kill();
    BOOST_TEST(eventually([&] { return d.status()->getValue<std::string>("engine") == "down"; }));
    lease->release();
    BOOST_TEST(eventually([&] { return d.session_state("pm-restart") == "ended"; }));
    BOOST_TEST(eventually([&] { return d.pending_reaps() == 1; }));
    std::this_thread::sleep_for(3s);  // a few failed attempts while the engine is away
    BOOST_TEST(d.running());

    auto back = Clock::now();
    engine().start();
    // The killed service's containers ran on under conmon; the new one has them.
    BOOST_TEST(engine_client().inspect(bystander).state.running);
    BOOST_TEST(eventually([&] { return !exists(a); }));
    BOOST_TEST_MESSAGE("engine back to the pending reap done: " << ms_since(back));
    BOOST_TEST(eventually([&] { return d.status()->getValue<std::string>("engine") == "up"; }));
    BOOST_TEST_MESSAGE("engine back to reaperd's status up: " << ms_since(back));
    BOOST_TEST(eventually([&] { return d.pending_reaps() == 0; }));
    BOOST_TEST(d.pid() == pid);
    BOOST_TEST(d.running());
    BOOST_TEST(exists(bystander));
    BOOST_TEST(d.log_count("engine lost") == 1u);
    BOOST_TEST(d.log_count("engine is back") == 1u);
    BOOST_TEST(d.log_count("container reaped") == 1u);
    BOOST_TEST(d.terminate() == 0);
}

// ---- the client where Podman's compat API differs ------------------------------------------------

// Podman never marks an exec session started detached as ended (its Running stays true): a
// client that starts detached and polls GET /exec/{id}/json times out, and a Session's
// readiness probe with it. Client::exec starts it attached (Detach false, stdout and stderr
// attached) and reads the stream to its end; the exit code is there then.
BOOST_AUTO_TEST_CASE(exec_returns_the_commands_exit_code) {
    Cleanup cleanup;
    std::string id = run_container({});
    cleanup.ids.push_back(id);
    int code = -1;
    try {
        code = engine_client().exec(id, {"sh", "-c", "exit 3"}, 3s);
    } catch (const reaper::Timeout& e) {
        BOOST_TEST_MESSAGE(e.what());
    }
    BOOST_TEST(code == 3);
}

// The compat import takes the repo and ignores tag=: an image imported with repo=NAME&tag=TAG
// is stored as NAME:latest. Both engines take the tag inside repo= (repo=NAME:TAG, as the docker
// CLI sends it), which is what Client::import_image sends.
BOOST_AUTO_TEST_CASE(an_imported_image_keeps_its_tag) {
    const std::string reference = "reaper-test/tagged:" + reaper::test::unique_name("t");
    reaper::test::import_busybox_image(engine_client(), reference);
    reaper::ContainerSpec spec;
    spec.name = reaper::test::unique_name("podman-tagged");
    spec.image = reference;
    spec.cmd = {"true"};
    std::string id;
    try {
        id = engine_client().create(spec);
    } catch (const reaper::NotFound& e) {
        BOOST_TEST_MESSAGE(e.what());
    }
    BOOST_TEST(!id.empty(), reference << " cannot be found after its import");
    if (!id.empty()) engine_client().remove(id, {true, true});
}
