// Does a log cap hold against a runaway writer, and at what cost?
//
// Starts a private engine and a container running `yes` (about 70 MB/s of json log on an
// idle machine). Baseline: the same writer uncapped, its growth rate measured for a few
// seconds. Then a fresh writer capped at 10 MiB (action truncate) by a LogCapper in this
// process, exactly as reaperd runs it, its cuts punching holes; then the same with every
// punch refused, so that each cut truncates as before issue 21 (the ratio of the two is
// printed): the log's size (live file plus rotations) is sampled
// at 100 Hz for 20 s, and the capper thread's CPU time is read from the kernel
// (/proc/self/task/<tid>/schedstat, nanoseconds). Then the same once more with a real
// reaperd child (logs.max_size: 10MiB) doing the capping, its whole-process CPU time read
// the same way, and at issue 21's acceptance cap of 2 MiB. The bounds: never above
// 1.1x the cap (bytes on disk), at most 10% of one core.
//
// Usage: logcap_bench [seconds]   (default 20 per phase). Exit status 1 when a bound is not
// held.
#include "engine.hpp"
#include "logcap/logcap.hpp"
#include "logcap/logcap_file.hpp"
#include "reaperd_child.hpp"

#include <reaper/client.hpp>
#include <reaper/control.hpp>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::uint64_t MiB = 1024 * 1024;
constexpr std::uint64_t cap_bytes = 10 * MiB;
constexpr std::uint64_t bound_bytes = 11 * MiB;
// Issue 21's acceptance: a 70 MB/s writer under a 2 MiB cap, its log at most 1.1x the cap.
constexpr std::uint64_t small_cap_bytes = 2 * MiB;
constexpr double bound_ratio = 1.1;
constexpr double cpu_bound_percent = 10.0;
constexpr auto sample_period = 10ms;  // 100 Hz

// The bytes on disk of the live file and its rotations, as the capper counts them (a punched
// cut leaves the apparent size growing).
std::uint64_t log_bytes(const fs::path& live) {
    std::error_code ec;
    std::uint64_t total = reaperd::logcap::allocated_bytes(live.string());
    for (auto& entry : fs::directory_iterator(live.parent_path(), ec)) {
        if (!reaperd::is_rotation(entry.path().filename().string(), live.filename().string())) continue;
        total += reaperd::logcap::allocated_bytes(entry.path().string());
    }
    return total;
}

// CPU time of this process's thread named `name`, in ns; 0 if there is none.
std::uint64_t thread_cpu_ns(const std::string& name) {
    for (auto& task : fs::directory_iterator("/proc/self/task")) {
        std::ifstream comm(task.path() / "comm");
        std::string line;
        std::getline(comm, line);
        if (line != name) continue;
        std::ifstream schedstat(task.path() / "schedstat");
        std::uint64_t ns = 0;
        schedstat >> ns;
        return ns;
    }
    return 0;
}

std::uint64_t process_cpu_ns() {
    struct rusage usage {};
    ::getrusage(RUSAGE_SELF, &usage);
    auto tv = [](const timeval& t) { return std::uint64_t(t.tv_sec) * 1'000'000'000 + std::uint64_t(t.tv_usec) * 1000; };
    return tv(usage.ru_utime) + tv(usage.ru_stime);
}

struct Writer {
    reaper::Client& client;
    std::string id;
    fs::path log_path;
    Writer(reaper::Client& c, const std::string& name) : client(c) {
        reaper::ContainerSpec spec;
        spec.name = reaper::test::unique_name(name);
        spec.image = reaper::test::PrivateEngine::image;
        spec.cmd = {"yes"};
        spec.labels = {{"reaperd.session", "bench"}};
        id = client.create(spec);
        client.start(id);
        log_path = client.inspect(id).log_path;
    }
    ~Writer() {
        try {
            client.remove(id, {true, true});
        } catch (const std::exception& e) {
            std::fprintf(stderr, "could not remove %s: %s\n", id.c_str(), e.what());
        }
    }
};

std::uint64_t schedstat_ns(const fs::path& file) {
    std::ifstream in(file);
    std::uint64_t ns = 0;
    in >> ns;
    return ns;
}

// CPU time of a whole process (all its threads), in ns.
std::uint64_t process_cpu_ns(pid_t pid) {
    std::uint64_t total = 0;
    std::error_code ec;
    for (auto& task : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec))
        total += schedstat_ns(task.path() / "schedstat");
    return total;
}

// A reaperd child on the private engine, capping logs at `max_size`.
class Reaperd : public bench::ReaperdChild {
public:
    Reaperd(const std::string& engine_address, const std::string& max_size)
        : ReaperdChild(engine_address, bench::make_temp_dir("logcap-bench"), "logs:\n  max_size: " + max_size + "\n") {}
};

struct Sampled {
    std::uint64_t max_bytes = 0;
    std::uint64_t samples = 0;
    std::uint64_t over_cap = 0;
    double seconds = 0;
};

// Samples the log at 100 Hz for `duration`, counting the samples over `cap`.
Sampled sample(const fs::path& log, std::chrono::seconds duration, std::uint64_t cap = cap_bytes) {
    Sampled s;
    auto t0 = Clock::now();
    for (auto next = t0; next < t0 + duration; next += sample_period) {
        auto bytes = log_bytes(log);
        s.max_bytes = std::max(s.max_bytes, bytes);
        s.over_cap += bytes > cap;
        ++s.samples;
        std::this_thread::sleep_until(next + sample_period);
    }
    s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return s;
}

double mib(std::uint64_t bytes) { return double(bytes) / double(MiB); }

}  // namespace

int main(int argc, char** argv) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each figure as it is measured, also into a pipe
    auto seconds = std::chrono::seconds(argc > 1 ? std::atoi(argv[1]) : 20);
    if (seconds.count() <= 0) {
        std::fprintf(stderr, "usage: %s [seconds]\n", argv[0]);
        return 64;
    }
    {
        // The figures depend on how busy the machine is: say so with them.
        std::ifstream loadavg("/proc/loadavg");
        std::string one, five;
        loadavg >> one >> five;
        std::printf("machine:  %u cores, load average %s (1 min) %s (5 min)\n",
                    std::thread::hardware_concurrency(), one.c_str(), five.c_str());
    }
    auto& engine = reaper::test::engine();
    reaper::Client client(engine.client_options());
    reaperd::EngineAdapter port(client);  // what reaperd's main gives its capper

    // Baseline: how fast the writer grows its log with nothing in the way.
    double baseline_rate = 0;
    {
        Writer writer(client, "bench-uncapped");
        std::this_thread::sleep_for(500ms);  // past the start-up
        auto b0 = log_bytes(writer.log_path);
        auto t0 = Clock::now();
        std::this_thread::sleep_for(5s);
        auto b1 = log_bytes(writer.log_path);
        baseline_rate = double(b1 - b0) / std::chrono::duration<double>(Clock::now() - t0).count();
    }
    std::printf("baseline: uncapped `yes` grows its json log at %.1f MB/s\n", baseline_rate / 1e6);

    reaperd::LogCapper::Options options;
    options.logs.max_size_bytes = cap_bytes;
    options.logs.action = reaperd::LogAction::truncate;
    options.sink = [](reaperd::Priority, std::string_view, std::string_view, std::vector<reaperd::LogField>) {};

    // One capped phase: a fresh writer, capped by a LogCapper in this process whose cuts
    // punch holes (the default) or, with the punch refused as a file system without it
    // would, truncate (the cut before issue 21, and the fallback now).
    struct Phase {
        double capper_percent = 0;
        std::uint64_t max_bytes = 0;
        bool held = false;
    };
    auto capped_phase = [&](bool truncate) {
        auto phase_options = options;
        if (truncate) phase_options.cut_calls.punch_hole = [](int, std::uint64_t, std::uint64_t) { return EOPNOTSUPP; };
        reaperd::LogCapper capper(port, phase_options);
        capper.start();
        std::optional<Writer> writer(std::in_place, client, "bench-capped");
        reaperd::ContainerLog c;
        c.id = writer->id;
        c.name = "bench-capped";
        c.session = "bench";
        c.log_path = writer->log_path.string();
        c.log_driver = "json-file";
        capper.add(c);
        std::this_thread::sleep_for(500ms);  // the capper has seen the writer start

        auto counters0 = capper.counters();
        auto capper_cpu0 = thread_cpu_ns("reaperd-logcap");
        auto process_cpu0 = process_cpu_ns();
        auto bytes0 = log_bytes(writer->log_path);
        auto sampled = sample(writer->log_path, seconds);
        double elapsed = sampled.seconds;
        auto capper_cpu = thread_cpu_ns("reaperd-logcap") - capper_cpu0;
        auto process_cpu = process_cpu_ns() - process_cpu0;
        auto counters = capper.counters();
        auto bytes1 = log_bytes(writer->log_path);
        capper.stop();
        // Removed before the next phase: left running, this `yes` (labelled with a session)
        // was capped by reaperd too, and two runaway writers with dockerd saturated both
        // cores; reaperd then read 35% of a core instead of its ~1%.
        writer.reset();

        Phase phase;
        phase.capper_percent = 100.0 * double(capper_cpu) / 1e9 / elapsed;
        phase.max_bytes = sampled.max_bytes;
        double process_percent = 100.0 * double(process_cpu) / 1e9 / elapsed;
        // What the writer wrote while capped: all that was cut away, plus what the log gained
        // on disk.
        double written_rate =
            (double(counters.log_bytes_dropped - counters0.log_bytes_dropped) + double(bytes1) - double(bytes0)) /
            elapsed;
        bool size_held = sampled.max_bytes <= bound_bytes;
        bool cpu_held = phase.capper_percent <= cpu_bound_percent;
        phase.held = size_held && cpu_held;

        std::printf("capped:   cap %.0f MiB, cuts by %s, %.1f s sampled at %.0f Hz (%llu samples)\n", mib(cap_bytes),
                    truncate ? "truncate (punch refused)" : "punch_hole", elapsed,
                    double(sampled.samples) / elapsed, (unsigned long long)sampled.samples);
        std::printf("  max bytes on disk:   %.2f MiB = %.3f x cap (bound %.0f MiB: %s); samples over the cap: %llu\n",
                    mib(sampled.max_bytes), double(sampled.max_bytes) / double(cap_bytes), mib(bound_bytes),
                    size_held ? "held" : "NOT HELD", (unsigned long long)sampled.over_cap);
        std::printf("  writer while capped: %.1f MB/s = %.2f x baseline; %llu cuts (%.1f/s), %llu by truncate\n",
                    written_rate / 1e6, baseline_rate > 0 ? written_rate / baseline_rate : 0.0,
                    (unsigned long long)(counters.truncations - counters0.truncations),
                    double(counters.truncations - counters0.truncations) / elapsed,
                    (unsigned long long)(counters.cut_fallbacks - counters0.cut_fallbacks));
        std::printf("  capper thread CPU:   %.2f%% of one core (bound %.0f%%: %s); %.0f wake-ups/s\n",
                    phase.capper_percent, cpu_bound_percent, cpu_held ? "held" : "NOT HELD",
                    double(counters.check_rounds - counters0.check_rounds) / elapsed);
        std::printf("  whole bench process: %.2f%% of one core (capper + 100 Hz sampler + client)\n",
                    process_percent);
        return phase;
    };
    const Phase punched = capped_phase(false);
    const Phase truncated = capped_phase(true);
    std::printf("punch_hole / truncate: capper CPU %.2f x, max bytes on disk %.2f x\n",
                truncated.capper_percent > 0 ? punched.capper_percent / truncated.capper_percent : 0.0,
                truncated.max_bytes > 0 ? double(punched.max_bytes) / double(truncated.max_bytes) : 0.0);

    // The capper alone against a paced writer at the 70 MB/s of ~70-byte lines, in
    // append mode like the engine's: on a machine too busy for dockerd to reach that rate,
    // this still shows whether the capper keeps up with it.
    auto synthetic_phase = [&](bool truncate) {
        fs::path dir = fs::temp_directory_path() / reaper::test::unique_name("logcap-bench-synthetic");
        std::string id(64, 'b');
        fs::create_directories(dir / "containers" / id);
        fs::path live = dir / "containers" / id / (id + "-json.log");
        constexpr double rate = 70e6;
        std::atomic<bool> writing{true};
        std::atomic<std::uint64_t> written{0};
        std::thread writer_thread([&] {
            std::string line = "{\"log\":\"y\\n\",\"stream\":\"stdout\",\"time\":\"2026-11-30T14:00:00.000000000Z\"}\n";
            std::string chunk;
            while (chunk.size() < 70'000) chunk += line;
            int fd = ::open(live.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
            auto start = Clock::now();
            while (writing) {
                auto due = std::chrono::duration<double>(Clock::now() - start).count() * rate;
                while (double(written) < due && writing) {
                    if (::write(fd, chunk.data(), chunk.size()) > 0) written += chunk.size();
                }
                std::this_thread::sleep_for(1ms);
            }
            ::close(fd);
        });
        auto phase_options = options;
        if (truncate) phase_options.cut_calls.punch_hole = [](int, std::uint64_t, std::uint64_t) { return EOPNOTSUPP; };
        reaperd::LogCapper synthetic(port, phase_options);
        synthetic.start();
        reaperd::ContainerLog sc;
        sc.id = id;
        sc.name = "bench-synthetic";
        sc.session = "bench";
        sc.log_path = live.string();
        sc.log_driver = "json-file";
        synthetic.add(sc);
        std::this_thread::sleep_for(500ms);
        auto cpu0 = thread_cpu_ns("reaperd-logcap");
        auto rounds0 = synthetic.counters().check_rounds;
        auto w0 = written.load();
        auto d = sample(live, seconds);
        auto cpu = thread_cpu_ns("reaperd-logcap") - cpu0;
        double write_rate = double(written - w0) / d.seconds;
        double percent = 100.0 * double(cpu) / 1e9 / d.seconds;
        auto c = synthetic.counters();
        writing = false;
        writer_thread.join();
        synthetic.stop();
        fs::remove_all(dir);
        std::printf("synthetic: a paced writer at %.1f MB/s (70 MB/s asked), cap 10 MiB, cuts by %s, %.1f s at %.0f Hz\n",
                    write_rate / 1e6, truncate ? "truncate (punch refused)" : "punch_hole", d.seconds,
                    double(d.samples) / d.seconds);
        std::printf("  max bytes on disk:   %.2f MiB = %.3f x cap (bound %.0f MiB: %s); samples over the cap: %llu\n",
                    mib(d.max_bytes), double(d.max_bytes) / double(cap_bytes), mib(bound_bytes),
                    d.max_bytes <= bound_bytes ? "held" : "NOT HELD", (unsigned long long)d.over_cap);
        std::printf("  capper thread CPU:   %.2f%% of one core; %.0f wake-ups/s; %.1f cuts/s\n", percent,
                    double(c.check_rounds - rounds0) / d.seconds, double(c.truncations) / d.seconds);
        return percent;
    };
    const double punched_synthetic = synthetic_phase(false);
    const double truncated_synthetic = synthetic_phase(true);
    std::printf("punch_hole / truncate at 70 MB/s: capper CPU %.2f x (%.2f%% vs %.2f%% of one core)\n",
                truncated_synthetic > 0 ? punched_synthetic / truncated_synthetic : 0.0, punched_synthetic,
                truncated_synthetic);

    // The same through reaperd itself: what a user runs, at the 10 MiB cap of the phases above
    // and at the acceptance's 2 MiB, where a cut must come within ~16 ms of the mark (9/16 of
    // the cap) to hold 1.1x at 70 MB/s.
    auto daemon_phase = [&](std::uint64_t cap, const std::string& max_size) {
        Reaperd daemon(engine.address(), max_size);
        Writer daemon_writer(client, "bench-reaperd");
        std::this_thread::sleep_for(500ms);
        auto cpu0 = process_cpu_ns(daemon.pid());
        auto d = sample(daemon_writer.log_path, seconds, cap);
        auto cpu = process_cpu_ns(daemon.pid()) - cpu0;
        double percent = 100.0 * double(cpu) / 1e9 / d.seconds;
        const auto bound = std::uint64_t(bound_ratio * double(cap));
        bool size_held = d.max_bytes <= bound;
        std::printf("reaperd:  logs.max_size %s, %.1f s sampled at %.0f Hz\n", max_size.c_str(), d.seconds,
                    double(d.samples) / d.seconds);
        std::printf("  max bytes on disk:   %.2f MiB = %.3f x cap (bound %.1f x: %s); samples over the cap: %llu\n",
                    mib(d.max_bytes), double(d.max_bytes) / double(cap), bound_ratio,
                    size_held ? "held" : "NOT HELD", (unsigned long long)d.over_cap);
        std::printf("  reaperd CPU (all threads): %.2f%% of one core (bound %.0f%%: %s)\n", percent,
                    cpu_bound_percent, percent <= cpu_bound_percent ? "held" : "NOT HELD");
        return size_held && percent <= cpu_bound_percent;
    };
    const bool daemon_held = daemon_phase(cap_bytes, "10MiB");
    const bool daemon_small_held = daemon_phase(small_cap_bytes, "2MiB");
    return punched.held && punched_synthetic <= cpu_bound_percent && daemon_held && daemon_small_held ? 0 : 1;
}
