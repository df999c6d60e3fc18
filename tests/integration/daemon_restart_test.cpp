// reaperd across faults of the engine and of itself: the engine SIGKILLed and restarted
// under it, reaperd SIGKILLed and restarted (pending reaps, lease deadlines and tombstones
// kept), a corrupt state file, and SIGHUP with a good and a bad config.
#include "daemon_fixture.hpp"

#include <Poco/Net/ServerSocket.h>
#include <Poco/Net/SocketAddress.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>

using namespace reaperd::itest;

namespace {
Poco::JSON::Object::Ptr session_of(const Reaperd& d, const std::string& id) {
    auto sessions = d.status()->getArray("sessions");
    for (std::size_t i = 0; i < sessions->size(); ++i) {
        auto s = sessions->getObject(static_cast<unsigned>(i));
        if (s->getValue<std::string>("id") == id) return s;
    }
    return nullptr;
}
}  // namespace

BOOST_AUTO_TEST_CASE(engine_killed_while_a_session_ends_is_reaped_once_back_by_the_same_process) {
    Reaperd d;
    d.start();
    pid_t pid = d.pid();
    std::string a = run_container(session_label("eng-1"));
    std::string bystander = run_container({{"app", "keep-me"}});
    auto lease = d.control().lease("eng-1");
    BOOST_REQUIRE(eventually([&] { return d.containers_of("eng-1") == 1; }));

    reaper::test::engine().kill();
    BOOST_TEST(eventually([&] { return d.status()->getValue<std::string>("engine") == "down"; }));
    lease->release();
    BOOST_TEST(eventually([&] { return d.session_state("eng-1") == "ended"; }));
    BOOST_TEST(eventually([&] { return d.pending_reaps() == 1; }));
    std::this_thread::sleep_for(3s);  // a few failed attempts while the engine is away
    BOOST_TEST(d.running());

    reaper::test::engine().start();
    BOOST_TEST(eventually([&] { return !exists(a); }));
    BOOST_TEST(eventually([&] { return d.pending_reaps() == 0; }));
    BOOST_TEST(d.running());
    BOOST_TEST(d.pid() == pid);
    // The watcher re-lists on its own backoff (up to retry_max), so a retried removal can
    // finish before it reports the engine up again (seen under ASan).
    BOOST_TEST(eventually([&] { return d.status()->getValue<std::string>("engine") == "up"; }));
    BOOST_TEST(exists(bystander));
    BOOST_TEST(d.log_count("engine lost") == 1u);
    BOOST_TEST(d.log_count("engine is back") == 1u);
    BOOST_TEST(d.log_count("container reaped") == 1u);
}

BOOST_AUTO_TEST_CASE(sigkill_keeps_tombstones_and_lease_deadlines) {
    Reaperd d("  lease_grace: 25s\n");
    d.start();
    d.control().end("tomb-1");
    std::string in_grace = run_container(session_label("grace-1"));
    std::string held = run_container(session_label("held-1"));
    auto held_lease = d.control().lease("held-1");
    {
        auto lease = d.control().lease("grace-1");
        BOOST_REQUIRE(eventually([&] { return d.containers_of("grace-1") == 1 && d.containers_of("held-1") == 1; }));
    }
    BOOST_REQUIRE(eventually([&] { return d.session_state("grace-1") == "grace"; }));
    auto grace_deadline = session_of(d, "grace-1")->getValue<std::string>("deadline");
    BOOST_REQUIRE(d.session_state("held-1") == "leased");
    BOOST_REQUIRE(d.session_state("tomb-1") == "ended");

    d.sigkill();
    held_lease.reset();
    d.start();

    BOOST_TEST(d.session_state("tomb-1") == "ended");
    BOOST_TEST(d.session_state("grace-1") == "grace");
    BOOST_TEST(session_of(d, "grace-1")->getValue<std::string>("deadline") == grace_deadline);
    // It held a lease when killed: a fresh lease_grace to come back.
    BOOST_TEST(d.session_state("held-1") == "grace");
    BOOST_TEST(session_of(d, "held-1")->getValue<long>("deadline_in_ms") > 15000);
    auto back = d.control().lease("held-1");
    BOOST_TEST(eventually([&] { return d.session_state("held-1") == "leased"; }));

    std::string late = run_container(session_label("tomb-1"), false);  // reaped on create: no start
    BOOST_TEST(eventually([&] { return !exists(late); }));
    BOOST_TEST(exists(in_grace));
    BOOST_TEST(eventually([&] { return !exists(in_grace); }));
    BOOST_TEST(exists(held));
}

BOOST_AUTO_TEST_CASE(sigkill_keeps_pending_reaps_while_the_engine_is_down) {
    Reaperd d;
    d.start();
    std::string a = run_container(session_label("pend-1"));
    BOOST_REQUIRE(eventually([&] { return d.containers_of("pend-1") == 1; }));
    reaper::test::engine().kill();
    BOOST_REQUIRE(eventually([&] { return d.status()->getValue<std::string>("engine") == "down"; }));
    d.control().end("pend-1");
    BOOST_REQUIRE(eventually([&] { return d.pending_reaps() == 1; }));

    d.sigkill();
    d.start(false);  // the engine is still down: it answers, but is not ready
    BOOST_TEST(d.pending_reaps() == 1u);
    auto pending = d.status()->getArray("pending")->getObject(0);
    BOOST_TEST(pending->getValue<std::string>("container") == a);
    BOOST_TEST(pending->getValue<std::string>("session") == "pend-1");
    BOOST_TEST(!d.ready());

    reaper::test::engine().start();
    BOOST_TEST(eventually([&] { return d.ready(); }));
    BOOST_TEST(eventually([&] { return !exists(a); }));
    BOOST_TEST(eventually([&] { return d.pending_reaps() == 0; }));
}

BOOST_AUTO_TEST_CASE(a_corrupt_state_file_is_kept_aside_and_rebuilt_from_the_engine) {
    Reaperd d;
    std::string a = run_container(session_label("corrupt-1"));
    fs::create_directories(d.dir + "/state");
    std::ofstream(d.dir + "/state/state.json") << "{\"version\":1,\"sessions\":[{\"id\":";
    d.start();
    BOOST_TEST(d.log_count("state file is corrupt") == 1u);
    bool kept_aside = false;
    for (const auto& entry : fs::directory_iterator(d.dir + "/state"))
        kept_aside |= entry.path().filename().string().rfind("state.json.corrupt-", 0) == 0;
    BOOST_TEST(kept_aside);
    BOOST_TEST(eventually([&] { return d.containers_of("corrupt-1") == 1; }));
    d.control().end("corrupt-1");
    BOOST_TEST(eventually([&] { return !exists(a); }));
}

BOOST_AUTO_TEST_CASE(sighup_applies_a_good_config_and_keeps_the_old_one_on_a_bad_one) {
    Reaperd d("  lease_grace: 60s\n");
    d.start();
    std::ofstream(d.dir + "/reaperd.yaml", std::ios::app) << "bogus_key: 1\n";
    ::kill(d.pid(), SIGHUP);
    BOOST_TEST(eventually([&] { return d.log_count("configuration not reloaded") == 1; }));
    BOOST_TEST(d.log_text().find("bogus_key") != std::string::npos);
    BOOST_TEST(d.running());

    d.write_config("  lease_grace: 1s\n", "");
    ::kill(d.pid(), SIGHUP);
    BOOST_TEST(eventually([&] { return d.log_count("configuration reloaded") == 1; }));
    std::string a = run_container(session_label("hup-1"));
    { auto lease = d.control().lease("hup-1"); }
    BOOST_TEST(eventually([&] { return !exists(a); }, 30s));
}

// A state file that cannot be read stops reaperd with the reason, and stays where it is: its
// pending reaps and tombstones must not be forgotten by starting empty (issue 10).
BOOST_AUTO_TEST_CASE(an_unreadable_state_file_stops_reaperd_and_is_left_alone) {
    Reaperd d;
    fs::create_directories(d.dir + "/state/state.json");  // a directory: read fails with EISDIR
    const auto started = std::chrono::steady_clock::now();
    const int status = std::system((std::string(REAPERD_PATH) + " --config " + d.dir + "/reaperd.yaml >" + d.dir +
                                    "/out.log 2>&1")
                                       .c_str());
    const auto took = std::chrono::steady_clock::now() - started;
    std::ifstream in(d.dir + "/out.log");
    const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    BOOST_TEST(WEXITSTATUS(status) == 1, out);
    BOOST_TEST(out.find("state.json: cannot be read") != std::string::npos, out);
    BOOST_TEST(out.find("not forgotten") != std::string::npos, out);
    BOOST_TEST(out.find("corrupt") == std::string::npos, out);
    BOOST_TEST(fs::is_directory(d.dir + "/state/state.json"));
    BOOST_TEST(took < 10s);
}

// Configuration that fails only when put to use still exits 78, located in the file, so
// systemd's RestartPreventExitStatus=78 stops the restart loop (issue 10).
BOOST_AUTO_TEST_CASE(start_up_config_failures_exit_78_located) {
    Poco::Net::ServerSocket taken(Poco::Net::SocketAddress("127.0.0.1", 0));
    const std::string port = std::to_string(taken.address().port());
    struct Case {
        std::string after;   // the fixture's line the failing key goes under
        std::string line;    // the failing key's line
        std::string expected;
    };
    const Case cases[] = {
        {"control:\n", "  group: no-such-group-reaperd\n", "control.group: no such group \"no-such-group-reaperd\""},
        {"", "metrics:\n  listen: 127.0.0.1:" + port + "\n", "metrics.listen: cannot listen on"},
    };
    for (const auto& c : cases) {
        Reaperd d;
        std::ifstream base_in(d.dir + "/reaperd.yaml");
        std::string yaml((std::istreambuf_iterator<char>(base_in)), std::istreambuf_iterator<char>());
        const auto at = c.after.empty() ? yaml.size() : yaml.find(c.after) + c.after.size();
        yaml.insert(at, c.line);
        std::ofstream(d.dir + "/reaperd.yaml") << yaml;
        // The value's place: 1-based line of its last line, column after "key: ".
        const auto value_at = yaml.find(": ", at + c.line.rfind('\n', c.line.size() - 2) + 1) + 2;
        const auto line = 1 + std::count(yaml.begin(), yaml.begin() + static_cast<long>(value_at), '\n');
        const auto column = value_at - yaml.rfind('\n', value_at) ;
        const int status = std::system((std::string(REAPERD_PATH) + " --config " + d.dir + "/reaperd.yaml >" +
                                        d.dir + "/out.log 2>&1")
                                           .c_str());
        std::ifstream in(d.dir + "/out.log");
        const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        BOOST_TEST(WEXITSTATUS(status) == 78, out);
        const std::string located = d.dir + "/reaperd.yaml:" + std::to_string(line) + ":" + std::to_string(column) +
                                    ": " + c.expected;
        BOOST_TEST(out.find(located) != std::string::npos, located << " in: " << out);
    }
}
