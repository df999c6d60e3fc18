// reaperctl as a child process against a ControlServer running inside this test process
// with a recording handler: what reaperctl sends, when leases open and close, exit codes;
// then against a real reaperd and the private engine: what `end --wait` and `orphan` say.
#include "control_server.hpp"
#include "daemon_fixture.hpp"

#include "reaper/control.hpp"

#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace control = reaper::control;
using namespace std::chrono_literals;

namespace {

struct Event {
    std::string kind;
    std::string a;
    std::string b;
};

class RecordingHandler : public reaperd::ControlHandler {
public:
    void lease_opened(const std::string& session, std::uint64_t) override { record({"opened", session, ""}); }
    void lease_closed(const std::string& session, std::uint64_t) override { record({"closed", session, ""}); }
    control::Reply end_session(const std::string& session) override {
        if (session == "explode") throw std::runtime_error("the daemon is unwell");
        record({"end", session, ""});
        return {};
    }
    control::Reply orphan_reported(const std::string& container, const std::string& session) override {
        record({"orphan", container, session});
        return {};
    }
    std::string status_json(const reaper::control::StatusQuery& query) override {
        record({"status", query.ended ? "ended" : (query.pending ? "pending" : ""),
                query.limit ? std::to_string(*query.limit) : ""});
        return R"({"sessions":[{"id":"s1","state":"leased","leases":1}],"tracked_containers":3,)"
               R"("pending_reaps":[],"counters":{"reaps_done":7}})";
    }
    std::string metrics_text() override { return "# TYPE reaperd_reaps_total counter\nreaperd_reaps_total 7\n"; }

    std::size_t count(const std::string& kind, const std::string& a) {
        std::lock_guard lock(mutex_);
        return static_cast<std::size_t>(std::count_if(events_.begin(), events_.end(), [&](const Event& e) {
            return e.kind == kind && e.a == a;
        }));
    }
    std::vector<Event> events() {
        std::lock_guard lock(mutex_);
        return events_;
    }
    bool wait_for(const std::string& kind, const std::string& a, std::size_t n = 1,
                  std::chrono::seconds limit = 60s) {
        std::unique_lock lock(mutex_);
        return changed_.wait_for(lock, limit, [&] {
            return static_cast<std::size_t>(std::count_if(events_.begin(), events_.end(), [&](const Event& e) {
                       return e.kind == kind && e.a == a;
                   })) >= n;
        });
    }

private:
    void record(Event event) {
        {
            std::lock_guard lock(mutex_);
            events_.push_back(std::move(event));
        }
        changed_.notify_all();
    }
    std::mutex mutex_;
    std::condition_variable changed_;
    std::vector<Event> events_;
};

std::string make_temp_dir() {
    char dir_template[] = "/tmp/reaperctl-test.XXXXXX";
    return ::mkdtemp(dir_template);
}

std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

// One reaperctl child: stdin from a pipe we hold (or /dev/null), stdout and stderr to files.
class Reaperctl {
public:
    Reaperctl(const std::string& dir, std::vector<std::string> args, bool stdin_pipe = false,
              std::vector<std::string> extra_env = {}) {
        static int counter = 0;
        const auto stem = dir + "/out" + std::to_string(++counter);
        out_path_ = stem + ".stdout";
        err_path_ = stem + ".stderr";
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        int pipe_fds[2] = {-1, -1};
        if (stdin_pipe) {
            BOOST_REQUIRE(::pipe2(pipe_fds, O_CLOEXEC) == 0);
            posix_spawn_file_actions_adddup2(&actions, pipe_fds[0], STDIN_FILENO);
        } else {
            posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
        }
        posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path_.c_str(),
                                         O_WRONLY | O_CREAT | O_TRUNC, 0600);
        posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path_.c_str(),
                                         O_WRONLY | O_CREAT | O_TRUNC, 0600);
        args.insert(args.begin(), REAPERCTL_PATH);
        std::vector<char*> argv;
        for (auto& arg : args) argv.push_back(arg.data());
        argv.push_back(nullptr);
        std::vector<std::string> env_strings;
        for (char** entry = environ; *entry != nullptr; ++entry) {
            if (std::string_view(*entry).starts_with("REAPERD_")) continue;
            env_strings.emplace_back(*entry);
        }
        for (auto& entry : extra_env) env_strings.push_back(entry);
        std::vector<char*> envp;
        for (auto& entry : env_strings) envp.push_back(entry.data());
        envp.push_back(nullptr);
        const int rc = posix_spawn(&pid_, REAPERCTL_PATH, &actions, nullptr, argv.data(), envp.data());
        posix_spawn_file_actions_destroy(&actions);
        BOOST_REQUIRE_MESSAGE(rc == 0, "spawning reaperctl: " << std::strerror(rc));
        if (stdin_pipe) {
            ::close(pipe_fds[0]);
            stdin_ = pipe_fds[1];
        }
    }
    ~Reaperctl() {
        if (stdin_ >= 0) ::close(stdin_);
        if (!status_) {
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, nullptr, 0);
        }
    }

    void close_stdin() {
        ::close(stdin_);
        stdin_ = -1;
    }
    void signal(int number) { ::kill(pid_, number); }
    bool running() {
        if (status_) return false;
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG) == pid_) status_ = status;
        return !status_;
    }
    // The exit code (128+N for signal N); fails the test if it does not end within the limit.
    int wait(std::chrono::seconds limit = 60s) {
        const auto deadline = std::chrono::steady_clock::now() + limit;
        while (running()) {
            if (std::chrono::steady_clock::now() > deadline) {
                BOOST_FAIL("reaperctl did not exit; stderr: " << stderr_text());
            }
            std::this_thread::sleep_for(10ms);
        }
        return WIFEXITED(*status_) ? WEXITSTATUS(*status_) : 128 + WTERMSIG(*status_);
    }
    std::string stdout_text() const { return slurp(out_path_); }
    std::string stderr_text() const { return slurp(err_path_); }

private:
    pid_t pid_ = -1;
    int stdin_ = -1;
    std::optional<int> status_;
    std::string out_path_;
    std::string err_path_;
};

struct Fixture {
    Fixture() : dir(make_temp_dir()) {
        config.socket = dir + "/control.sock";
        server = std::make_unique<reaperd::ControlServer>(config, handler);
        server->start();
    }
    ~Fixture() {
        server.reset();
        std::filesystem::remove_all(dir);
    }
    std::vector<std::string> with_socket(std::vector<std::string> args) const {
        args.insert(args.begin(), {"--socket", config.socket});
        return args;
    }
    bool wait_for_file(const std::string& path, std::chrono::seconds limit = 60s) const {
        const auto deadline = std::chrono::steady_clock::now() + limit;
        while (!std::filesystem::exists(path)) {
            if (std::chrono::steady_clock::now() > deadline) return false;
            std::this_thread::sleep_for(10ms);
        }
        return true;
    }
    std::string dir;
    reaperd::ControlConfig config;
    RecordingHandler handler;
    std::unique_ptr<reaperd::ControlServer> server;
};

}  // namespace

BOOST_AUTO_TEST_CASE(hold_keeps_the_lease_until_stdin_closes) {
    Fixture f;
    Reaperctl hold(f.dir, f.with_socket({"hold", "script-1"}), true);
    BOOST_REQUIRE(f.handler.wait_for("opened", "script-1"));
    std::this_thread::sleep_for(300ms);
    BOOST_TEST(hold.running());
    BOOST_TEST(f.handler.count("closed", "script-1") == 0u);
    hold.close_stdin();
    BOOST_TEST(hold.wait() == 0);
    BOOST_TEST(f.handler.wait_for("closed", "script-1"));
    BOOST_TEST(hold.stdout_text().empty());
}

BOOST_AUTO_TEST_CASE(hold_with_dev_null_stdin_holds_until_killed) {
    Fixture f;
    Reaperctl hold(f.dir, f.with_socket({"hold", "background-job"}));
    BOOST_REQUIRE(f.handler.wait_for("opened", "background-job"));
    std::this_thread::sleep_for(300ms);
    BOOST_TEST(hold.running());
    hold.signal(SIGTERM);
    BOOST_TEST(hold.wait() == 0);
    BOOST_TEST(f.handler.wait_for("closed", "background-job"));
}

BOOST_AUTO_TEST_CASE(hold_takes_the_lease_again_after_a_daemon_restart) {
    Fixture f;
    Reaperctl hold(f.dir, f.with_socket({"hold", "survives-restart"}), true);
    BOOST_REQUIRE(f.handler.wait_for("opened", "survives-restart"));
    f.server.reset();  // stop: closes the lease without ending it
    RecordingHandler restarted;
    reaperd::ControlServer again(f.config, restarted);
    again.start();
    BOOST_TEST(restarted.wait_for("opened", "survives-restart"));
    BOOST_TEST(hold.running());
    hold.close_stdin();
    BOOST_TEST(hold.wait() == 0);
    BOOST_TEST(restarted.wait_for("closed", "survives-restart"));
    BOOST_TEST(hold.stderr_text().find("restored") != std::string::npos, hold.stderr_text());
}

BOOST_AUTO_TEST_CASE(run_passes_the_session_and_the_exit_status_through) {
    Fixture f;
    Reaperctl run(f.dir, f.with_socket({"run", "tool-7", "--", "/bin/sh", "-c",
                                        "test \"$REAPERD_SESSION\" = tool-7 && test -n \"$REAPERD_SOCKET\" && exit 7"}));
    BOOST_TEST(run.wait() == 7, run.stderr_text());
    BOOST_TEST(f.handler.count("opened", "tool-7") == 1u);
    BOOST_TEST(f.handler.wait_for("closed", "tool-7"));

    Reaperctl no_dashes(f.dir, f.with_socket({"run", "tool-0", "/bin/true"}));
    BOOST_TEST(no_dashes.wait() == 0, no_dashes.stderr_text());

    Reaperctl output(f.dir, f.with_socket({"run", "tool-out", "--", "/bin/echo", "--socket", "x"}));
    BOOST_TEST(output.wait() == 0);
    BOOST_TEST(output.stdout_text() == "--socket x\n");
}

BOOST_AUTO_TEST_CASE(run_reports_a_tool_killed_by_a_signal_as_128_plus_n) {
    Fixture f;
    Reaperctl run(f.dir, f.with_socket({"run", "killed", "--", "/bin/sh", "-c", "kill -KILL $$"}));
    BOOST_TEST(run.wait() == 128 + SIGKILL);
    BOOST_TEST(f.handler.wait_for("closed", "killed"));
}

BOOST_AUTO_TEST_CASE(run_forwards_sigterm_and_drops_the_lease) {
    Fixture f;
    const auto ready = f.dir + "/ready";
    Reaperctl run(f.dir, f.with_socket({"run", "forwarded", "--", "/bin/sh", "-c",
                                        "trap 'exit 42' TERM; touch " + ready + "; while :; do sleep 0.05; done"}));
    BOOST_REQUIRE(f.handler.wait_for("opened", "forwarded"));
    BOOST_REQUIRE(f.wait_for_file(ready));
    BOOST_TEST(f.handler.count("closed", "forwarded") == 0u);
    run.signal(SIGTERM);
    BOOST_TEST(run.wait() == 42, run.stderr_text());
    BOOST_TEST(f.handler.wait_for("closed", "forwarded"));

    // A tool that does not catch the signal dies of it, and reaperctl reports that.
    const auto ready2 = f.dir + "/ready2";
    Reaperctl plain(f.dir, f.with_socket({"run", "plain", "--", "/bin/sh", "-c",
                                          "touch " + ready2 + "; exec sleep 60"}));
    BOOST_REQUIRE(f.wait_for_file(ready2));
    std::this_thread::sleep_for(100ms);  // let sh exec sleep
    plain.signal(SIGUSR1);
    BOOST_TEST(plain.wait() == 128 + SIGUSR1);
    BOOST_TEST(f.handler.wait_for("closed", "plain"));
}

BOOST_AUTO_TEST_CASE(run_without_a_daemon_runs_the_tool_with_a_warning) {
    const auto dir = make_temp_dir();
    Reaperctl run(dir, {"--socket", dir + "/missing.sock", "run", "lonely", "--", "/bin/sh", "-c", "exit 3"});
    BOOST_TEST(run.wait() == 3);
    BOOST_TEST(run.stderr_text().find("without a lease") != std::string::npos, run.stderr_text());
    BOOST_TEST(run.stderr_text().find(dir + "/missing.sock") != std::string::npos);

    Reaperctl missing_tool(dir, {"--socket", dir + "/missing.sock", "run", "s", "--", "/no/such/tool"});
    BOOST_TEST(missing_tool.wait() == 127);
    BOOST_TEST(missing_tool.stderr_text().find("cannot run /no/such/tool") != std::string::npos,
               missing_tool.stderr_text());
    std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(end_and_orphan_reach_the_handler) {
    Fixture f;
    Reaperctl end(f.dir, f.with_socket({"end", "finished"}));
    BOOST_TEST(end.wait() == 0, end.stderr_text());
    BOOST_TEST(f.handler.count("end", "finished") == 1u);

    Reaperctl orphan(f.dir, f.with_socket({"orphan", "abc123", "--session", "s9"}));
    BOOST_TEST(orphan.wait() == 0, orphan.stderr_text());
    Reaperctl bare_orphan(f.dir, f.with_socket({"orphan", "def456"}));
    BOOST_TEST(bare_orphan.wait() == 0, bare_orphan.stderr_text());
    const auto events = f.handler.events();
    BOOST_REQUIRE(events.size() == 3u);
    BOOST_TEST(events[1].kind == "orphan");
    BOOST_TEST(events[1].a == "abc123");
    BOOST_TEST(events[1].b == "s9");
    BOOST_TEST(events[2].a == "def456");
    BOOST_TEST(events[2].b == "");

    Reaperctl refused(f.dir, f.with_socket({"end", "explode"}));
    BOOST_TEST(refused.wait() == 1);
    BOOST_TEST(refused.stderr_text().find("the daemon is unwell") != std::string::npos, refused.stderr_text());
}

BOOST_AUTO_TEST_CASE(status_and_metrics_print_what_the_daemon_says) {
    Fixture f;
    Reaperctl status(f.dir, f.with_socket({"status"}));
    BOOST_TEST(status.wait() == 0, status.stderr_text());
    const auto table = status.stdout_text();
    BOOST_TEST(table.find("sessions (1):") != std::string::npos, table);
    BOOST_TEST(table.find("tracked containers: 3") != std::string::npos, table);
    BOOST_TEST(table.find("reaps done: 7") != std::string::npos, table);

    Reaperctl json(f.dir, f.with_socket({"status", "--json"}));
    BOOST_TEST(json.wait() == 0);
    BOOST_TEST(json.stdout_text() == f.handler.status_json({}) + "\n");

    // --ended and --limit reach the daemon as the status op's fields.
    Reaperctl ended(f.dir, f.with_socket({"status", "--ended", "--limit", "4", "--json"}));
    BOOST_TEST(ended.wait() == 0, ended.stderr_text());
    BOOST_TEST(f.handler.count("status", "ended") == 1u);
    const auto asked = f.handler.events();
    BOOST_TEST((std::find_if(asked.begin(), asked.end(), [](const Event& e) {
                    return e.kind == "status" && e.a == "ended" && e.b == "4";
                }) != asked.end()));
    // So do --pending and --limit.
    Reaperctl pending(f.dir, f.with_socket({"status", "--pending", "--limit", "7", "--json"}));
    BOOST_TEST(pending.wait() == 0, pending.stderr_text());
    const auto asked_pending = f.handler.events();
    BOOST_TEST((std::find_if(asked_pending.begin(), asked_pending.end(), [](const Event& e) {
                    return e.kind == "status" && e.a == "pending" && e.b == "7";
                }) != asked_pending.end()));

    Reaperctl metrics(f.dir, f.with_socket({"metrics"}));
    BOOST_TEST(metrics.wait() == 0);
    BOOST_TEST(metrics.stdout_text() == f.handler.metrics_text());

    // The socket from the environment when --socket is absent.
    Reaperctl from_env(f.dir, {"end", "via-env"}, false, {"REAPERD_SOCKET=" + f.config.socket});
    BOOST_TEST(from_env.wait() == 0, from_env.stderr_text());
    BOOST_TEST(f.handler.count("end", "via-env") == 1u);
}

BOOST_AUTO_TEST_CASE(unreachable_daemon_exits_69_naming_the_socket) {
    const auto dir = make_temp_dir();
    const auto path = dir + "/nobody.sock";
    for (const auto& args : std::vector<std::vector<std::string>>{
             {"end", "s"}, {"status"}, {"hold", "s"}, {"orphan", "c"}, {"metrics"}}) {
        auto full = args;
        full.insert(full.begin(), {"--socket", path});
        Reaperctl ctl(dir, full);
        BOOST_TEST_CONTEXT(args[0]) {
            BOOST_TEST(ctl.wait() == 69);
            BOOST_TEST(ctl.stderr_text().find(path) != std::string::npos, ctl.stderr_text());
            BOOST_TEST(ctl.stderr_text().find("No such file or directory") != std::string::npos);
        }
    }
    std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(usage_errors_exit_64) {
    const auto dir = make_temp_dir();
    for (const auto& args : std::vector<std::vector<std::string>>{
             {}, {"frobnicate"}, {"end"}, {"end", "a", "b"}, {"end", "bad id"}, {"status", "--bogus"},
             {"run", "s"}, {"run"}, {"--socket"}, {"orphan"}, {"hold", ""},
             {"end", "s", "--timeout", "5s"}, {"end", "s", "--wait", "--timeout", "soon"},
             {"end", "s", "--wait", "--timeout"}, {"hold", "s", "--wait"}, {"run", "--json", "s", "true"},
             {"status", "--limit"}, {"status", "--limit", "-1"}, {"status", "--limit=many"},
             {"end", "s", "--ended"}, {"status", "--ended", "--pending"}, {"end", "s", "--pending"}}) {
        Reaperctl ctl(dir, args);
        BOOST_TEST_CONTEXT((args.empty() ? std::string("(none)") : args[0])) {
            BOOST_TEST(ctl.wait() == 64, ctl.stderr_text());
            BOOST_TEST(!ctl.stderr_text().empty());
        }
    }
    Reaperctl help(dir, {"--help"});
    BOOST_TEST(help.wait() == 0);
    BOOST_TEST(help.stdout_text().find("reaperctl hold") == std::string::npos);
    BOOST_TEST(help.stdout_text().find("hold SESSION") != std::string::npos);
    Reaperctl version(dir, {"--version"});
    BOOST_TEST(version.wait() == 0);
    BOOST_TEST(version.stdout_text().starts_with("reaperctl "));
    std::filesystem::remove_all(dir);
}

// ---- against a real reaperd and the private engine ------------------------------------------

namespace {

namespace itest = reaperd::itest;
using Clock = std::chrono::steady_clock;

std::vector<Poco::JSON::Object::Ptr> json_lines(const std::string& text) {
    std::vector<Poco::JSON::Object::Ptr> objects;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
        Poco::JSON::Parser parser;
        objects.push_back(parser.parse(line).extract<Poco::JSON::Object::Ptr>());
    }
    return objects;
}

long long ms_since(Clock::time_point start) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

}  // namespace

BOOST_AUTO_TEST_CASE(end_wait_returns_once_the_sessions_containers_are_gone) {
    itest::Reaperd d;
    d.start();
    const auto dir = make_temp_dir();
    const std::vector<std::string> ids{itest::run_container(itest::session_label("wait-1")),
                                       itest::run_container(itest::session_label("wait-1"))};
    BOOST_REQUIRE(itest::eventually([&] { return d.containers_of("wait-1") == 2; }));

    const auto start = Clock::now();
    Reaperctl end(dir, {"--socket", d.socket, "end", "wait-1", "--wait", "--timeout", "60s"});
    BOOST_TEST(end.wait() == 0, end.stderr_text());
    BOOST_TEST_MESSAGE("end --wait returned " << ms_since(start) << " ms after it started");
    for (const auto& id : ids) BOOST_TEST(!itest::exists(id), id << " still there when end --wait returned");
    const auto out = end.stdout_text();
    BOOST_TEST(out.starts_with("session wait-1 ended; 2 containers queued for reaping\n"), out);
    BOOST_TEST(out.find("session wait-1: nothing left (waited ") != std::string::npos, out);

    // Nothing is left now: it returns at once. --json passes both of reaperd's replies through.
    Reaperctl again(dir, {"--socket", d.socket, "end", "wait-1", "--wait", "--json"});
    BOOST_TEST(again.wait() == 0, again.stderr_text());
    const auto replies = json_lines(again.stdout_text());
    BOOST_REQUIRE(replies.size() == 2u);
    BOOST_TEST(replies[0]->getValue<bool>("already_ended"));
    BOOST_TEST(replies[0]->getObject("reaps_queued")->getValue<int>("containers") == 0);
    BOOST_TEST(replies[1]->getValue<bool>("ready"));
    BOOST_TEST(replies[1]->getValue<std::string>("state") == "ended");
    BOOST_TEST(replies[1]->getObject("remaining")->getValue<int>("containers") == 0);
    std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(end_wait_times_out_with_75_while_a_container_cannot_be_removed) {
    itest::Reaperd d;
    d.start();
    const auto dir = make_temp_dir();
    const auto id = itest::run_container(itest::session_label("stuck-1"));
    BOOST_REQUIRE(itest::eventually([&] { return d.containers_of("stuck-1") == 1; }));
    reaper::test::RemovalPin pin(id);

    const auto start = Clock::now();
    Reaperctl end(dir, {"--socket", d.socket, "end", "stuck-1", "--wait", "--timeout", "1500ms"});
    BOOST_TEST(end.wait() == 75, end.stderr_text());
    const auto took = ms_since(start);
    BOOST_TEST_MESSAGE("end --wait --timeout 1500ms gave up after " << took << " ms");
    BOOST_TEST(took >= 1500);
    BOOST_TEST(end.stderr_text().find("session stuck-1: timed out after 1500ms: 1 container still there; "
                                      "reaperd keeps reaping") != std::string::npos,
               end.stderr_text());
    BOOST_TEST(end.stdout_text() == "session stuck-1 ended; 1 container queued for reaping\n");
    BOOST_TEST(itest::exists(id));

    // Once the engine can remove it, reaperd's retry does, and a second wait sees it go.
    pin.release();
    Reaperctl later(dir, {"--socket", d.socket, "end", "stuck-1", "--wait", "--timeout", "60s"});
    BOOST_TEST(later.wait() == 0, later.stderr_text());
    // reaperd's retry may remove it before this second end arrives (once in 26 runs beside two
    // CPU-bound loops): then nothing is left to queue.
    const auto again = later.stdout_text();
    BOOST_TEST((again.starts_with("session stuck-1 had already ended; 1 container queued") ||
                again.starts_with("session stuck-1 had already ended; nothing to reap")),
               again);
    BOOST_TEST(!itest::exists(id));
    std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(orphan_replies_name_the_full_id_and_whether_it_was_queued) {
    itest::Reaperd d;
    d.start();
    const auto dir = make_temp_dir();
    const auto owned = itest::run_container(itest::session_label("orphan-1"));
    Reaperctl orphan(dir, {"--socket", d.socket, "orphan", owned.substr(0, 12)});
    BOOST_TEST(orphan.wait() == 0, orphan.stderr_text());
    const auto out = orphan.stdout_text();
    BOOST_TEST(out.find("(" + owned + ") of session orphan-1: queued for reaping") != std::string::npos, out);
    BOOST_TEST(itest::eventually([&] { return !itest::exists(owned); }));

    // Not owned: refused, and the reply still says what the prefix resolved to.
    const auto stranger = itest::run_container({{"app", "db"}});
    Reaperctl refused(dir, {"--socket", d.socket, "orphan", stranger.substr(0, 12), "--json"});
    BOOST_TEST(refused.wait() == 1);
    BOOST_TEST(refused.stderr_text().find("reaperd does not own it; not reaped") != std::string::npos,
               refused.stderr_text());
    const auto replies = json_lines(refused.stdout_text());
    BOOST_REQUIRE(replies.size() == 1u);
    BOOST_TEST(!replies[0]->getValue<bool>("ok"));
    BOOST_TEST(replies[0]->getValue<std::string>("container") == stranger);
    BOOST_TEST(!replies[0]->getValue<bool>("owned"));
    BOOST_TEST(!replies[0]->getValue<bool>("queued"));
    BOOST_TEST(itest::exists(stranger));
    itest::engine_client().remove(stranger, {true, true});
    std::filesystem::remove_all(dir);
}

// A label value is the engine's, and any user of the engine may set it: what reaperctl shows
// of it on a terminal, on stdout or in a refusal on stderr, and what reaperd logs of it carry
// no control character (units_test has the rules of reaper::terminal_safe).
BOOST_AUTO_TEST_CASE(a_label_that_would_drive_the_terminal_is_shown_escaped) {
    itest::Reaperd d;
    d.start();
    const auto dir = make_temp_dir();
    const std::string evil = "evil\n<3>err: forged \x1b[31mred\xc2\x9b" "2J";
    const std::string shown = "evil\\x0a<3>err: forged \\x1b[31mred\\xc2\\x9b2J";
    const auto id = itest::run_container(itest::session_label(evil));
    BOOST_REQUIRE(itest::eventually([&] { return d.containers_of(evil) == 1; }));

    Reaperctl status(dir, {"--socket", d.socket, "status"});
    BOOST_TEST(status.wait() == 0, status.stderr_text());
    const auto table = status.stdout_text();
    BOOST_TEST(table.find(shown) != std::string::npos, table);
    BOOST_TEST(table.find('\x1b') == std::string::npos, table);
    BOOST_TEST(table.find("\n<3>") == std::string::npos, table);

    // A refusal names the session the container belongs to.
    Reaperctl refused(dir, {"--socket", d.socket, "orphan", id, "--session", "another"});
    BOOST_TEST(refused.wait() == 1);
    BOOST_TEST(refused.stderr_text().find("belongs to session " + shown + ", not another; not reaped") !=
                   std::string::npos,
               refused.stderr_text());
    BOOST_TEST(refused.stderr_text().find('\x1b') == std::string::npos, refused.stderr_text());

    Reaperctl orphan(dir, {"--socket", d.socket, "orphan", id});
    BOOST_TEST(orphan.wait() == 0, orphan.stderr_text());
    BOOST_TEST(orphan.stdout_text().ends_with("(" + id + ") of session " + shown + ": queued for reaping\n"),
               orphan.stdout_text());
    BOOST_TEST(itest::eventually([&] { return !itest::exists(id); }));

    const std::string logged = "SESSION_ID=\"evil\\n<3>err: forged \\x1b[31mred\\xc2\\x9b2J\"";
    BOOST_TEST(itest::eventually([&] { return d.log_text().find(logged) != std::string::npos; }), d.log_text());
    const auto log = d.log_text();
    BOOST_TEST(log.find('\x1b') == std::string::npos);
    BOOST_TEST(log.find("\xc2\x9b") == std::string::npos);
    BOOST_TEST(log.find("\n<3>err: forged") == std::string::npos);
    std::filesystem::remove_all(dir);
}
