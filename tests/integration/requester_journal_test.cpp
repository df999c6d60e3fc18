// Who asked, read back from a real journald: the control server's lease, end and orphan
// records carry the requesting process's pid and uid (SO_PEERCRED) as REQUESTER_PID and
// REQUESTER_UID, and a uid over control.max_leases_per_uid is logged once, however often it
// retries. As in journal_test.cpp, a standalone systemd-journald runs in a private mount
// namespace and this executable is run again inside it as the program under test: it serves
// a control socket, and a child process of its own (another pid) is the client.
#include "control_server.hpp"
#include "private_journald.hpp"

#include "reaper/control.hpp"

#include <boost/test/unit_test.hpp>

#include <Poco/JSON/Object.h>
#include <Poco/JSON/Parser.h>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace control = reaper::control;

namespace {

// A handler with just enough to answer: the records under test are the server's own.
class QuietHandler : public reaperd::ControlHandler {
public:
    void lease_opened(const std::string&, std::uint64_t) override {}
    void lease_closed(const std::string&, std::uint64_t) override {}
    control::Reply end_session(const std::string& session) override {
        control::Reply reply;
        reply.session = session;
        return reply;
    }
    control::Reply orphan_reported(const std::string& container, const std::string& session) override {
        control::Reply reply;
        reply.container = container;
        reply.session = session;
        reply.queued = true;
        return reply;
    }
    std::string status_json(const control::StatusQuery&) override { return "{}"; }
    std::string metrics_text() override { return ""; }
};

// The client, in a process of its own: a lease, two more refused (the uid's limit is 1), an
// end and an orphan report; then it writes its pid and uid where the test finds them.
[[noreturn]] void run_client(const std::string& dir, const std::string& socket) {
    // The socket's path appears only once the server listens (it binds "<socket>.new" and
    // renames it), so its existence is the signal.
    for (int i = 0; i < 1000 && !std::filesystem::exists(socket); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds{10});
    int code = 0;
    try {
        control::ControlClient client(socket);
        auto lease = client.lease("journal-s1");
        for (int i = 0; i < 3; ++i) {
            try {
                client.lease("journal-s2");
                code = 2;  // accepted over the limit
            } catch (const control::ErrorReply&) {
            }
        }
        client.end("journal-s1");
        client.report_orphan("c0ffee0123456789", "journal-s1");
        lease->release();
        std::ofstream(dir + "/client") << ::getpid() << ' ' << ::getuid() << '\n';
    } catch (const std::exception& e) {
        std::ofstream(dir + "/client.err") << e.what() << '\n';
        code = 1;
    }
    std::_Exit(code);
}

// When this executable is started with REAPERD_REQUESTER_EMIT=<dir>, it is the program under
// test: it serves the control socket in <dir> to its client child, and exits before the
// tests start.
const bool emitter_ran = [] {
    const char* dir_env = std::getenv("REAPERD_REQUESTER_EMIT");
    if (dir_env == nullptr) return false;
    const std::string dir = dir_env;
    const std::string socket = dir + "/control.sock";
    const pid_t child = ::fork();
    if (child < 0) std::_Exit(3);
    if (child == 0) run_client(dir, socket);
    int status = 1;
    {
        QuietHandler handler;
        reaperd::ControlConfig config;
        config.socket = socket;
        reaperd::ControlServerLimits limits;
        limits.max_leases_per_uid = 1;
        reaperd::ControlServer server(config, handler, limits);
        server.start();
        ::waitpid(child, &status, 0);
        server.stop();
    }
    std::ofstream(dir + "/server") << ::getpid() << '\n';
    std::fflush(stderr);
    std::_Exit(WIFEXITED(status) ? WEXITSTATUS(status) : 4);
}();

using reaper::test::file_text;

// The emitter (this binary again) serves its client inside the private journald's namespace;
// its exit status is checked once journald has stored everything.
const char* const emitter_run = R"(
status=0
env -u JOURNAL_STREAM -u REAPERD_LOG_TARGET REAPERD_REQUESTER_EMIT="$dir" "$self" 2>"$dir/emitter.err" </dev/null || status=$?
)";
const char* const emitter_checked = R"(
[ "$status" = 0 ] || { echo "emitter exited $status"; cat "$dir/emitter.err" "$dir/client.err" 2>/dev/null; exit 1; }
)";

std::string field(const Poco::JSON::Object::Ptr& record, const std::string& name) {
    if (!record->has(name)) return "<missing>";
    return record->getValue<std::string>(name);
}

}  // namespace

BOOST_AUTO_TEST_CASE(lease_end_and_orphan_records_name_the_client_process_and_its_uid) {
    BOOST_REQUIRE(!emitter_ran);
    reaper::test::PrivateJournald run("reaperd-requester-journal-test", emitter_run, emitter_checked);
    BOOST_TEST_INFO("driver output:\n" << run.output());
    std::istringstream client(file_text(run.dir() / "client"));
    std::string client_pid;
    std::string client_uid;
    client >> client_pid >> client_uid;
    BOOST_REQUIRE(!client_pid.empty());
    BOOST_TEST(client_uid == std::to_string(::getuid()));
    std::string server_pid = file_text(run.dir() / "server");
    server_pid.erase(server_pid.find_last_not_of('\n') + 1);
    BOOST_REQUIRE(!server_pid.empty());
    BOOST_TEST(client_pid != server_pid);  // the requester is the client, not the server

    const auto records = run.records("_PID=" + server_pid);
    std::vector<Poco::JSON::Object::Ptr> requests;
    std::vector<Poco::JSON::Object::Ptr> refusals;
    for (const auto& record : records) {
        const auto message = field(record, "MESSAGE");
        if (message.rfind("control: ", 0) == 0) requests.push_back(record);
        if (message.find("refusing leases") != std::string::npos) refusals.push_back(record);
    }
    BOOST_REQUIRE_EQUAL(requests.size(), 3u);  // the refused leases are not logged as requests
    const std::array<std::string, 3> expected{"control: lease session journal-s1",
                                              "control: end session journal-s1",
                                              "control: orphan session journal-s1 container c0ffee0123456789"};
    for (std::size_t i = 0; i < requests.size(); ++i) {
        BOOST_TEST_CONTEXT(expected[i]) {
            BOOST_TEST(field(requests[i], "MESSAGE").rfind(expected[i], 0) == 0u, field(requests[i], "MESSAGE"));
            BOOST_TEST(field(requests[i], "REQUESTER_PID") == client_pid);
            BOOST_TEST(field(requests[i], "REQUESTER_UID") == client_uid);
            BOOST_TEST(field(requests[i], "SESSION_ID") == "journal-s1");
            BOOST_TEST(field(requests[i], "_TRANSPORT") == "journal");
        }
    }
    BOOST_TEST(field(requests[2], "CONTAINER_REF") == "c0ffee0123456789");

    // Three refusals in a row, one record.
    BOOST_REQUIRE_EQUAL(refusals.size(), 1u);
    BOOST_TEST(field(refusals[0], "REQUESTER_PID") == client_pid);
    BOOST_TEST(field(refusals[0], "REQUESTER_UID") == client_uid);
    BOOST_TEST(field(refusals[0], "LIMIT") == "1");
    BOOST_TEST(field(refusals[0], "MESSAGE").find("control.max_leases_per_uid") != std::string::npos);
}
