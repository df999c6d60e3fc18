// reaperd speaks systemd's notification protocol: the test plays systemd's part. It binds
// its own datagram socket, starts reaperd (REAPERD_PATH) with NOTIFY_SOCKET and
// WATCHDOG_USEC pointing at it and a config for the private engine, and reads what arrives.
#include "engine.hpp"

#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::uint64_t monotonic_usec() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1000000u +
           static_cast<std::uint64_t>(ts.tv_nsec) / 1000u;
}

struct Datagram {
    std::string text;  // "KEY=value" lines
    pid_t sender = 0;  // from SCM_CREDENTIALS
    std::uint64_t received_usec = 0;

    bool has(const std::string& line) const {
        std::istringstream lines(text);
        std::string l;
        while (std::getline(lines, l))
            if (l == line) return true;
        return false;
    }
    std::string value(const std::string& key) const {
        std::istringstream lines(text);
        std::string l;
        while (std::getline(lines, l))
            if (l.rfind(key + "=", 0) == 0) return l.substr(key.size() + 1);
        return {};
    }
};

// systemd's side of the protocol: a bound socket and a thread collecting datagrams.
class NotifySocket {
public:
    explicit NotifySocket(const std::string& path) : path_(path) {
        fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        BOOST_REQUIRE(fd_ >= 0);
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        BOOST_REQUIRE(path.size() < sizeof addr.sun_path);
        std::strcpy(addr.sun_path, path.c_str());
        BOOST_REQUIRE(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
        int on = 1;
        setsockopt(fd_, SOL_SOCKET, SO_PASSCRED, &on, sizeof on);
        timeval timeout{0, 200000};
        setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
        reader_ = std::thread([this] { read_loop(); });
    }
    ~NotifySocket() {
        stop_ = true;
        reader_.join();
        close(fd_);
        unlink(path_.c_str());
    }

    std::vector<Datagram> received() const {
        std::lock_guard lock(mutex_);
        return received_;
    }

    // Waits until a datagram at index >= `from` satisfies `match`; returns its index or -1.
    int wait_for(std::size_t from, const std::function<bool(const Datagram&)>& match,
                 std::chrono::milliseconds timeout) const {
        const auto deadline = Clock::now() + timeout;
        while (true) {
            {
                std::lock_guard lock(mutex_);
                for (std::size_t i = from; i < received_.size(); ++i)
                    if (match(received_[i])) return static_cast<int>(i);
            }
            if (Clock::now() > deadline) return -1;
            std::this_thread::sleep_for(20ms);
        }
    }

    std::size_t count() const {
        std::lock_guard lock(mutex_);
        return received_.size();
    }

private:
    void read_loop() {
        while (!stop_) {
            char buffer[4096];
            alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred))];
            iovec iov{buffer, sizeof buffer};
            msghdr msg{};
            msg.msg_iov = &iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control;
            msg.msg_controllen = sizeof control;
            ssize_t n = recvmsg(fd_, &msg, 0);
            if (n < 0) continue;
            Datagram d;
            d.text.assign(buffer, static_cast<std::size_t>(n));
            d.received_usec = monotonic_usec();
            for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
                if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
                    ucred cred{};
                    std::memcpy(&cred, CMSG_DATA(c), sizeof cred);
                    d.sender = cred.pid;
                }
            }
            std::lock_guard lock(mutex_);
            received_.push_back(std::move(d));
        }
    }

    std::string path_;
    int fd_ = -1;
    std::atomic<bool> stop_{false};
    mutable std::mutex mutex_;
    std::vector<Datagram> received_;
    std::thread reader_;
};

// A temp dir with a config for the private engine, and reaperd run on it.
class Daemon {
public:
    Daemon() {
        char tmpl[] = "/tmp/reaperd-notify-test.XXXXXX";
        BOOST_REQUIRE(mkdtemp(tmpl) != nullptr);
        dir_ = tmpl;
        std::filesystem::create_directories(dir_ / "state");
        write_config(good_config());
        notify_ = std::make_unique<NotifySocket>((dir_ / "notify.sock").string());
    }
    ~Daemon() {
        if (pid_ > 0 && !exited_) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
        notify_.reset();
        std::error_code ignored;
        std::filesystem::remove_all(dir_, ignored);
    }

    std::string good_config() const {
        return "engine:\n  host: " + reaper::test::engine().address() +
               "\ncontrol:\n  socket: " + (dir_ / "control.sock").string() +
               "\nstate:\n  dir: " + (dir_ / "state").string() +
               "\nlogs:\n  max_size: 0\n";
    }
    void write_config(const std::string& text) const { std::ofstream(dir_ / "reaperd.yaml") << text; }

    void start(std::chrono::microseconds watchdog) {
        std::vector<std::string> env;
        for (char** e = environ; *e != nullptr; ++e) {
            std::string var = *e;
            if (var.rfind("NOTIFY_SOCKET=", 0) == 0 || var.rfind("WATCHDOG_", 0) == 0 ||
                var.rfind("JOURNAL_STREAM=", 0) == 0 || var.rfind("REAPERD_LOG_TARGET=", 0) == 0)
                continue;
            env.push_back(var);
        }
        env.push_back("NOTIFY_SOCKET=" + (dir_ / "notify.sock").string());
        env.push_back("WATCHDOG_USEC=" + std::to_string(watchdog.count()));
        env.push_back("REAPERD_LOG_TARGET=stderr");
        std::vector<char*> envp;
        for (auto& v : env) envp.push_back(v.data());
        envp.push_back(nullptr);

        const std::string config = (dir_ / "reaperd.yaml").string();
        const std::string log = (dir_ / "reaperd.log").string();
        std::vector<std::string> args{REAPERD_PATH, "--config", config};
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);

        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
        posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        posix_spawn_file_actions_adddup2(&actions, 1, 2);
        int rc = posix_spawn(&pid_, REAPERD_PATH, &actions, nullptr, argv.data(), envp.data());
        posix_spawn_file_actions_destroy(&actions);
        BOOST_REQUIRE_EQUAL(rc, 0);
    }

    void signal(int sig) const { BOOST_REQUIRE_EQUAL(kill(pid_, sig), 0); }

    bool running() {
        if (exited_) return false;
        int status = 0;
        pid_t r = waitpid(pid_, &status, WNOHANG);
        if (r == pid_) {
            exited_ = true;
            status_ = status;
            return false;
        }
        return true;
    }

    // Waits for the exit; returns the exit status, or -1 on a signal or timeout.
    int wait_exit(std::chrono::milliseconds timeout) {
        const auto deadline = Clock::now() + timeout;
        while (running() && Clock::now() < deadline) std::this_thread::sleep_for(50ms);
        if (!exited_) return -1;
        return WIFEXITED(status_) ? WEXITSTATUS(status_) : -1;
    }

    std::string log() const {
        std::ifstream in(dir_ / "reaperd.log");
        std::stringstream text;
        text << in.rdbuf();
        return text.str();
    }

    // The whole conversation, for failure messages.
    std::string transcript() const {
        std::string out = "datagrams:\n";
        for (const auto& d : notify_->received()) out += "  [" + std::to_string(d.sender) + "] " + d.text + "\n";
        return out + "reaperd log:\n" + log();
    }

    pid_t pid() const { return pid_; }
    NotifySocket& notify() { return *notify_; }

private:
    std::filesystem::path dir_;
    std::unique_ptr<NotifySocket> notify_;
    pid_t pid_ = -1;
    bool exited_ = false;
    int status_ = 0;
};

auto line(const std::string& l) {
    return [l](const Datagram& d) { return d.has(l); };
}

}  // namespace

BOOST_AUTO_TEST_CASE(ready_watchdog_status_reload_and_stop) {
    Daemon daemon;
    daemon.start(1s);
    auto& notify = daemon.notify();

    int ready = notify.wait_for(0, line("READY=1"), 60s);
    BOOST_TEST_INFO(daemon.transcript());
    BOOST_REQUIRE(ready >= 0);
    // NotifyAccess=main: every message must come from the main process.
    for (const auto& d : notify.received()) BOOST_TEST(d.sender == daemon.pid());

    // STATUS= is a one-line summary, present by the time the daemon is ready.
    int status = notify.wait_for(0, [](const Datagram& d) { return !d.value("STATUS").empty(); }, 30s);
    BOOST_TEST_INFO(daemon.transcript());
    BOOST_TEST(status >= 0);

    // WATCHDOG_USEC=1s: pings at least every 0.5 s while the loop turns; three pings after
    // READY within 10 s is a generous bound on a loaded machine.
    int pings = 0;
    std::size_t from = static_cast<std::size_t>(ready) + 1;
    for (; pings < 3; ++pings) {
        int i = notify.wait_for(from, line("WATCHDOG=1"), 10s);
        if (i < 0) break;
        from = static_cast<std::size_t>(i) + 1;
    }
    BOOST_TEST_INFO(daemon.transcript());
    BOOST_TEST(pings == 3);

    // SIGHUP: RELOADING=1 with the monotonic time of the reload start, then READY=1.
    std::size_t before_hup = notify.count();
    const std::uint64_t hup_usec = monotonic_usec();
    daemon.signal(SIGHUP);
    int reloading = notify.wait_for(before_hup, line("RELOADING=1"), 30s);
    BOOST_TEST_INFO(daemon.transcript());
    BOOST_REQUIRE(reloading >= 0);
    auto reload = notify.received()[static_cast<std::size_t>(reloading)];
    const std::string monotonic = reload.value("MONOTONIC_USEC");
    BOOST_TEST_INFO("MONOTONIC_USEC=" << monotonic);
    BOOST_REQUIRE(!monotonic.empty());
    const std::uint64_t reload_usec = std::stoull(monotonic);
    BOOST_TEST(reload_usec >= hup_usec);
    BOOST_TEST(reload_usec <= reload.received_usec);
    BOOST_TEST_INFO(daemon.transcript());
    BOOST_TEST(notify.wait_for(static_cast<std::size_t>(reloading) + 1, line("READY=1"), 30s) >= 0);

    // A broken config on SIGHUP: still RELOADING=1 then READY=1 (systemd waits for it), the
    // daemon keeps running on the old config and says why in its log.
    daemon.write_config("sessions:\n  lease_grace: soon\n");
    before_hup = notify.count();
    daemon.signal(SIGHUP);
    int bad_reloading = notify.wait_for(before_hup, line("RELOADING=1"), 30s);
    BOOST_TEST_INFO(daemon.transcript());
    BOOST_REQUIRE(bad_reloading >= 0);
    BOOST_TEST(notify.wait_for(static_cast<std::size_t>(bad_reloading) + 1, line("READY=1"), 30s) >= 0);
    std::this_thread::sleep_for(500ms);
    BOOST_TEST(daemon.running());
    BOOST_TEST_INFO(daemon.transcript());
    BOOST_TEST(daemon.log().find("lease_grace") != std::string::npos);
    std::size_t pings_before = notify.count();
    BOOST_TEST(notify.wait_for(pings_before, line("WATCHDOG=1"), 10s) >= 0);

    // SIGTERM: STOPPING=1, then exit 0 well within the unit's stop timeout.
    std::size_t before_term = notify.count();
    daemon.signal(SIGTERM);
    BOOST_TEST_INFO(daemon.transcript());
    BOOST_TEST(notify.wait_for(before_term, line("STOPPING=1"), 30s) >= 0);
    const int code = daemon.wait_exit(60s);
    BOOST_TEST_INFO(daemon.transcript());
    BOOST_TEST(code == 0);
}

BOOST_AUTO_TEST_CASE(ready_waits_for_the_engine) {
    auto& engine = reaper::test::engine();
    engine.kill();
    Daemon daemon;
    daemon.start(2s);
    auto& notify = daemon.notify();
    // With the engine down, the daemon runs and pings its watchdog, but is not ready; a
    // reload meanwhile (SIGHUP) must not announce readiness either (issue 10).
    int ping = notify.wait_for(0, line("WATCHDOG=1"), 30s);
    daemon.signal(SIGHUP);
    std::this_thread::sleep_for(3s);
    BOOST_TEST_INFO(daemon.transcript());
    BOOST_TEST(ping >= 0);
    BOOST_TEST(daemon.running());
    BOOST_TEST(notify.wait_for(0, line("READY=1"), 0ms) == -1);
    BOOST_TEST(notify.wait_for(0, line("RELOADING=1"), 0ms) == -1);

    const std::size_t before_engine = notify.count();
    engine.start();
    int ready = notify.wait_for(0, line("READY=1"), 90s);
    BOOST_TEST_INFO(daemon.transcript());
    BOOST_REQUIRE(ready >= 0);
    BOOST_TEST(static_cast<std::size_t>(ready) >= before_engine);

    daemon.signal(SIGTERM);
    BOOST_TEST_INFO(daemon.transcript());
    BOOST_TEST(daemon.wait_exit(60s) == 0);
}
