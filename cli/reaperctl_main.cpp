// reaperctl: the command-line client of reaperd's control socket (and `logs`, a reader of the
// engine's json-file and local logs).
// Exit codes: 0 ok, 1 the daemon answered with an error (logs: the log cannot be read), 64
// usage error, 69 daemon unreachable (logs: the engine), 75 `end --wait` timed out with
// something of the session left; `run` exits with its tool's
// status (128+N when the tool was killed by signal N), 126/127 when the tool cannot be started.
#include "reaper/units.hpp"  // the one duration grammar; terminal_safe
#include "reaper/control.hpp"
#include "reaper/log_rotation.hpp"
#include "reaper/proxy.hpp"
#include "json_log.hpp"
#include "local_log.hpp"
#include "log_location.hpp"
#include "reaper/client.hpp"
#include "reaperctl_format.hpp"
#include "errno_text.hpp"
#include "unique_fd.hpp"
#include "user_defaults.hpp"

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
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

namespace control = reaper::control;
using namespace std::chrono_literals;
using reaper::detail::errno_text;
using reaper::detail::UniqueFd;

constexpr int exit_ok = 0;
constexpr int exit_error_reply = 1;
constexpr int exit_usage = 64;
constexpr int exit_unavailable = 69;
constexpr int exit_wait_timed_out = 75;  // EX_TEMPFAIL: reaperd is still at it; ask again later
constexpr int exit_cannot_execute = 126;
constexpr int exit_not_found = 127;

constexpr auto request_timeout = 5s;
// `end --wait`: how long by default, and how often it asks reaperd what is left. A question is
// one connection and a turn of reaperd's loop (well under a millisecond when idle).
constexpr std::chrono::milliseconds default_wait_timeout = 5min;
constexpr auto wait_poll_interval = 100ms;

const char* const usage_text =
    "Usage: reaperctl [--socket PATH] COMMAND [ARGS]\n"
    "\n"
    "Commands:\n"
    "  hold SESSION                 hold a lease on SESSION until killed or stdin closes\n"
    "  run [--own [--engine ADDR]] SESSION -- COMMAND [ARGS...]\n"
    "                               run COMMAND while holding a lease on SESSION; the tool\n"
    "                               gets REAPERD_SESSION=SESSION; signals are forwarded and\n"
    "                               reaperctl exits with the tool's status. With --own the\n"
    "                               tool's DOCKER_HOST is a private socket that labels every\n"
    "                               container, network and volume it creates with\n"
    "                               reaperd.session=SESSION; requests go on to the engine at\n"
    "                               ADDR (default: $DOCKER_HOST, else unix:///var/run/docker.sock;\n"
    "                               a user other than root: the first of\n"
    "                               $XDG_RUNTIME_DIR/docker.sock and podman/podman.sock that\n"
    "                               answers, as reaperd does)\n"
    "  end SESSION [--wait [--timeout DUR]] [--json]\n"
    "                               end SESSION now: reaperd reaps its containers (and then\n"
    "                               its networks and volumes); says how many were queued.\n"
    "                               --wait: return once reaperd sees nothing of it left\n"
    "                               (exit 75 if something is left after DUR, default 5m)\n"
    "  orphan CONTAINER [--session SESSION] [--json]\n"
    "                               report a container to reap now; says the full id it\n"
    "                               resolved to and whether its reap was queued\n"
    "  status [--ended | --pending] [--limit N] [--json]\n"
    "                               live sessions (with what their proxies labelled), the\n"
    "                               count of ended ones and the newest few, tracked\n"
    "                               containers, pending reaps and removals (counts and the\n"
    "                               first 20: reaps oldest first, removals next due first),\n"
    "                               counters; --ended lists the ended sessions instead,\n"
    "                               newest first, --pending every pending reap and removal\n"
    "                               (--limit N of them, default 1000)\n"
    "  metrics                      the daemon's metrics (Prometheus text)\n"
    "  logs CONTAINER [--tail N] [-f] [--engine ADDR]\n"
    "                               print a container's json-file or local log as the engine\n"
    "                               wrote it, skipping the holes reaperd's log caps punch\n"
    "                               (where plain `docker logs` of Docker 23+, or of any Docker\n"
    "                               for the local driver, shows nothing); stdout lines\n"
    "                               to stdout, stderr lines to stderr. --tail N: the last N\n"
    "                               lines; -f: follow, across the engine's rotations. The\n"
    "                               engine: ADDR, else $DOCKER_HOST, else\n"
    "                               unix:///var/run/docker.sock"
    "\n"
    "Options:\n"
    "  --socket PATH   the control socket (default: $REAPERD_SOCKET; else, for a user other than\n"
    "                  root, $XDG_RUNTIME_DIR/reaperd/control.sock if it exists; else\n"
    "                  /run/reaperd/control.sock)\n"
    "  --help          show this help\n"
    "  --version       show the version\n"
    "\n"
    "Exit codes: 0 ok, 1 the daemon refused (logs: the log cannot be read), 64 usage\n"
    "error, 69 reaperd unreachable (logs: the engine), 75 end --wait timed out.\n"
    "See docs/control-protocol.md.\n";

struct UsageError {
    std::string message;
};

// What reaperctl says on stderr can hold the engine's label values (a refusal names the session a
// container belongs to): shown terminal-safe, as the status is.
void warn(const std::string& message) {
    std::fprintf(stderr, "reaperctl: %s\n", reaper::terminal_safe(message).c_str());
}

// The signals `run` forwards to its tool and `hold` treats as "stop holding".
const std::vector<int>& forwarded_signals() {
    static const std::vector<int> signals{SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
    return signals;
}

// Blocks `signals` (+SIGCHLD when asked) and returns a signalfd for them; the previous mask
// goes to `previous` so a child can start with it.
UniqueFd block_into_signalfd(bool with_child, sigset_t& previous) {
    sigset_t set;
    sigemptyset(&set);
    for (int signal : forwarded_signals()) sigaddset(&set, signal);
    if (with_child) sigaddset(&set, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &set, &previous) != 0) {
        throw std::runtime_error("sigprocmask: " + errno_text(errno));
    }
    UniqueFd fd(signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
    if (!fd) throw std::runtime_error("signalfd: " + errno_text(errno));
    return fd;
}

// A lease keeper for `hold` and `run`: the library's, which reconnects whenever reaperd
// closes the lease (a restart gives the sessions that held leases one lease_grace to come
// back), telling stderr what happens.
control::LeaseKeeper make_keeper(const control::ControlClient& client, const std::string& session,
                                 bool proxy = false) {
    control::LeaseKeeperOptions options;
    options.proxy = proxy;
    options.observer = [path = client.socket_path(), session](control::LeaseEvent event,
                                                                const std::exception_ptr& error) {
        switch (event) {
            case control::LeaseEvent::Lost:
                warn("reaperd closed the lease on " + session + "; reconnecting to " + path);
                break;
            case control::LeaseEvent::Failing:
                try {
                    std::rethrow_exception(error);
                } catch (const std::exception& e) {
                    warn(std::string(e.what()) + "; will keep trying");
                }
                break;
            case control::LeaseEvent::Taken:
                warn("lease on " + session + " restored");
                break;
        }
    };
    return control::LeaseKeeper(client, session, std::move(options));
}

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
    auto keeper = make_keeper(client, session);
    if (auto failure = keeper.start()) std::rethrow_exception(failure);
    sigset_t previous;
    const UniqueFd signals = block_into_signalfd(false, previous);
    const bool watch_stdin = stdin_can_signal_close();
    // The keeper's thread keeps the lease; this one only waits for the end of the hold.
    for (;;) {
        std::vector<pollfd> fds{{signals.get(), POLLIN, 0}, {watch_stdin ? STDIN_FILENO : -1, POLLIN, 0}};
        const int ready = poll(fds.data(), fds.size(), -1);
        if (ready < 0 && errno != EINTR) throw std::runtime_error("poll: " + errno_text(errno));
        if (fds[0].revents & POLLIN) return exit_ok;
        if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
            char buffer[4096];
            const auto n = read(STDIN_FILENO, buffer, sizeof buffer);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return exit_ok;
        }
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

// `run --own`: the tool's private engine socket, a labelling proxy in a 0700 temp dir, for
// the tool's lifetime. Stopped (and its dir removed) before the lease is dropped, so nothing
// the tool creates can arrive after its session may end.
class OwnedEngine {
public:
    // What the proxy labelled goes to `keeper` (and so to reaperd's status) as it happens.
    OwnedEngine(const std::string& session, const reaper::EngineAddress& upstream,
                control::LeaseKeeper& keeper) {
        // A user's private runtime dir when there is one (a user's tmp may be shared with
        // others, and is cleaned by age): the socket then lives where the user's engine does.
        const auto runtime = reaper::defaults::process_environment("XDG_RUNTIME_DIR");
        const auto base = (::getuid() != 0 && runtime && runtime->starts_with("/")
                               ? std::filesystem::path(*runtime)
                               : std::filesystem::temp_directory_path()) /
                          "reaperctl-own.XXXXXX";
        std::string pattern = base.string();
        if (!::mkdtemp(pattern.data())) {
            throw std::runtime_error("cannot make a temp dir for the engine socket: " +
                                     errno_text(errno));
        }
        dir_ = pattern;
        reaper::ProxyOptions options;
        options.upstream = upstream;
        options.listen_path = dir_ + "/docker.sock";
        options.session = session;
        options.log = reaper::stderr_log_sink(reaper::LogLevel::Warning);
        options.on_labelled = [this, &keeper] {
            const auto stats = proxy_->stats();
            keeper.report_labelled({stats.containers, stats.networks, stats.volumes});
        };
        // reaperd's lease reply says its cap and whether it wants rotation at creation; before
        // any reply (reaperd unreachable) and from a reaperd older than those fields, its
        // default cap.
        options.log_rotation_cap = [&keeper]() -> std::uint64_t {
            const auto reply = keeper.lease_reply();
            if (!reply) return reaper::default_log_cap_bytes;
            if (!reply->log_rotate_at_create.value_or(true)) return 0;
            return reply->log_max_size.value_or(reaper::default_log_cap_bytes);
        };
        try {
            proxy_.emplace(std::move(options));
            proxy_->start();
        } catch (...) {
            remove_dir();
            throw;
        }
    }
    ~OwnedEngine() {
        proxy_.reset();
        remove_dir();
    }
    OwnedEngine(const OwnedEngine&) = delete;
    OwnedEngine& operator=(const OwnedEngine&) = delete;

    std::string docker_host() const { return "unix://" + proxy_->options().listen_path; }

    // Stops serving and tells stderr what the tool's session owns.
    void finish() {
        proxy_->stop();
        const auto stats = proxy_->stats();
        auto count = [](std::uint64_t n, const char* what) {
            return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
        };
        std::string line = "labelled " + count(stats.containers, "container") + ", " +
                           count(stats.networks, "network") + ", " + count(stats.volumes, "volume") +
                           " with reaperd.session=" + proxy_->options().session;
        if (stats.rotated > 0) line += "; set log rotation on " + count(stats.rotated, "container");
        if (stats.refused > 0) line += "; refused " + count(stats.refused, "request");
        warn(line);
    }

private:
    void remove_dir() noexcept {
        std::error_code ignored;
        std::filesystem::remove_all(dir_, ignored);
    }

    std::string dir_;
    std::optional<reaper::EngineProxy> proxy_;
};

int run(control::ControlClient& client, const std::string& session,
        const std::vector<std::string>& command, const std::optional<std::string>& socket,
        const std::optional<reaper::EngineAddress>& own_upstream) {
    validate_session_arg(session);
    if (command.empty()) throw UsageError{"run needs a COMMAND after the session"};
    auto keeper = make_keeper(client, session, own_upstream.has_value());
    if (auto failure = keeper.start()) {
        try {
            std::rethrow_exception(failure);
        } catch (const control::DaemonUnreachable& e) {
            // The tool matters more than the safety net: run it; the keeper goes on trying.
            warn(std::string(e.what()) + "; running " + command[0] + " without a lease");
        }
    }

    sigset_t previous;
    const UniqueFd signals = block_into_signalfd(true, previous);

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
    // Declared after the keeper: destroyed first, so the proxy stops before the lease drops.
    std::optional<OwnedEngine> owned;
    if (own_upstream) {
        owned.emplace(session, *own_upstream, keeper);
        // The private socket speaks plain HTTP: a client told to use TLS would fail on it.
        std::erase_if(env_strings, [](const std::string& entry) {
            return entry.starts_with("DOCKER_HOST=") || entry.starts_with("DOCKER_TLS_VERIFY=") ||
                   entry.starts_with("DOCKER_CERT_PATH=");
        });
        env_strings.push_back("DOCKER_HOST=" + owned->docker_host());
    }
    std::vector<char*> envp;
    for (auto& entry : env_strings) envp.push_back(entry.data());
    envp.push_back(nullptr);

    pid_t child = -1;
    const int spawned = posix_spawnp(&child, argv[0], nullptr, &attributes, argv.data(), envp.data());
    posix_spawnattr_destroy(&attributes);
    if (spawned != 0) {
        warn("cannot run " + command[0] + ": " + errno_text(spawned));
        return spawned == ENOENT ? exit_not_found : exit_cannot_execute;
    }

    // The keeper's thread keeps the lease; it is dropped when `keeper` goes, as the tool ends.
    for (;;) {
        pollfd fds{signals.get(), POLLIN, 0};
        const int ready = poll(&fds, 1, -1);
        if (ready < 0 && errno != EINTR) throw std::runtime_error("poll: " + errno_text(errno));
        if (fds.revents & POLLIN) {
            signalfd_siginfo info{};
            while (read(signals.get(), &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
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
                if (owned) owned->finish();
                return exit_status_of(status);
            }
        }
    }
}

void print_text(const std::string& text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    if (!text.empty() && text.back() != '\n') std::fputc('\n', stdout);
}

// `end --wait`: asks reaperd what is left of the session until nothing is (exit 0) or `limit`
// passes (exit 75, saying what is left). Asking goes on while reaperd restarts. With `json`,
// the last answer is printed as it came, one JSON object on a line.
int wait_until_gone(control::ControlClient& client, const std::string& session,
                    std::chrono::milliseconds limit, bool json) {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + limit;
    std::optional<control::Reply> last;
    std::string unreachable;
    bool told_dry_run = false;
    for (;;) {
        try {
            last = client.session(session);
            unreachable.clear();
            if (last->nothing_remains()) {
                const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::steady_clock::now() - start);
                print_text(json ? last->json
                                : "session " + session + ": nothing left (waited " +
                                      reaper::format_duration(took) + ")");
                return exit_ok;
            }
            if (last->dry_run.value_or(false) && !told_dry_run) {
                warn("reaperd is in dry run and removes nothing; waiting for the timeout");
                told_dry_run = true;
            }
        } catch (const control::DaemonUnreachable& e) {
            // A restart of reaperd: its sessions and reaps survive it, so keep asking.
            if (unreachable.empty()) warn(std::string(e.what()) + "; still waiting");
            unreachable = e.what();
        } catch (const control::ErrorReply& e) {
            if (e.reply().error.find("unknown op \"session\"") == std::string::npos) throw;
            throw control::ErrorReply("reaperd at " + client.socket_path() +
                                      " is too old to say what is left of a session, so --wait "
                                      "cannot tell when it is gone (the session was ended)");
        }
        const auto now = std::chrono::steady_clock::now();
        if (now >= deadline) break;
        std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(wait_poll_interval, deadline - now));
    }
    std::string why;
    if (!unreachable.empty()) {
        why = "reaperd does not answer (" + unreachable + ")";
    } else if (!last->ready.value_or(false)) {
        why = "reaperd has not listed the engine yet";
    } else {
        why = reaperctl::format_counts(last->remaining.value_or(control::KindCounts{})) +
              " still there; reaperd keeps reaping (reaperctl status says why)";
    }
    if (json && last) print_text(last->json);
    warn("session " + session + ": timed out after " + reaper::format_duration(limit) + ": " + why);
    return exit_wait_timed_out;
}

// How often `logs -f` looks for new lines: what `docker logs -f` users see as immediate, and
// a stat and a read of nothing (a few microseconds) otherwise.
constexpr auto follow_poll_interval = 100ms;

void print_entry(const reaperctl::LogEntry& entry) {
    std::FILE* out = entry.from_stderr ? stderr : stdout;
    std::fwrite(entry.text.data(), 1, entry.text.size(), out);
}

// `logs`: the container's json-file or local log, read from the file the engine keeps it in
// (json-file: inspect's LogPath; local: under the data root GET /info names), holes skipped
// (json_log.hpp, local_log.hpp).
int print_logs(const reaper::ClientOptions& options, const std::string& container,
               std::optional<std::uint64_t> tail, bool follow) {
    reaper::ContainerInfo info;
    std::string data_root;
    try {
        reaper::Client engine(options);
        info = engine.inspect(container);
        if (info.log_driver == "local") data_root = engine.info().docker_root_dir;
    } catch (const reaper::NotFound&) {
        warn("no such container: " + container);
        return exit_error_reply;
    } catch (const reaper::Unreachable& e) {
        warn(e.what());
        return exit_unavailable;
    }
    const auto files = reaper::locate_log(info.id, info.log_driver, info.log_path, data_root);
    if (!files && (info.log_driver == "json-file" || info.log_driver.empty()) && info.log_path.empty()) {
        warn("container " + container + " has no log file yet (the engine names it when the container first starts)");
        return exit_error_reply;
    }
    if (!files) {
        warn("container " + container + " logs with the " + (info.log_driver.empty() ? "engine's" : info.log_driver) +
             " driver; reaperctl logs reads json-file and local logs only (use docker logs)");
        return exit_error_reply;
    }
    const auto& format = info.log_driver == "local" ? reaperctl::local_format : reaperctl::json_file_format;
    const std::string path = files->dir + "/" + files->live_name;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        warn("cannot open " + path + ": " + errno_text(errno) +
             (errno == EACCES ? " (the engine's files are root's: run as root)" : ""));
        return exit_error_reply;
    }
    std::uint64_t offset = 0;
    if (tail) {
        for (const auto& entry : format.tail_entries(fd, *tail, &offset)) print_entry(entry);
    } else {
        offset = format.read_entries(fd, 0, print_entry);
    }
    if (!follow) {
        ::close(fd);
        return exit_ok;
    }
    reaperctl::LogFollower follower(path, fd, offset, format);
    do {
        std::fflush(stdout);
        std::fflush(stderr);
        std::this_thread::sleep_for(follow_poll_interval);
    } while (follower.poll(print_entry));
    return exit_ok;
}

struct Arguments {
    std::optional<std::string> socket;
    std::string command;
    std::vector<std::string> operands;  // positional arguments after the command
    std::vector<std::string> tool;      // run: everything after the session (and "--")
    std::optional<std::string> orphan_session;
    bool own = false;                   // run --own
    std::optional<std::string> engine;  // run --engine ADDR
    bool wait = false;                  // end --wait
    std::optional<std::string> timeout; // end --wait --timeout DUR
    bool json = false;
    bool ended = false;                         // status --ended
    bool pending = false;                       // status --pending
    std::optional<std::uint64_t> limit;         // status --limit N
    std::optional<std::uint64_t> tail;          // logs --tail N
    bool follow = false;                        // logs -f
    bool help = false;
    bool version = false;
};

// The number of `--name N` or `--name=N` at words[i] (i moves past a separate N).
std::uint64_t count_option(const std::vector<std::string>& words, std::size_t& i, const std::string& name) {
    std::string text;
    if (words[i] == name) {
        if (i + 1 >= words.size()) throw UsageError{name + " needs a number"};
        text = words[++i];
    } else {
        text = words[i].substr(name.size() + 1);
    }
    if (text.empty() || text.size() > 18 ||
        !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        throw UsageError{name + " needs a non-negative number, not \"" + text + "\""};
    }
    return std::stoull(text);
}

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
        } else if (word == "--json" &&
                   (args.command == "status" || args.command == "end" || args.command == "orphan")) {
            args.json = true;
        } else if (word == "--ended" && args.command == "status") {
            if (args.pending) throw UsageError{"--ended and --pending exclude each other"};
            args.ended = true;
        } else if (word == "--pending" && args.command == "status") {
            if (args.ended) throw UsageError{"--ended and --pending exclude each other"};
            args.pending = true;
        } else if ((word == "--limit" || word.starts_with("--limit=")) && args.command == "status") {
            args.limit = count_option(words, i, "--limit");
        } else if ((word == "--tail" || word.starts_with("--tail=")) && args.command == "logs") {
            args.tail = count_option(words, i, "--tail");
        } else if ((word == "-f" || word == "--follow") && args.command == "logs") {
            args.follow = true;
        } else if (word == "--wait" && args.command == "end") {
            args.wait = true;
        } else if ((word == "--timeout" || word.starts_with("--timeout=")) && args.command == "end") {
            if (word == "--timeout") {
                if (i + 1 >= words.size()) throw UsageError{"--timeout needs a DURATION"};
                args.timeout = words[++i];
            } else {
                args.timeout = word.substr(10);
            }
        } else if ((word == "--session" || word.starts_with("--session=")) && args.command == "orphan") {
            if (word == "--session") {
                if (i + 1 >= words.size()) throw UsageError{"--session needs a SESSION"};
                args.orphan_session = words[++i];
            } else {
                args.orphan_session = word.substr(10);
            }
        } else if (word == "--own" && args.command == "run") {
            args.own = true;
        } else if ((word == "--engine" || word.starts_with("--engine=")) &&
                   (args.command == "run" || args.command == "logs")) {
            if (word == "--engine") {
                if (i + 1 >= words.size()) throw UsageError{"--engine needs an ADDR"};
                args.engine = words[++i];
            } else {
                args.engine = word.substr(9);
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
        if (args.engine && !args.own) throw UsageError{"--engine is for run --own"};
        std::optional<reaper::EngineAddress> own_upstream;
        if (args.own) {
            try {
                namespace defaults = reaper::defaults;
                const auto engine = defaults::choose_engine(::getuid(), defaults::process_environment,
                                                            defaults::socket_answers);
                own_upstream = args.engine ? reaper::EngineAddress::parse(*args.engine)
                               : engine    ? reaper::EngineAddress::parse(*engine)
                                           : reaper::EngineAddress::from_environment();
            } catch (const std::invalid_argument& e) {
                throw UsageError{e.what()};
            }
            const char* tls = std::getenv("DOCKER_TLS_VERIFY");
            if (own_upstream->kind == reaper::EngineAddress::Kind::Tcp && tls && *tls) {
                throw UsageError{"run --own forwards to the engine without TLS, and DOCKER_TLS_VERIFY is set"};
            }
        }
        return run(client, args.operands[0], args.tool, args.socket, own_upstream);
    }
    if (args.command == "end") {
        expect_operands(args, 1, "one SESSION");
        validate_session_arg(args.operands[0]);
        if (args.timeout && !args.wait) throw UsageError{"--timeout is for end --wait"};
        std::chrono::milliseconds limit = default_wait_timeout;
        if (args.timeout) {
            try {
                limit = reaper::parse_duration(*args.timeout);
            } catch (const std::invalid_argument& e) {
                throw UsageError{std::string("--timeout: ") + e.what()};
            }
        }
        const auto reply = client.end(args.operands[0]);
        print_text(args.json ? reply.json : reaperctl::format_end_reply(args.operands[0], reply));
        if (!args.wait) return exit_ok;
        return wait_until_gone(client, args.operands[0], limit, args.json);
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
        control::Reply reply;
        try {
            reply = client.report_orphan(args.operands[0], session);
        } catch (const control::ErrorReply& e) {
            // A refusal says what the report resolved to, as a success does.
            if (args.json) print_text(e.reply().json);
            throw;
        }
        print_text(args.json ? reply.json : reaperctl::format_orphan_reply(args.operands[0], reply));
        return exit_ok;
    }
    if (args.command == "status") {
        expect_operands(args, 0, "no arguments besides --ended, --pending, --limit and --json");
        const auto status = client.status_json({args.ended, args.limit, args.pending});
        if (args.json) {
            print_text(status);
        } else {
            try {
                print_text(reaperctl::format_status(status));
            } catch (const std::invalid_argument& e) {
                warn(std::string("cannot format the status (") + e.what() + "); raw JSON follows");
                print_text(status);
            }
        }
        return exit_ok;
    }
    if (args.command == "logs") {
        expect_operands(args, 1, "one CONTAINER");
        reaper::ClientOptions options;
        try {
            options = reaper::ClientOptions::from_environment();
            if (args.engine) options.address = reaper::EngineAddress::parse(*args.engine);
        } catch (const std::invalid_argument& e) {
            throw UsageError{e.what()};
        }
        return print_logs(options, args.operands[0], args.tail, args.follow);
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
            warn("writing output: " + errno_text(errno));
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
