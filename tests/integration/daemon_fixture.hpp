// reaperd as a child process against the test's private engine: a temp dir holding its
// config, state dir, control socket and log; helpers to start, SIGKILL, stop and query it,
// and to make labeled containers.
#pragma once

#include "engine.hpp"
#include "eventually.hpp"

#include <reaper/client.hpp>
#include <reaper/control.hpp>

#include <Poco/JSON/Object.h>
#include <Poco/JSON/Parser.h>

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace reaperd::itest {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// reaper::test::eventually for what the engine or reaperd does: polled every 50 ms, each poll
// being a request or a read of their files, up to a generous minute (the machine is a loaded
// 2-core box). A condition that throws (the engine or reaperd restarting) does not hold yet.
inline bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds limit = 60s) {
    return reaper::test::eventually(
        [&] {
            try {
                return condition();
            } catch (const std::exception&) {
                return false;
            }
        },
        limit, 50ms);
}

inline std::size_t fd_count(pid_t pid) {
    std::size_t n = 0;
    std::error_code ec;
    for (auto it = fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
         !ec && it != fs::directory_iterator(); it.increment(ec))
        ++n;
    return n;
}

class Reaperd {
public:
    // `extra_yaml` is appended to the config (whole sections, e.g. "sessions:\n  ...").
    // `engine_address` is engine.host; "" is the test process's private engine.
    explicit Reaperd(std::string sessions_yaml = "", std::string reaper_yaml = "",
                     std::string engine_address = "")
        : engine_address_(engine_address.empty() ? reaper::test::engine().address()
                                                 : std::move(engine_address)) {
        char pattern[] = "/tmp/reaperd-itest.XXXXXX";
        dir = ::mkdtemp(pattern);
        socket = dir + "/control.sock";
        write_config(sessions_yaml, reaper_yaml);
    }
    ~Reaperd() {
        if (pid_ > 0) {
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, nullptr, 0);
        }
        std::error_code ec;
        fs::remove_all(dir, ec);
    }

    // Test defaults (lease_grace 2s, fast retries) unless the given lines set those keys.
    void write_config(const std::string& sessions_yaml, const std::string& reaper_yaml) {
        auto unless_set = [](const std::string& yaml, const std::string& line) {
            auto key = line.substr(0, line.find(':') + 1);
            return yaml.find(key) == std::string::npos ? line : std::string();
        };
        std::ofstream out(dir + "/reaperd.yaml");
        out << "engine:\n  host: " << engine_address_ << "\n"
            << "control:\n  socket: " << socket << "\n"
            << "state:\n  dir: " << dir << "/state\n"
            << "sessions:\n"
            << unless_set(sessions_yaml, "  lease_grace: 2s\n") << sessions_yaml << "reaper:\n"
            << unless_set(reaper_yaml, "  retry_initial: 200ms\n")
            << unless_set(reaper_yaml, "  retry_max: 2s\n")
            << unless_set(reaper_yaml, "  resync_interval: 30s\n") << reaper_yaml;
    }

    // Starts reaperd and waits until it is ready (engine answered, initial list done).
    void start(bool wait_ready = true) {
        std::string config = dir + "/reaperd.yaml";
        std::string log = dir + "/reaperd.log";
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
        posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                         O_WRONLY | O_CREAT | O_APPEND, 0644);
        posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
        std::vector<std::string> args{REAPERD_PATH, "--config", config};
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        // No NOTIFY_SOCKET, JOURNAL_STREAM or DOCKER_API_VERSION from the test's own
        // environment; `environment` adds what the test means to set.
        std::vector<std::string> env;
        for (char** e = environ; *e; ++e) {
            std::string entry = *e;
            if (entry.rfind("NOTIFY_SOCKET=", 0) && entry.rfind("JOURNAL_STREAM=", 0) &&
                entry.rfind("WATCHDOG_", 0) && entry.rfind("DOCKER_API_VERSION=", 0))
                env.push_back(entry);
        }
        env.insert(env.end(), environment.begin(), environment.end());
        std::vector<char*> envp;
        for (auto& e : env) envp.push_back(e.data());
        envp.push_back(nullptr);
        int rc = posix_spawn(&pid_, REAPERD_PATH, &actions, nullptr, argv.data(), envp.data());
        posix_spawn_file_actions_destroy(&actions);
        BOOST_REQUIRE_MESSAGE(rc == 0, "spawning reaperd: " << std::strerror(rc));
        int status = 0;
        bool exited = false;
        bool ok = eventually([&] {
            if (::waitpid(pid_, &status, WNOHANG) == pid_) exited = true;
            return exited || (wait_ready ? ready() : answers());
        });
        if (exited) pid_ = -1;
        BOOST_REQUIRE_MESSAGE(ok && !exited, "reaperd did not "
                                                 << (wait_ready ? "become ready" : "answer")
                                                 << (exited ? " (it exited)" : "") << "; its log:\n"
                                                 << log_text());
    }

    pid_t pid() const { return pid_; }
    bool running() const { return pid_ > 0 && ::waitpid(pid_, nullptr, WNOHANG) == 0; }

    void sigkill() {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        pid_ = -1;
    }
    // SIGTERM; returns the exit status (or -1 if it did not exit within the limit).
    int terminate(std::chrono::milliseconds limit = 60s) {
        ::kill(pid_, SIGTERM);
        auto deadline = std::chrono::steady_clock::now() + limit;
        int status = 0;
        while (::waitpid(pid_, &status, WNOHANG) == 0) {
            if (std::chrono::steady_clock::now() > deadline) return -1;
            std::this_thread::sleep_for(20ms);
        }
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }

    reaper::control::ControlClient control() const {
        return reaper::control::ControlClient(socket, 10s);
    }
    // Lists every session, the ended ones too (a plain status lists only the newest few ended
    // ones, and tests look sessions up by id).
    Poco::JSON::Object::Ptr status() const {
        Poco::JSON::Parser parser;
        return parser.parse(control().status_json({false, 1'000'000})).extract<Poco::JSON::Object::Ptr>();
    }
    bool answers() const {
        try {
            status();
            return true;
        } catch (const std::exception&) {
            return false;
        }
    }
    bool ready() const {
        try {
            return status()->getValue<bool>("ready");
        } catch (const std::exception&) {
            return false;
        }
    }
    // The session's state in status ("" when it is not listed).
    std::string session_state(const std::string& session) const {
        auto sessions = status()->getArray("sessions");
        for (std::size_t i = 0; i < sessions->size(); ++i) {
            auto s = sessions->getObject(static_cast<unsigned>(i));
            if (s->getValue<std::string>("id") == session) return s->getValue<std::string>("state");
        }
        return "";
    }
    // How many tracked containers the session has (0 when it is not listed).
    int containers_of(const std::string& session) const {
        auto sessions = status()->getArray("sessions");
        for (std::size_t i = 0; i < sessions->size(); ++i) {
            auto s = sessions->getObject(static_cast<unsigned>(i));
            if (s->getValue<std::string>("id") == session) return s->getValue<int>("containers");
        }
        return 0;
    }
    std::size_t pending_reaps() const { return status()->getValue<std::size_t>("pending_reaps"); }
    std::string log_text() const {
        std::ifstream in(dir + "/reaperd.log");
        std::stringstream text;
        text << in.rdbuf();
        return text.str();
    }
    // Whether one line of its log holds every one of `parts` (a record's message and fields).
    bool logged(const std::vector<std::string>& parts) const {
        std::istringstream lines(log_text());
        for (std::string line; std::getline(lines, line);) {
            bool all = true;
            for (const auto& part : parts) all = all && line.find(part) != std::string::npos;
            if (all) return true;
        }
        return false;
    }
    // Whether it has logged the end of `session` (the record a reap after a lease follows).
    bool session_end_logged(const std::string& session) const {
        return logged({"ACTION=end_session", "SESSION_ID=" + session + " "});
    }
    std::size_t log_count(const std::string& needle) const {
        std::string text = log_text();
        std::size_t n = 0;
        for (auto pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1))
            ++n;
        return n;
    }

    std::string dir;
    std::string socket;
    std::vector<std::string> environment;  // "KEY=value" entries for reaperd's environment

private:
    std::string engine_address_;
    pid_t pid_ = -1;
};

// A client of the private engine for the test's own calls.
inline reaper::Client& engine_client() {
    static reaper::Client client(reaper::test::engine().client_options());
    return client;
}

// Creates and starts a `sleep` container with `labels`; returns its id.
inline std::string run_container(const reaper::Labels& labels, bool start = true) {
    reaper::ContainerSpec spec;
    spec.name = reaper::test::unique_name("reaperd-itest");
    spec.image = reaper::test::PrivateEngine::image;
    spec.cmd = {"sleep", "600"};
    spec.labels = labels;
    std::string id = engine_client().create(spec);
    if (start) engine_client().start(id);
    return id;
}

// Force-removes the containers a test made when it goes out of scope, however the test ends;
// one already gone (reaped, or removed by the test) is passed over. Declare it before any
// RemovalPin, so that it runs after the pin is lifted.
struct Cleanup {
    std::vector<std::string> ids;
    ~Cleanup() {
        for (const auto& id : ids) {
            try {
                engine_client().remove(id, {true, true});
            } catch (const std::exception&) {
            }
        }
    }
};

inline bool exists(const std::string& id) {
    try {
        engine_client().inspect(id);
        return true;
    } catch (const reaper::NotFound&) {
        return false;
    }
}

inline reaper::Labels session_label(const std::string& session) {
    return {{"reaperd.session", session}};
}

// A child process (reaperctl run, a client tool) with stdin from /dev/null, stdout and
// stderr to files in `dir`, and `extra_env` ("KEY=value", replacing the test's own KEY) on top
// of the test's environment. Killed with SIGKILL if still running when destroyed.
class Child {
public:
    Child(const std::string& dir, std::vector<std::string> argv,
          const std::vector<std::string>& extra_env = {}) {
        static int counter = 0;
        const auto stem = dir + "/child" + std::to_string(++counter);
        out_path_ = stem + ".stdout";
        err_path_ = stem + ".stderr";
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
        posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path_.c_str(),
                                         O_WRONLY | O_CREAT | O_TRUNC, 0600);
        posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path_.c_str(),
                                         O_WRONLY | O_CREAT | O_TRUNC, 0600);
        std::vector<char*> args;
        for (auto& a : argv) args.push_back(a.data());
        args.push_back(nullptr);
        std::vector<std::string> env;
        for (char** e = environ; *e; ++e) {
            const std::string entry = *e;
            const auto key = entry.substr(0, entry.find('=') + 1);
            bool replaced = false;
            for (const auto& extra : extra_env) replaced = replaced || extra.rfind(key, 0) == 0;
            if (!replaced) env.push_back(entry);
        }
        env.insert(env.end(), extra_env.begin(), extra_env.end());
        std::vector<char*> envp;
        for (auto& e : env) envp.push_back(e.data());
        envp.push_back(nullptr);
        const int rc = posix_spawnp(&pid_, args[0], &actions, nullptr, args.data(), envp.data());
        posix_spawn_file_actions_destroy(&actions);
        BOOST_REQUIRE_MESSAGE(rc == 0, "spawning " << argv[0] << ": " << std::strerror(rc));
    }
    ~Child() {
        if (running()) {
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, nullptr, 0);
        }
    }
    Child(const Child&) = delete;
    Child& operator=(const Child&) = delete;

    pid_t pid() const { return pid_; }
    bool running() {
        if (status_ >= 0) return false;
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG) != pid_) return true;
        status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return false;
    }
    // The exit code (128+N for signal N), or -1 if it is still running after `limit`.
    int wait(std::chrono::milliseconds limit = 120s) {
        const auto deadline = std::chrono::steady_clock::now() + limit;
        while (running()) {
            if (std::chrono::steady_clock::now() > deadline) return -1;
            std::this_thread::sleep_for(5ms);
        }
        return status_;
    }
    void signal(int number) { ::kill(pid_, number); }
    std::string stdout_text() const { return slurp(out_path_); }
    std::string stderr_text() const { return slurp(err_path_); }

private:
    static std::string slurp(const std::string& path) {
        std::ifstream in(path);
        std::stringstream text;
        text << in.rdbuf();
        return text.str();
    }

    pid_t pid_ = -1;
    int status_ = -1;
    std::string out_path_;
    std::string err_path_;
};

// `reaperctl --socket SOCKET run --own SESSION -- COMMAND...`
inline std::vector<std::string> own_run_argv(const std::string& socket, const std::string& session,
                                             const std::vector<std::string>& command) {
    std::vector<std::string> argv{REAPERCTL_PATH, "--socket", socket, "run", "--own", session, "--"};
    argv.insert(argv.end(), command.begin(), command.end());
    return argv;
}

// Runs `command` with /bin/sh; its stdout and stderr.
inline std::string shell_output(const std::string& command) {
    std::string out;
    if (FILE* pipe = ::popen((command + " 2>&1").c_str(), "r")) {
        char buffer[4096];
        while (auto n = std::fread(buffer, 1, sizeof buffer, pipe)) out.append(buffer, n);
        ::pclose(pipe);
    }
    return out;
}

// Runs Debian's docker CLI against the private engine; its stdout and stderr.
inline std::string docker_cli(const std::string& args) {
    return shell_output("/usr/bin/docker --host " + reaper::test::engine().address() + " " + args);
}

}  // namespace reaperd::itest
