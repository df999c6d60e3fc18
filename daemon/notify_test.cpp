// The notification messages as systemd receives them, read from this test's own socket.
#include "notify.hpp"

#include <boost/test/unit_test.hpp>

#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace {

struct NotifySocket {
    std::string path = "/tmp/reaperd-notify-unit." + std::to_string(getpid());
    int fd = -1;
    NotifySocket() {
        fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::strcpy(addr.sun_path, path.c_str());
        unlink(path.c_str());
        BOOST_REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
        timeval timeout{10, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
        setenv("NOTIFY_SOCKET", path.c_str(), 1);
    }
    ~NotifySocket() {
        unsetenv("NOTIFY_SOCKET");
        close(fd);
        unlink(path.c_str());
    }
    std::string next() {
        char buf[4096];
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        BOOST_REQUIRE(n >= 0);
        return std::string(buf, static_cast<std::size_t>(n));
    }
};

std::uint64_t monotonic_usec() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1000000u +
           static_cast<std::uint64_t>(ts.tv_nsec) / 1000u;
}

}  // namespace

BOOST_AUTO_TEST_CASE(each_call_sends_its_assignment) {
    NotifySocket socket;
    reaperd::notify::ready();
    BOOST_TEST(socket.next() == "READY=1");
    reaperd::notify::watchdog();
    BOOST_TEST(socket.next() == "WATCHDOG=1");
    reaperd::notify::stopping();
    BOOST_TEST(socket.next() == "STOPPING=1");
    reaperd::notify::status("3 sessions, 7 containers, 0 pending, engine up");
    BOOST_TEST(socket.next() == "STATUS=3 sessions, 7 containers, 0 pending, engine up");
}

BOOST_AUTO_TEST_CASE(status_stays_one_assignment) {
    NotifySocket socket;
    reaperd::notify::status("engine down:\nconnection refused\r");
    BOOST_TEST(socket.next() == "STATUS=engine down: connection refused ");
}

BOOST_AUTO_TEST_CASE(reloading_carries_the_monotonic_time) {
    NotifySocket socket;
    const auto before = monotonic_usec();
    reaperd::notify::reloading();
    const auto after = monotonic_usec();
    const std::string message = socket.next();
    const std::string prefix = "RELOADING=1\nMONOTONIC_USEC=";
    BOOST_REQUIRE(message.rfind(prefix, 0) == 0);
    const auto usec = std::stoull(message.substr(prefix.size()));
    BOOST_TEST(usec >= before);
    BOOST_TEST(usec <= after);
}

BOOST_AUTO_TEST_CASE(watchdog_interval_is_half_of_watchdog_usec) {
    unsetenv("WATCHDOG_PID");
    unsetenv("WATCHDOG_USEC");
    BOOST_TEST(!reaperd::notify::watchdog_interval().has_value());
    setenv("WATCHDOG_USEC", "30000000", 1);
    auto interval = reaperd::notify::watchdog_interval();
    BOOST_REQUIRE(interval.has_value());
    BOOST_TEST(interval->count() == 15000);
    // Meant for another process (WATCHDOG_PID names someone else): no watchdog here.
    setenv("WATCHDOG_PID", "1", 1);
    BOOST_TEST(!reaperd::notify::watchdog_interval().has_value());
    unsetenv("WATCHDOG_PID");
    unsetenv("WATCHDOG_USEC");
}

BOOST_AUTO_TEST_CASE(without_notify_socket_every_call_is_a_no_op) {
    unsetenv("NOTIFY_SOCKET");
    BOOST_CHECK_NO_THROW(reaperd::notify::ready());
    BOOST_CHECK_NO_THROW(reaperd::notify::status("x"));
    BOOST_CHECK_NO_THROW(reaperd::notify::watchdog());
    BOOST_CHECK_NO_THROW(reaperd::notify::reloading());
    BOOST_CHECK_NO_THROW(reaperd::notify::stopping());
}
