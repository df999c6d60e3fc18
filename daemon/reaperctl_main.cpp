// reaperctl: the command-line client of reaperd's control socket.
// Exit codes: 0 ok, 1 the daemon answered with an error, 64 usage error, 69 daemon unreachable;
// `run` exits with its tool's status (128+N when the tool was killed by signal N), 126/127
// when the tool cannot be started.
#include "reaper/control.hpp"
#include "reaperctl_format.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

extern char** environ;

namespace {

namespace control = reaper::control;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr int exit_ok = 0;
constexpr int exit_error_reply = 1;
constexpr int exit_usage = 64;
constexpr int exit_unavailable = 69;
constexpr int exit_cannot_execute = 126;
constexpr int exit_not_found = 127;

constexpr auto request_timeout = 5s;

const char* const usage_text =
    "Usage: reaperctl [--socket PATH] COMMAND [ARGS]\n"
    "\n"
    "Commands:\n"
    "  hold SESSION                 hold a lease on SESSION until killed or stdin closes\n"
    "  run SESSION -- COMMAND [ARGS...]\n"
    "                               run COMMAND while holding a lease on SESSION; the tool\n"
    "                               gets REAPERD_SESSION=SESSION; signals are forwarded and\n"
    "                               reaperctl exits with the tool's status\n"
    "  end SESSION                  end SESSION now: reaperd reaps its containers\n"
    "  orphan CONTAINER [--session SESSION]\n"
    "                               report a container to reap now\n"
    "  status [--json]              sessions, tracked containers, pending reaps, counters\n"
    "  metrics                      the daemon's metrics (Prometheus text)\n"
    "\n"
    "Options:\n"
    "  --socket PATH   the control socket (default: $REAPERD_SOCKET, else /run/reaperd/control.sock)\n"
    "  --help          show this help\n"
    "  --version       show the version\n"
    "\n"
    "Exit codes: 0 ok, 1 the daemon refused, 64 usage error, 69 reaperd unreachable.\n"
    "See docs/control-protocol.md.\n";

struct UsageError {
    std::string message;
};

void warn(const std::string& message) { std::fprintf(stderr, "reaperctl: %s\n", message.c_str()); }

// The signals `run` forwards to its tool and `hold` treats as "stop holding".
const std::vector<int>& forwarded_signals() {
    static const std::vector<int> signals{SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
    return signals;
}

// Blocks `signals` (+SIGCHLD when asked) and returns a signalfd for them; the previous mask
// goes to `previous` so a child can start with it.
int block_into_signalfd(bool with_child, sigset_t& previous) {
    sigset_t set;
    sigemptyset(&set);
    for (int signal : forwarded_signals()) sigaddset(&set, signal);
    if (with_child) sigaddset(&set, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &set, &previous) != 0) {
        throw std::runtime_error(std::string("sigprocmask: ") + std::strerror(errno));
    }
    const int fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (fd < 0) throw std::runtime_error(std::string("signalfd: ") + std::strerror(errno));
    return fd;
}

// Keeps a lease on one session for as long as reaperctl runs: when the daemon goes away
// (restart, upgrade), it reconnects with backoff, because reaperd restores leases after a
// restart only for the clients that come back within the grace.
class LeaseKeeper {
public:
    LeaseKeeper(control::ControlClient& client, std::string session)
        : client_(client), session_(std::move(session)) {}

    // First attempt; the caller decides what an unreachable daemon means. Throws what
    // ControlClient::lease throws.
    void acquire() {
        lease_ = client_.lease(session_);
        backoff_ = initial_backoff;
    }

    // Start retrying in the background after a failed first attempt.
    void retry_later() { next_attempt_ = Clock::now() + backoff_; }

    int fd() const { return lease_ ? lease_->native_handle() : -1; }

    // Milliseconds poll() may sleep before the next reconnect attempt; -1 while holding.
    int poll_timeout_ms() const {
        if (lease_) return -1;
        const auto wait = std::chrono::ceil<std::chrono::milliseconds>(next_attempt_ - Clock::now());
        return static_cast<int>(std::max<long long>(0, wait.count()));
    }

    // The lease descriptor became readable or hung up: the daemon closed it.
    void on_lease_event() {
        if (!lease_ || lease_->alive()) return;
        lease_.reset();
        warn("reaperd closed the lease on " + session_ + "; reconnecting to " +
             client_.socket_path());
        next_attempt_ = Clock::now();
        backoff_ = initial_backoff;
        reported_failure_ = false;
    }

    void on_timeout() {
        if (lease_ || Clock::now() < next_attempt_) return;
        try {
            lease_ = client_.lease(session_);
            warn("lease on " + session_ + " restored");
            backoff_ = initial_backoff;
            reported_failure_ = false;
        } catch (const control::ControlError& e) {
            if (!reported_failure_) warn(std::string(e.what()) + "; will keep trying");
            reported_failure_ = true;
            backoff_ = std::min(backoff_ * 2, max_backoff);
            next_attempt_ = Clock::now() + backoff_;
        }
    }

    void release() noexcept { lease_.reset(); }

private:
    static constexpr std::chrono::milliseconds initial_backoff{200};
    static constexpr std::chrono::milliseconds max_backoff{5000};

    control::ControlClient& client_;
    std::string session_;
    std::unique_ptr<control::Lease> lease_;
    Clock::time_point next_attempt_{};
    std::chrono::milliseconds backoff_{initial_backoff};
    bool reported_failure_ = false;
};

// stdin counts as "the holder" only when it can close: a pipe, socket or terminal. A
// regular file or /dev/null (what a shell gives a background job) would end the hold at once.
bool stdin_can_signal_close() {
    struct stat info {};
    if (fstat(STDIN_FILENO, &info) != 0) return false;
    if (S_ISFIFO(info.st_mode) || S_ISSOCK(info.st_mode)) return true;
    return isatty(STDIN_FILENO) == 1;
}

void validate_session_arg(const std::string& session) {
    try {
        control::validate_session_id(session);
    } catch (const control::ProtocolViolation& e) {
        throw UsageError{std::string("invalid SESSION: ") + e.what()};
    }
}

int hold(control::ControlClient& client, const std::string& session) {
    validate_session_arg(session);
    LeaseKeeper keeper(client, session);
    keeper.acquire();
    sigset_t previous;
    const int signals = block_into_signalfd(false, previous);
    const bool watch_stdin = stdin_can_signal_close();
    for (;;) {
        std::vector<pollfd> fds{{signals, POLLIN, 0}, {watch_stdin ? STDIN_FILENO : -1, POLLIN, 0},
                                {keeper.fd(), POLLIN, 0}};
        const int ready = poll(fds.data(), fds.size(), keeper.poll_timeout_ms());
        if (ready < 0 && errno != EINTR) throw std::runtime_error(std::string("poll: ") + std::strerror(errno));
        if (fds[0].revents & POLLIN) {
            keeper.release();
            return exit_ok;
        }
        if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
            char buffer[4096];
            const auto n = read(STDIN_FILENO, buffer, sizeof buffer);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
                keeper.release();
                return exit_ok;
            }
        }
        if (fds[2].revents != 0) keeper.on_lease_event();
        keeper.on_timeout();
    }
}

int exit_status_of(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 1;
}

std::vector<std::string> environment_for(const std::string& session,
                                         const std::optional<std::string>& socket) {
    std::vector<std::string> env;
    for (char** entry = environ; *entry != nullptr; ++entry) {
        const std::string_view text(*entry);
        if (text.starts_with("REAPERD_SESSION=")) continue;
        if (socket && text.starts_with("REAPERD_SOCKET=")) continue;
        env.emplace_back(text);
    }
    env.push_back("REAPERD_SESSION=" + session);
    // Tools that speak to reaperd themselves (the library's Session) find the same daemon.
    if (socket) env.push_back("REAPERD_SOCKET=" + *socket);
    return env;
}

int run(control::ControlClient& client, const std::string& session,
        const std::vector<std::string>& command, const std::optional<std::string>& socket) {
    validate_session_arg(session);
    if (command.empty()) throw UsageError{"run needs a COMMAND after the session"};
    LeaseKeeper keeper(client, session);
    try {
        keeper.acquire();
    } catch (const control::DaemonUnreachable& e) {
        // The tool matters more than the safety net: run it, and keep trying to take the lease.
        warn(std::string(e.what()) + "; running " + command[0] + " without a lease");
        keeper.retry_later();
    }

    sigset_t previous;
    const int signals = block_into_signalfd(true, previous);

    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    posix_spawnattr_setsigmask(&attributes, &previous);
    sigset_t defaults;
    sigemptyset(&defaults);
    for (int signal : forwarded_signals()) sigaddset(&defaults, signal);
    sigaddset(&defaults, SIGCHLD);
    sigaddset(&defaults, SIGPIPE);
    posix_spawnattr_setsigdefault(&attributes, &defaults);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

    std::vector<char*> argv;
    for (const auto& arg : command) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    auto env_strings = environment_for(session, socket);
    std::vector<char*> envp;
    for (auto& entry : env_strings) envp.push_back(entry.data());
    envp.push_back(nullptr);

    pid_t child = -1;
    const int spawned = posix_spawnp(&child, argv[0], nullptr, &attributes, argv.data(), envp.data());
    posix_spawnattr_destroy(&attributes);
    if (spawned != 0) {
        keeper.release();
        warn("cannot run " + command[0] + ": " + std::strerror(spawned));
        return spawned == ENOENT ? exit_not_found : exit_cannot_execute;
    }

    for (;;) {
        std::vector<pollfd> fds{{signals, POLLIN, 0}, {keeper.fd(), POLLIN, 0}};
        const int ready = poll(fds.data(), fds.size(), keeper.poll_timeout_ms());
        if (ready < 0 && errno != EINTR) throw std::runtime_error(std::string("poll: ") + std::strerror(errno));
        if (fds[0].revents & POLLIN) {
            signalfd_siginfo info{};
            while (read(signals, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
                const int signal = static_cast<int>(info.ssi_signo);
                if (signal == SIGCHLD) continue;
                // A signal the kernel sent (Ctrl-C, terminal hangup) went to the whole
                // foreground process group, the tool included; sending it again would make
                // tools that count presses (a second Ctrl-C = force) misbehave.
                if (info.ssi_code == SI_KERNEL) continue;
                kill(child, signal);
            }
            int status = 0;
            const pid_t done = waitpid(child, &status, WNOHANG);
            if (done == child) {
                keeper.release();
                return exit_status_of(status);
            }
        }
        if (fds[1].revents != 0) keeper.on_lease_event();
        keeper.on_timeout();
    }
}

void print_text(const std::string& text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    if (!text.empty() && text.back() != '\n') std::fputc('\n', stdout);
}

struct Arguments {
    std::optional<std::string> socket;
    std::string command;
    std::vector<std::string> operands;  // positional arguments after the command
    std::vector<std::string> tool;      // run: everything after the session (and "--")
    std::optional<std::string> orphan_session;
    bool json = false;
    bool help = false;
    bool version = false;
};

Arguments parse_arguments(int argc, char** argv) {
    Arguments args;
    std::vector<std::string> words(argv + 1, argv + argc);
    for (std::size_t i = 0; i < words.size(); ++i) {
        const auto& word = words[i];
        // Everything after run's session is the tool's, untouched.
        if (args.command == "run" && !args.operands.empty()) {
            auto first = words.begin() + static_cast<std::ptrdiff_t>(i);
            if (*first == "--") ++first;
            args.tool.assign(first, words.end());
            break;
        }
        if (word == "--help" || word == "-h") {
            args.help = true;
        } else if (word == "--version") {
            args.version = true;
        } else if (word == "--socket" || word.starts_with("--socket=")) {
            if (word == "--socket") {
                if (i + 1 >= words.size()) throw UsageError{"--socket needs a PATH"};
                args.socket = words[++i];
            } else {
                args.socket = word.substr(9);
            }
            if (args.socket->empty()) throw UsageError{"--socket needs a non-empty PATH"};
        } else if (word == "--json" && args.command == "status") {
            args.json = true;
        } else if ((word == "--session" || word.starts_with("--session=")) && args.command == "orphan") {
            if (word == "--session") {
                if (i + 1 >= words.size()) throw UsageError{"--session needs a SESSION"};
                args.orphan_session = words[++i];
            } else {
                args.orphan_session = word.substr(10);
            }
        } else if (word == "--" && args.command == "run") {
            throw UsageError{"run needs a SESSION before --"};
        } else if (word.starts_with("-") && word != "-") {
            throw UsageError{"unknown option " + word +
                             (args.command.empty() ? std::string() : " for " + args.command)};
        } else if (args.command.empty()) {
            args.command = word;
        } else {
            args.operands.push_back(word);
        }
    }
    return args;
}

void expect_operands(const Arguments& args, std::size_t count, const char* names) {
    if (args.operands.size() != count) {
        throw UsageError{args.command + " takes " + names + " (got " +
                         std::to_string(args.operands.size()) + " arguments)"};
    }
}

int dispatch(const Arguments& args) {
    const std::string path = args.socket ? *args.socket : control::socket_path_from_environment();
    control::ControlClient client(path, request_timeout);
    if (args.command == "hold") {
        expect_operands(args, 1, "one SESSION");
        return hold(client, args.operands[0]);
    }
    if (args.command == "run") {
        if (args.operands.empty()) throw UsageError{"run takes SESSION -- COMMAND [ARGS...]"};
        return run(client, args.operands[0], args.tool, args.socket);
    }
    if (args.command == "end") {
        expect_operands(args, 1, "one SESSION");
        validate_session_arg(args.operands[0]);
        client.end(args.operands[0]);
        return exit_ok;
    }
    if (args.command == "orphan") {
        expect_operands(args, 1, "one CONTAINER");
        try {
            control::validate_container(args.operands[0]);
        } catch (const control::ProtocolViolation& e) {
            throw UsageError{std::string("invalid CONTAINER: ") + e.what()};
        }
        const auto session = args.orphan_session.value_or("");
        if (args.orphan_session) validate_session_arg(session);
        client.report_orphan(args.operands[0], session);
        return exit_ok;
    }
    if (args.command == "status") {
        expect_operands(args, 0, "no arguments besides --json");
        const auto status = client.status_json();
        if (args.json) {
            print_text(status);
        } else {
            try {
                print_text(reaperd::format_status(status));
            } catch (const std::invalid_argument& e) {
                warn(std::string("cannot format the status (") + e.what() + "); raw JSON follows");
                print_text(status);
            }
        }
        return exit_ok;
    }
    if (args.command == "metrics") {
        expect_operands(args, 0, "no arguments");
        print_text(client.metrics_text());
        return exit_ok;
    }
    throw UsageError{args.command.empty() ? "missing COMMAND" : "unknown command " + args.command};
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const auto args = parse_arguments(argc, argv);
        if (args.help) {
            std::fputs(usage_text, stdout);
            return exit_ok;
        }
        if (args.version) {
            std::printf("reaperctl %s\n", REAPER_VERSION);
            return exit_ok;
        }
        const int code = dispatch(args);
        if (std::fflush(stdout) != 0) {
            warn(std::string("writing output: ") + std::strerror(errno));
            return exit_error_reply;
        }
        return code;
    } catch (const UsageError& e) {
        warn(e.message);
        std::fputs("Try 'reaperctl --help'.\n", stderr);
        return exit_usage;
    } catch (const control::DaemonUnreachable& e) {
        warn(e.what());
        return exit_unavailable;
    } catch (const control::ControlError& e) {
        warn(e.what());
        return exit_error_reply;
    } catch (const std::exception& e) {
        warn(e.what());
        return exit_error_reply;
    }
}
