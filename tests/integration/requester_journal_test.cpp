// Who asked, read back from a real journald: the control server's lease, end and orphan
// records carry the requesting process's pid and uid (SO_PEERCRED) as REQUESTER_PID and
// REQUESTER_UID, and a uid over control.max_leases_per_uid is logged once, however often it
// retries. As in journal_test.cpp, a standalone systemd-journald runs in a private mount
// namespace and this executable is run again inside it as the program under test: it serves
// a control socket, and a child process of its own (another pid) is the client.
#include "control_server.hpp"

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

std::string run_output(const std::string& command) {
    std::string out;
    FILE* pipe = popen(command.c_str(), "r");
    BOOST_REQUIRE(pipe != nullptr);
    std::array<char, 4096> buf{};
    std::size_t n = 0;
    while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
    int status = pclose(pipe);
    BOOST_TEST_INFO("command: " << command << "\noutput:\n" << out);
    BOOST_REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return out;
}

std::string file_text(const std::filesystem::path& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

struct JournalRun {
    std::filesystem::path dir;
    std::string script_output;

    JournalRun() {
        char tmpl[] = "/tmp/reaperd-requester-journal-test.XXXXXX";
        BOOST_REQUIRE(mkdtemp(tmpl) != nullptr);
        dir = tmpl;
        std::filesystem::create_directories(dir / "storage");
        const std::string self = std::filesystem::read_symlink("/proc/self/exe");
        const std::string script = R"(
set -e
dir=$1 self=$2
mount -n -t tmpfs tmpfs /run
mkdir -p /run/systemd/journal /run/log/journal /run/systemd/journald.conf.d
mount -n --bind "$dir/storage" /run/log/journal
printf '[Journal]\nStorage=volatile\nReadKMsg=no\nForwardToSyslog=no\nForwardToWall=no\nAudit=no\nRateLimitIntervalSec=0\n' \
  >/run/systemd/journald.conf.d/test.conf
/lib/systemd/systemd-journald >"$dir/journald.log" 2>&1 &
journald=$!
for _ in $(seq 1 400); do [ -S /run/systemd/journal/socket ] && break; sleep 0.05; done
[ -S /run/systemd/journal/socket ] || { echo "journald did not start"; cat "$dir/journald.log"; exit 1; }
status=0
env -u JOURNAL_STREAM -u REAPERD_LOG_TARGET REAPERD_REQUESTER_EMIT="$dir" "$self" 2>"$dir/emitter.err" </dev/null || status=$?
journalctl --sync
kill -TERM "$journald"
wait "$journald" || true
[ "$status" = 0 ] || { echo "emitter exited $status"; cat "$dir/emitter.err" "$dir/client.err" 2>/dev/null; exit 1; }
)";
        std::ofstream(dir / "run.sh") << script;
        script_output = run_output("unshare --mount --propagation private bash " + (dir / "run.sh").string() +
                                   " " + dir.string() + " " + self + " 2>&1");
    }
    ~JournalRun() {
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
    }

    // Every record the emitter's process stored, as journalctl's JSON objects, in order.
    std::vector<Poco::JSON::Object::Ptr> records(const std::string& server_pid) {
        const std::string out = run_output("journalctl --no-pager -D " + (dir / "storage").string() +
                                           " -o json _PID=" + server_pid);
        std::vector<Poco::JSON::Object::Ptr> result;
        std::istringstream lines(out);
        std::string line;
        while (std::getline(lines, line)) {
            if (line.empty() || line.front() != '{') continue;
            Poco::JSON::Parser parser;
            result.push_back(parser.parse(line).extract<Poco::JSON::Object::Ptr>());
        }
        return result;
    }
};

std::string field(const Poco::JSON::Object::Ptr& record, const std::string& name) {
    if (!record->has(name)) return "<missing>";
    return record->getValue<std::string>(name);
}

}  // namespace

BOOST_AUTO_TEST_CASE(lease_end_and_orphan_records_name_the_client_process_and_its_uid) {
    BOOST_REQUIRE(!emitter_ran);
    JournalRun run;
    BOOST_TEST_INFO("driver output:\n" << run.script_output);
    std::istringstream client(file_text(run.dir / "client"));
    std::string client_pid;
    std::string client_uid;
    client >> client_pid >> client_uid;
    BOOST_REQUIRE(!client_pid.empty());
    BOOST_TEST(client_uid == std::to_string(::getuid()));
    std::string server_pid = file_text(run.dir / "server");
    server_pid.erase(server_pid.find_last_not_of('\n') + 1);
    BOOST_REQUIRE(!server_pid.empty());
    BOOST_TEST(client_pid != server_pid);  // the requester is the client, not the server

    const auto records = run.records(server_pid);
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
