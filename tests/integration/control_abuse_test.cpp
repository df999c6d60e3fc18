// Clients that ask and never read: reaperd (a child process) stays within its memory, keeps
// answering everyone else, and stays ready. Before the per-connection output bound, one such
// client grew reaperd's RSS from 9 to 104 MB in 20 s.
//
// The figure is 60 s of abuse; the suite runs 15 s by default (the bound is reached in
// well under a second, after which nothing grows). REAPERD_ABUSE_SECONDS sets another length.
#include "daemon_fixture.hpp"

#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <vector>

using namespace reaperd::itest;

namespace {

using Clock = std::chrono::steady_clock;

// VmRSS of `pid`, in KiB (0 when it cannot be read).
long long rss_kib(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6);
    }
    return 0;
}

int connect_to(const std::string& path) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strcpy(address.sun_path, path.c_str());
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

// Pipelines {"op":"status"} as fast as the socket takes it and never reads; reconnects when
// reaperd closes the connection (after its idle timeout), so the pressure never lets up.
void pipeline_without_reading(const std::string& path, const std::atomic<bool>& stop) {
    const std::string batch = [] {
        std::string all;
        for (int i = 0; i < 64; ++i) all += "{\"op\":\"status\"}\n";
        return all;
    }();
    int fd = -1;
    while (!stop) {
        if (fd < 0) fd = connect_to(path);
        if (fd < 0) {
            std::this_thread::sleep_for(50ms);
            continue;
        }
        const auto n = ::send(fd, batch.data(), batch.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            ::close(fd);
            fd = -1;
        } else if (n < 0) {
            std::this_thread::sleep_for(10ms);
        }
    }
    if (fd >= 0) ::close(fd);
}

}  // namespace

BOOST_AUTO_TEST_CASE(clients_that_never_read_cannot_take_memory_or_starve_others) {
    const char* seconds_text = std::getenv("REAPERD_ABUSE_SECONDS");
    const auto duration = std::chrono::seconds{seconds_text ? std::atoi(seconds_text) : 15};
    Reaperd daemon;
    daemon.start();
    for (int i = 0; i < 20; ++i) daemon.status();  // warm up: allocator, first answers
    const auto baseline = rss_kib(daemon.pid());
    BOOST_REQUIRE(baseline > 0);

    std::atomic<bool> stop{false};
    std::vector<std::thread> abusers;
    for (int i = 0; i < 10; ++i) {
        abusers.emplace_back([&] { pipeline_without_reading(daemon.socket, stop); });
    }
    long long peak = baseline;
    std::vector<long long> probe_ms;
    std::size_t failures = 0;
    const auto start = Clock::now();
    while (Clock::now() - start < duration) {
        const auto asked = Clock::now();
        try {
            daemon.control().status_json();
        } catch (const std::exception& e) {
            ++failures;
            BOOST_TEST_MESSAGE("status failed: " << e.what());
        }
        probe_ms.push_back(
            std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - asked).count());
        peak = std::max(peak, rss_kib(daemon.pid()));
        std::this_thread::sleep_for(100ms);
    }
    stop = true;
    for (auto& t : abusers) t.join();

    const auto growth_kib = peak - baseline;
    BOOST_REQUIRE(!probe_ms.empty());
    std::sort(probe_ms.begin(), probe_ms.end());
    const long long p50_ms = probe_ms[probe_ms.size() / 2];
    const long long p90_ms = probe_ms[probe_ms.size() * 9 / 10];
    const long long slowest_ms = probe_ms.back();
    std::printf("control_abuse: %lld s, 10 clients; RSS %lld -> peak %lld KiB (growth %lld KiB); "
                "%zu status probes, p50 %lld ms, p90 %lld ms, slowest %lld ms, %zu failed\n",
                static_cast<long long>(duration.count()), baseline, peak, growth_kib,
                probe_ms.size(), p50_ms, p90_ms, slowest_ms, failures);
#if defined(__SANITIZE_ADDRESS__)
    // Under ASan every freed reply sits in its quarantine (256 MiB by default) and the shadow
    // grows with it: RSS grew 442 MB here with the bound in force, so it says nothing about
    // the bound. The normal build checks it; this build checks the rest.
    BOOST_TEST_MESSAGE("ASan build: RSS bound not checked (grew " << growth_kib << " KiB)");
#else
    BOOST_TEST(growth_kib <= 8 * 1024, "RSS grew " << growth_kib << " KiB");
#endif
    // Starved, every status would wait behind the abusers' unread replies until its 10 s
    // timeout; served in turn one takes milliseconds: the slowest 13 ms at a load of 9 on 2
    // cores here, 440 ms once at a load of 12 (other test runs and builds beside it). So most
    // probes within 1 s and none near the timeout tell the two apart, and one probe that a
    // loaded machine held up does not fail the test.
    BOOST_TEST(failures == 0u);
    BOOST_TEST(p90_ms <= 1000, "p90 of status " << p90_ms << " ms");
    BOOST_TEST(slowest_ms <= 5000, "slowest status " << slowest_ms << " ms");
    BOOST_TEST(daemon.running());
    BOOST_TEST(daemon.ready());
}
