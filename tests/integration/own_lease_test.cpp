// `reaperctl run --own` and the session's lease, against the private engine with reaperd as a
// child process (lease_grace 2 s):
// - the Strix seed, unmodified: a docker-py script makes its sandbox with a label of its own
//   (strix-scan-id), its delete fails with 409 (a running container, no force), it swallows
//   that and exits: the sandbox is reaped within lease_grace + 1 s of the run's end; while the
//   run lives it is never touched;
// - `reaperctl run` itself killed with SIGKILL: the lease drops with it, and the tool's
//   containers are reaped after lease_grace.
// - reaperd knows the lease comes with a proxy: status shows what it labelled, and the
//   session's end in the journal names it.
#include "daemon_fixture.hpp"
#include "engine.hpp"

#include <fstream>

using namespace reaperd::itest;

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto lease_grace = 2s;  // the fixture's default

long long ms_since(Clock::time_point start) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

struct LeaseFixture {
    LeaseFixture() {
        daemon.start();
        char pattern[] = "/tmp/own-lease.XXXXXX";
        dir = ::mkdtemp(pattern);
        std::ofstream(dir + "/strix.py") << R"PY(
import os
import docker

client = docker.from_env()
scan = os.environ["SCAN_ID"]
sandbox = client.containers.run("reaper-test/busybox:latest", ["sleep", "600"], detach=True,
                                network_mode="none", labels={"strix-scan-id": scan},
                                name="strix-scan-" + scan)
print(sandbox.id, flush=True)
try:
    client.api.remove_container(sandbox.id)  # no force: the engine answers 409
except docker.errors.APIError as e:
    print("delete failed:", e.status_code, flush=True)  # swallowed, as the seed does
)PY";
    }
    ~LeaseFixture() {
        std::error_code ec;
        fs::remove_all(dir, ec);
    }

    std::unique_ptr<Child> run_own(const std::string& session, const std::vector<std::string>& command,
                                   const std::string& scan_id = "") {
        return std::make_unique<Child>(dir, own_run_argv(daemon.socket, session, command),
                                       std::vector<std::string>{
                                           "DOCKER_HOST=" + reaper::test::engine().address(),
                                           "OUT=" + dir,
                                           "SCAN_ID=" + scan_id,
                                       });
    }

    bool wait_file(const std::string& name) const {
        return eventually([&] { return fs::exists(dir + "/" + name); }, 120s);
    }

    Reaperd daemon;
    std::string dir;
};

// The id the strix script printed first.
std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace

// Within lease_grace + 1 s of the run's end, reaperd ends its session and asks the engine to
// remove the sandbox; the engine's force-remove takes the rest, longer on a loaded machine
// (own_clients_test says more), so the whole is reported and held to a generous bound.
BOOST_AUTO_TEST_CASE(the_strix_seed_is_reaped_within_lease_grace_plus_1s_of_the_run_ending) {
    LeaseFixture f;
    auto run = f.run_own("strix-ended", {"/usr/bin/python3", f.dir + "/strix.py"}, "scan-1");
    BOOST_REQUIRE_EQUAL(run->wait(), 0);
    const auto ended = Clock::now();
    const auto out = run->stdout_text();
    BOOST_TEST_MESSAGE("script:\n" << out << run->stderr_text());
    BOOST_TEST(out.find("delete failed: 409") != std::string::npos, out);
    const auto sandbox = first_line(out);
    BOOST_REQUIRE_EQUAL(sandbox.size(), 64u);

    BOOST_TEST(eventually([&] { return f.daemon.session_end_logged("strix-ended"); }, 30s),
               f.daemon.log_text());
    const auto session_ended = ms_since(ended);
    BOOST_TEST(eventually([&] { return !exists(sandbox); }, 30s), f.daemon.log_text());
    const auto took = ms_since(ended);
    BOOST_TEST_MESSAGE("the Strix run's session ended " << session_ended << " ms and its sandbox was reaped " << took
                                                        << " ms after the run ended (lease_grace 2000 ms)");
    BOOST_TEST(session_ended <= std::chrono::duration_cast<std::chrono::milliseconds>(lease_grace + 1s).count());
    BOOST_TEST(took - session_ended <= 20'000);
    BOOST_TEST(run->stderr_text().find("labelled 1 container, 0 networks, 0 volumes") != std::string::npos,
               run->stderr_text());
}

BOOST_AUTO_TEST_CASE(the_strix_seed_is_never_touched_while_the_run_lives) {
    LeaseFixture f;
    auto run = f.run_own("strix-alive",
                         {"/bin/sh", "-c", "/usr/bin/python3 " + f.dir + "/strix.py > $OUT/strix.out && "
                                           "touch $OUT/done && exec sleep 600"},
                         "scan-2");
    BOOST_REQUIRE(f.wait_file("done"));
    const auto out = slurp(f.dir + "/strix.out");
    BOOST_TEST(out.find("delete failed: 409") != std::string::npos, out);
    const auto sandbox = first_line(out);
    BOOST_REQUIRE_EQUAL(sandbox.size(), 64u);

    // Three lease_grace periods after the failed delete: still running, never acted on.
    std::this_thread::sleep_for(3 * lease_grace);
    BOOST_TEST(run->running());
    BOOST_TEST(engine_client().inspect(sandbox).state.running);
    BOOST_TEST(f.daemon.session_state("strix-alive") == "leased");
    BOOST_TEST(f.daemon.log_text().find(sandbox.substr(0, 12)) == std::string::npos, f.daemon.log_text());

    // The run ends (SIGTERM reaches the tool): then it goes.
    run->signal(SIGTERM);
    BOOST_TEST(run->wait() == 128 + SIGTERM);
    const auto ended = Clock::now();
    BOOST_TEST(eventually([&] { return !exists(sandbox); }, 30s), f.daemon.log_text());
    BOOST_TEST_MESSAGE("reaped " << ms_since(ended) << " ms after the run ended");
}

BOOST_AUTO_TEST_CASE(kill_9_of_reaperctl_run_drops_the_lease_and_the_tools_containers_go) {
    LeaseFixture f;
    auto run = f.run_own("killed-run",
                         {"/bin/sh", "-c",
                          "/usr/bin/docker run -d --network none reaper-test/busybox:latest sleep 600 > $OUT/id && "
                          "echo \"$DOCKER_HOST\" > $OUT/host && echo $$ > $OUT/pid.tmp && "
                          "mv $OUT/pid.tmp $OUT/pid && exec sleep 600"});
    BOOST_REQUIRE(f.wait_file("pid"));
    const auto id = first_line(slurp(f.dir + "/id"));
    const pid_t tool = std::stoi(slurp(f.dir + "/pid"));
    const auto socket_dir = fs::path(first_line(slurp(f.dir + "/host")).substr(7)).parent_path();
    BOOST_REQUIRE_EQUAL(id.size(), 64u);
    BOOST_TEST(engine_client().inspect(id).labels.at("reaperd.session") == "killed-run");

    run->signal(SIGKILL);
    BOOST_TEST(run->wait() == 128 + SIGKILL);
    const auto killed = Clock::now();
    BOOST_TEST(eventually([&] { return f.daemon.session_end_logged("killed-run"); }, 30s),
               f.daemon.log_text());
    const auto session_ended = ms_since(killed);
    BOOST_TEST(eventually([&] { return !exists(id); }, 30s), f.daemon.log_text());
    const auto took = ms_since(killed);
    BOOST_TEST_MESSAGE("session ended " << session_ended << " ms and its container reaped " << took
                                        << " ms after reaperctl run was killed (lease_grace 2000 ms)");
    // Ended not before the grace (the lease dropped at once), and not long after; the engine's
    // force-remove then takes what the machine's load makes it take.
    BOOST_TEST(session_ended >= 1500);
    BOOST_TEST(session_ended <= std::chrono::duration_cast<std::chrono::milliseconds>(lease_grace + 1s).count());
    BOOST_TEST(took - session_ended <= 20'000);

    // The orphaned tool and the socket dir a SIGKILL leaves behind are the test's to clean.
    ::kill(tool, SIGKILL);
    std::error_code ec;
    BOOST_TEST(socket_dir.string().find("reaperctl-own.") != std::string::npos);
    fs::remove_all(socket_dir, ec);
}

// reaperd knows that the session's lease comes with a proxy and what it labelled: status
// (JSON and table) while the run lives, and the journal line of the session's end.
BOOST_AUTO_TEST_CASE(status_shows_the_proxy_and_what_it_labelled_and_the_end_names_it) {
    LeaseFixture f;
    auto run = f.run_own("proxied",
                         {"/bin/sh", "-c",
                          "/usr/bin/docker create --network none reaper-test/busybox:latest sleep 600 > $OUT/ids && "
                          "/usr/bin/docker create --network none reaper-test/busybox:latest sleep 600 >> $OUT/ids && "
                          "touch $OUT/done && exec sleep 600"});
    BOOST_REQUIRE(f.wait_file("done"));
    auto status_json = [&] {
        Child status(f.dir, {REAPERCTL_PATH, "--socket", f.daemon.socket, "status", "--json"});
        BOOST_REQUIRE_EQUAL(status.wait(), 0);
        Poco::JSON::Parser parser;
        return parser.parse(status.stdout_text()).extract<Poco::JSON::Object::Ptr>();
    };
    auto session_of = [](const Poco::JSON::Object::Ptr& status, const std::string& id) {
        auto sessions = status->getArray("sessions");
        for (std::size_t i = 0; i < sessions->size(); ++i) {
            auto s = sessions->getObject(static_cast<unsigned>(i));
            if (s->getValue<std::string>("id") == id) return s;
        }
        return Poco::JSON::Object::Ptr();
    };
    // The keeper sends the counts at most once a second.
    Poco::JSON::Object::Ptr session;
    const bool labelled = eventually(
        [&] {
            session = session_of(status_json(), "proxied");
            return session && session->getValue<int>("containers_labelled") == 2;
        },
        10s);
    BOOST_REQUIRE_MESSAGE(labelled, "status never showed 2 containers labelled");
    BOOST_TEST(session->getValue<bool>("proxy"));
    BOOST_TEST(session->getValue<int>("networks_labelled") == 0);
    BOOST_TEST(session->getValue<int>("volumes_labelled") == 0);
    BOOST_TEST(session->getValue<std::string>("state") == "leased");

    Child table(f.dir, {REAPERCTL_PATH, "--socket", f.daemon.socket, "status"});
    BOOST_REQUIRE_EQUAL(table.wait(), 0);
    BOOST_TEST(table.stdout_text().find("CONTAINERS LABELLED") != std::string::npos, table.stdout_text());
    BOOST_TEST(table.stdout_text().find(" PROXY ") != std::string::npos, table.stdout_text());

    // A session without a proxy says so.
    Child hold(f.dir, {REAPERCTL_PATH, "--socket", f.daemon.socket, "hold", "unproxied"});
    BOOST_REQUIRE(eventually([&] { return f.daemon.session_state("unproxied") == "leased"; }));
    auto plain = session_of(status_json(), "unproxied");
    BOOST_REQUIRE(plain);
    BOOST_TEST(!plain->getValue<bool>("proxy"));
    BOOST_TEST(!plain->has("containers_labelled"));

    run->signal(SIGTERM);
    BOOST_TEST(run->wait() == 128 + SIGTERM);
    BOOST_TEST(eventually([&] {
        return f.daemon.log_text().find("its proxy labelled 2 containers, 0 networks, 0 volumes") != std::string::npos;
    }, 30s), f.daemon.log_text());
    const auto ids = slurp(f.dir + "/ids");
    BOOST_TEST(eventually([&] { return f.daemon.containers_of("proxied") == 0; }, 30s), ids);
}
