// What does `reaperctl run --own` cost a tool? The labelling proxy (reaper::EngineProxy, run
// in this process as reaperctl runs it) against the private engine directly, interleaved
// so both see the same machine load:
//   1. per-request overhead: GET /_ping on a kept-alive connection (reaper::Client);
//   2. round trips: create + start + exec + force-remove of a container (reaper::Client),
//      the median proxied / direct ratio (target <= 1.05);
//   3. `docker logs` of a 100 MB log with Debian's docker CLI, and a raw GET .../logs read to
//      its end: MB/s proxied / direct (target >= 0.9), with the proxy's CPU time.
//
// Each ratio is the median over pairs measured back to back: on this shared 2-core machine the
// load drifts by 2x within a run (4.1 s then 2.3 s for the same direct `docker logs`).
//
// Usage: proxy_bench [round-trips] [log-runs]   (defaults 12 and 6). Exit status 1 when a
// target is missed.
#include "engine.hpp"

#include <reaper/client.hpp>
#include <reaper/proxy.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr double latency_target = 1.05;
constexpr double throughput_target = 0.9;
constexpr std::uint64_t log_blocks = 98;
constexpr std::uint64_t log_payload = log_blocks * 1'024'000;  // bytes of stdout in the log: 100.4 MB

double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    const auto n = values.size();
    return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// The median of a[i] / b[i]: each pair was measured back to back, so a load that drifts over
// the run (other builds on the machine) cancels out of each ratio.
double paired_ratio(const std::vector<double>& a, const std::vector<double>& b) {
    std::vector<double> ratios;
    for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) ratios.push_back(a[i] / b[i]);
    return median(ratios);
}

double process_cpu_seconds() {
    rusage usage{};
    ::getrusage(RUSAGE_SELF, &usage);
    auto s = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) / 1e6; };
    return s(usage.ru_utime) + s(usage.ru_stime);
}

reaper::ClientOptions options_for(const std::string& address) {
    auto options = reaper::test::engine().client_options();
    options.address = reaper::EngineAddress::parse(address);
    options.request_timeout = 120s;
    return options;
}

// One round trip's steps in seconds: create, start, exec, remove, and their sum last.
std::array<double, 5> round_trip(reaper::Client& client) {
    reaper::ContainerSpec spec;
    spec.image = reaper::test::PrivateEngine::image;
    spec.cmd = {"sleep", "600"};
    std::array<double, 5> steps{};
    auto t = Clock::now();
    const auto lap = [&](int step) {
        steps[step] = seconds_since(t);
        steps[4] += steps[step];
        t = Clock::now();
    };
    const auto id = client.create(spec);
    lap(0);
    client.start(id);
    lap(1);
    client.exec(id, {"true"}, 30s);
    lap(2);
    client.remove(id, {true, true});
    lap(3);
    return steps;
}

// `docker logs ID` with stdout to /dev/null; its wall time.
double cli_logs(const std::string& address, const std::string& id) {
    std::vector<std::string> args{"/usr/bin/docker", "--host", address, "logs", id};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    pid_t pid = -1;
    const auto start = Clock::now();
    if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) {
        throw std::runtime_error("cannot run /usr/bin/docker");
    }
    posix_spawn_file_actions_destroy(&actions);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) throw std::runtime_error("docker logs failed");
    return seconds_since(start);
}

// GET /containers/ID/logs?stdout=1 on a socket of its own, read to the end; wall time and
// bytes read.
std::pair<double, std::uint64_t> raw_logs(const std::string& socket_path, const std::string& id) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un where{};
    where.sun_family = AF_UNIX;
    std::strncpy(where.sun_path, socket_path.c_str(), sizeof where.sun_path - 1);
    const auto start = Clock::now();
    if (::connect(fd, reinterpret_cast<sockaddr*>(&where), sizeof where) != 0) {
        ::close(fd);
        throw std::runtime_error("connect " + socket_path);
    }
    const std::string request = "GET /containers/" + id + "/logs?stdout=1 HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n";
    [[maybe_unused]] auto sent = ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    std::vector<char> buffer(256 * 1024);
    std::uint64_t total = 0;
    for (ssize_t n; (n = ::recv(fd, buffer.data(), buffer.size(), 0)) > 0;) total += std::uint64_t(n);
    ::close(fd);
    return {seconds_since(start), total};
}

}  // namespace

int main(int argc, char** argv) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows as it comes, also into a pipe
    const int trips = std::max(1, argc > 1 ? std::atoi(argv[1]) : 12);
    const int log_runs = std::max(1, argc > 2 ? std::atoi(argv[2]) : 6);
    auto& engine = reaper::test::engine();

    char pattern[] = "/tmp/proxy-bench.XXXXXX";
    const std::string dir = ::mkdtemp(pattern);
    reaper::ProxyOptions proxy_options;
    proxy_options.upstream = reaper::EngineAddress::parse(engine.address());
    proxy_options.listen_path = dir + "/docker.sock";
    proxy_options.session = "proxy-bench";
    reaper::EngineProxy proxy(proxy_options);
    proxy.start();
    const std::string proxied = "unix://" + proxy_options.listen_path;
    reaper::Client direct_client(options_for(engine.address()));
    reaper::Client proxy_client(options_for(proxied));
    std::printf("proxy_bench: %d round trips and %d log reads each way, interleaved; load average %s",
                trips, log_runs, [] {
                    static char text[64] = "?\n";
                    if (FILE* f = std::fopen("/proc/loadavg", "r")) {
                        if (!std::fgets(text, sizeof text, f)) std::strcpy(text, "?\n");
                        std::fclose(f);
                    }
                    return text;
                }());

    // 1. Per-request overhead.
    {
        constexpr int pings = 2000;
        direct_client.ping();
        proxy_client.ping();
        double direct = 0, through = 0;
        for (int round = 0; round < 2; ++round) {
            auto t = Clock::now();
            for (int i = 0; i < pings / 2; ++i) direct_client.ping();
            direct += seconds_since(t);
            t = Clock::now();
            for (int i = 0; i < pings / 2; ++i) proxy_client.ping();
            through += seconds_since(t);
        }
        std::printf("\n/_ping, kept alive, %d each way\n", pings);
        std::printf("  direct %.0f us, proxied %.0f us per request: the proxy adds %.0f us\n",
                    direct / pings * 1e6, through / pings * 1e6, (through - direct) / pings * 1e6);
    }

    // 2. Round trips.
    bool latency_held = false;
    {
        round_trip(direct_client);  // warm both paths
        round_trip(proxy_client);
        std::array<std::vector<double>, 5> direct, through;
        const auto record = [](std::array<std::vector<double>, 5>& into, const std::array<double, 5>& steps) {
            for (std::size_t i = 0; i < steps.size(); ++i) into[i].push_back(steps[i]);
        };
        for (int i = 0; i < trips; ++i) {
            // Alternate who goes first, so a drift in load favours neither.
            if (i % 2 == 0) {
                record(direct, round_trip(direct_client));
                record(through, round_trip(proxy_client));
            } else {
                record(through, round_trip(proxy_client));
                record(direct, round_trip(direct_client));
            }
        }
        const double ratio = paired_ratio(through[4], direct[4]);
        latency_held = ratio <= latency_target;
        std::printf("\ncreate + start + exec + force-remove, median of %d; ratio: median of the pairs'\n", trips);
        std::printf("  direct %.1f ms (min %.1f), proxied %.1f ms (min %.1f): ratio %.3f (target <= %.2f: %s)\n",
                    median(direct[4]) * 1e3, *std::min_element(direct[4].begin(), direct[4].end()) * 1e3,
                    median(through[4]) * 1e3, *std::min_element(through[4].begin(), through[4].end()) * 1e3,
                    ratio, latency_target, latency_held ? "PASS" : "FAIL");
        const char* names[] = {"create", "start", "exec", "remove"};
        for (int i = 0; i < 4; ++i) {
            std::printf("    %-6s direct %6.1f ms, proxied %6.1f ms\n", names[i], median(direct[i]) * 1e3,
                        median(through[i]) * 1e3);
        }
        std::printf("  labelled by the proxy: %llu containers\n", (unsigned long long)proxy.stats().containers);
    }

    // 3. Log throughput.
    bool throughput_held = false;
    {
        reaper::ContainerSpec spec;
        spec.image = reaper::test::PrivateEngine::image;
        // 1000-byte lines (the engine's per-line JSON decoding would otherwise dominate): a
        // 1,024,000-byte block written log_blocks times. Not `yes | head`: the harness's
        // engine inherits a blocked SIGPIPE from this process (Poco blocks it in every
        // program that links it), so `yes` would spin on EPIPE forever.
        spec.cmd = {"sh", "-c",
                    "busybox printf '%0999d\\n' 0 > /tmp/b; for i in 1 2 3 4 5 6 7 8 9 10; do "
                    "cat /tmp/b /tmp/b > /tmp/c; mv /tmp/c /tmp/b; done; "
                    "for i in $(seq " + std::to_string(log_blocks) + "); do cat /tmp/b; done"};
        const auto id = direct_client.create(spec);
        direct_client.start(id);
        direct_client.wait(id, 300s);
        std::vector<double> cli_direct, cli_through, raw_direct, raw_through;
        std::uint64_t raw_bytes = 0;
        double proxy_cpu = 0;
        const auto read_direct = [&] {
            cli_direct.push_back(cli_logs(engine.address(), id));
            auto [seconds, bytes] = raw_logs(engine.socket_path(), id);
            raw_direct.push_back(seconds);
            raw_bytes = bytes;
        };
        const auto read_through = [&] {
            const auto cpu = process_cpu_seconds();
            cli_through.push_back(cli_logs(proxied, id));
            proxy_cpu += process_cpu_seconds() - cpu;
            raw_through.push_back(raw_logs(proxy_options.listen_path, id).first);
        };
        for (int i = 0; i < log_runs; ++i) {
            if (i % 2 == 0) {
                read_direct();
                read_through();
            } else {
                read_through();
                read_direct();
            }
        }
        direct_client.remove(id, {true, true});
        const double mb = double(log_payload) / 1e6;
        const double cli_ratio = paired_ratio(cli_direct, cli_through);
        const double raw_ratio = paired_ratio(raw_direct, raw_through);
        throughput_held = cli_ratio >= throughput_target;
        std::printf("\ndocker logs of a %.0f MB log (1000-byte lines), median of %d; ratio: median of the pairs'\n",
                    mb, log_runs);
        std::printf("  docker CLI: direct %.0f MB/s, proxied %.0f MB/s: ratio %.3f (target >= %.1f: %s)\n",
                    mb / median(cli_direct), mb / median(cli_through), cli_ratio, throughput_target,
                    throughput_held ? "PASS" : "FAIL");
        std::printf("  raw GET (%.0f MB with frame headers): direct %.0f MB/s, proxied %.0f MB/s: ratio %.3f\n",
                    double(raw_bytes) / 1e6, double(raw_bytes) / 1e6 / median(raw_direct),
                    double(raw_bytes) / 1e6 / median(raw_through), raw_ratio);
        std::printf("  proxy CPU while the CLI read through it: %.2f s per 100 MB\n", proxy_cpu / log_runs);
        const auto samples = [](const char* name, const std::vector<double>& seconds) {
            std::printf("    %-12s", name);
            for (double s : seconds) std::printf(" %5.2f", s);
            std::printf(" s\n");
        };
        samples("CLI direct", cli_direct);
        samples("CLI proxied", cli_through);
        samples("raw direct", raw_direct);
        samples("raw proxied", raw_through);
    }

    proxy.stop();
    fs::remove_all(dir);
    return latency_held && throughput_held ? 0 : 1;
}
