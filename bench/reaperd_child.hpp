// reaperd as a child process of a benchmark, on the bench's private engine, with its own
// files (config, control socket, state dir, log) in one directory. Shared by every bench.
#pragma once

#include <reaper/control.hpp>

#include <Poco/JSON/Object.h>
#include <Poco/JSON/Parser.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace bench {

// A fresh directory /tmp/<prefix>.XXXXXX.
inline std::string make_temp_dir(const std::string& prefix) {
    std::string pattern = "/tmp/" + prefix + ".XXXXXX";
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp: " + std::string(std::strerror(errno)));
    return pattern;
}

class ReaperdChild {
public:
    using Clock = std::chrono::steady_clock;

    // Starts reaperd on `engine_address` with its files in `dir` (created if missing, removed
    // by the destructor); `sections_yaml` holds whole config sections other than engine,
    // control and state (e.g. "sessions:\n  lease_grace: 0\n"). Returns once reaperd says it
    // is ready; throws, with its log, if it exits first or is not ready within 120 s.
    ReaperdChild(const std::string& engine_address, std::string dir, const std::string& sections_yaml)
        : dir_(std::move(dir)) {
        std::filesystem::create_directories(dir_);
        std::ofstream(dir_ + "/reaperd.yaml") << "engine:\n  host: " << engine_address << "\n"
                                              << "control:\n  socket: " << socket() << "\n"
                                              << "state:\n  dir: " << dir_ << "/state\n"
                                              << sections_yaml;
        spawn();
        await("reaperd to be ready", [&] { return status()->getValue<bool>("ready"); });
    }

    // SIGTERM, and SIGKILL if it has not exited within 30 s; then removes its directory.
    ~ReaperdChild() {
        if (!exited()) {
            ::kill(pid_, SIGTERM);
            auto deadline = Clock::now() + std::chrono::seconds(30);
            while (!exited() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
            if (!exited()) {
                ::kill(pid_, SIGKILL);
                ::waitpid(pid_, nullptr, 0);
            }
        }
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
    }
    ReaperdChild(const ReaperdChild&) = delete;
    ReaperdChild& operator=(const ReaperdChild&) = delete;

    pid_t pid() const { return pid_; }
    const std::string& dir() const { return dir_; }
    std::string socket() const { return dir_ + "/control.sock"; }
    reaper::control::ControlClient control() const {
        return reaper::control::ControlClient(socket(), std::chrono::seconds(10));
    }
    // By default every session, the ended ones too (a plain status, `{}`, lists the live ones
    // and only the newest few ended).
    Poco::JSON::Object::Ptr status(const reaper::control::StatusQuery& query = {false, 1'000'000}) const {
        Poco::JSON::Parser parser;
        return parser.parse(control().status_json(query)).extract<Poco::JSON::Object::Ptr>();
    }

    // True once the process has ended (and then it is reaped).
    bool exited() {
        if (pid_ > 0 && ::waitpid(pid_, nullptr, WNOHANG) == pid_) pid_ = -1;
        return pid_ <= 0;
    }

    // Polls `condition` every 20 ms (an exception counts as false: not answering yet) until
    // it holds; throws, with the log, when reaperd exits or `limit` passes.
    void await(const std::string& what, const std::function<bool()>& condition,
               std::chrono::milliseconds limit = std::chrono::seconds(120)) {
        auto deadline = Clock::now() + limit;
        for (;;) {
            try {
                if (condition()) return;
            } catch (const std::exception&) {
            }
            if (exited()) throw std::runtime_error("reaperd exited; its log:\n" + log_tail(60));
            if (Clock::now() > deadline)
                throw std::runtime_error("timed out waiting for " + what + "; reaperd's log:\n" + log_tail(60));
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    }

    std::string log_text() const {
        std::ifstream in(dir_ + "/reaperd.log");
        std::stringstream text;
        text << in.rdbuf();
        return text.str();
    }
    // The last `n` lines of its log.
    std::string log_tail(std::size_t n) const {
        std::istringstream in(log_text());
        std::vector<std::string> lines;
        for (std::string line; std::getline(in, line);) lines.push_back(line);
        std::string out;
        for (std::size_t i = lines.size() > n ? lines.size() - n : 0; i < lines.size(); ++i) out += lines[i] + "\n";
        return out;
    }

private:
    // Forks and execs reaperd, logging to stderr in its directory, with PR_SET_PDEATHSIG so
    // that it gets SIGTERM when the bench dies, even by SIGKILL or ^C (the harness stops the
    // engine then too). systemd's variables are not passed on: the bench may run under it.
    void spawn() {
        std::string config = dir_ + "/reaperd.yaml";
        std::string log = dir_ + "/reaperd.log";
        std::vector<std::string> args{REAPERD_PATH, "--config", config};
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        std::vector<std::string> env{"REAPERD_LOG_TARGET=stderr"};
        for (char** e = environ; *e; ++e) {
            std::string entry = *e;
            if (entry.rfind("NOTIFY_SOCKET=", 0) && entry.rfind("JOURNAL_STREAM=", 0) &&
                entry.rfind("WATCHDOG_", 0) && entry.rfind("REAPERD_LOG_TARGET=", 0))
                env.push_back(entry);
        }
        std::vector<char*> envp;
        for (auto& e : env) envp.push_back(e.data());
        envp.push_back(nullptr);
        pid_t parent = ::getpid();
        pid_ = ::fork();
        if (pid_ < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
        if (pid_ == 0) {
            // Only async-signal-safe calls between fork and exec.
            ::prctl(PR_SET_PDEATHSIG, SIGTERM);
            if (::getppid() != parent) ::_exit(127);
            int in = ::open("/dev/null", O_RDONLY);
            int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
            if (in < 0 || out < 0) ::_exit(127);
            ::dup2(in, STDIN_FILENO);
            ::dup2(out, STDOUT_FILENO);
            ::dup2(out, STDERR_FILENO);
            ::execve(REAPERD_PATH, argv.data(), envp.data());
            ::_exit(127);
        }
    }

    std::string dir_;
    pid_t pid_ = -1;
};

}  // namespace bench
