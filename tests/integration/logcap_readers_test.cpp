// Issue 21's acceptance against the real engine (20.10, and 26.1 and 28.5 under
// REAPER_TEST_ENGINE=docker-trixie|docker-sid): a leased session's writer under a 2 MiB cap,
// cut by reaperd at least 3 times, and Docker's own readers of its log after those cuts,
// through the engine's own CLI. A truncate left Docker 23+'s follower waiting for good and
// its `--tail` spinning dockerd at ~1.2 cores; a punched cut must leave both working, keep the
// newest half of the cap readable and the bytes on disk within 1.1x the cap. Beside the
// engine's follower, `reaperctl logs -f` follows too, which a runaway's cuts do not end.
#include "daemon_fixture.hpp"
#include "engine.hpp"
#include "logcap/logcap_file.hpp"

#include <reaper/client.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
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

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using reaper::test::engine;
using reaper::test::unique_name;
using reaperd::itest::eventually;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::uint64_t MiB = 1024 * 1024;
constexpr std::uint64_t cap = 2 * MiB;

// Each writer waits 3 s before writing, so the follower is attached before the first cut.
// A runaway with numbered lines: seq is as fast as `yes` through the json-file logger (the
// logger, not the writer, is the bound: ~70 MB/s of json here on some days, 31-40 MB/s on
// others).
const std::string runaway = "sleep 3; exec seq 1 2000000000";
// A slow writer: 200 numbered lines every 10 ms (~20,000 lines/s, ~1.4 MB/s of json).
const std::string slow = "sleep 3; i=1; while :; do seq $i $((i+199)); i=$((i+200)); sleep 0.01; done";

// The engine's own CLI against the private engine, through sh; `tail` of its output.
std::string docker(const std::string& args) {
    return "env DOCKER_HOST=" + engine().address() + " " + reaper::test::test_engine().docker_cli() + " " + args;
}

struct Output {
    std::string text;
    std::chrono::milliseconds took{};
};
Output run(const std::string& command) {
    Output out;
    auto start = Clock::now();
    FILE* pipe = ::popen(command.c_str(), "r");
    BOOST_REQUIRE(pipe);
    char buffer[65536];
    std::size_t n;
    while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) out.text.append(buffer, n);
    ::pclose(pipe);
    out.took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    return out;
}

// Numbered lines as a reader printed them: how many, how many do not follow the one before
// (a line skipped or replayed), of those how many go back (a replay), and how many Podman's
// reader lost (`reader_lost`, not a break): n + 1 printed empty between n and n + 2, as
// Podman 4.3's compat API does to `docker logs -f` with no cut at all (once in 10 such
// followers of this test run without cuts, ~780,000 lines; 4 times in all, each a number
// ending in 43), or given only as the podman CLI's reader errors on the line's parts
// ("Getting new log line: '17243' is not a valid container log line", on its stderr, after
// the line printed empty or instead of it: its reader read the line while it was being
// written and split it; once in 7 and once in 9 runs of this test on 5.8 and 4.3). Those
// errors are counted in `reader_errors`, not as lines of the log. Breaks that skip exactly one
// line (n -> n + 2) are also counted in `one_line_skips`: through Podman's compat API the same
// reader drops such a line without a word to `docker logs`, and says so only in its service's
// log (ServiceReaderErrors).
// A last line without its '\n' is left out: a running reader's output ends where its stdio
// buffer was last written, often inside a line. The first few breaks are kept as "n -> m", to
// be told. `from_second_line`: the step from the first line to the second is not judged (a
// follower's --tail line, then its first followed one); when it is a break it is kept, as
// `handover`, to be told.
struct LineOrder {
    std::size_t lines = 0;
    std::size_t breaks = 0;
    std::size_t replays = 0;
    std::size_t reader_lost = 0;
    std::size_t reader_errors = 0;
    std::size_t one_line_skips = 0;
    std::string first_breaks;
    std::string handover;
};
LineOrder order_of(std::istream& in, bool from_second_line = false) {
    LineOrder order;
    std::uint64_t previous = 0;
    bool after_blank = false;
    bool after_reader_error = false;
    for (std::string line; std::getline(in, line) && !in.eof(); ++order.lines) {
        if (line.empty() && previous != 0 && !after_blank) {
            after_blank = true;
            continue;
        }
        if (line.find("Getting new log line") != std::string::npos) {
            ++order.reader_errors;
            after_reader_error = true;
            continue;
        }
        const std::uint64_t number = std::strtoull(line.c_str(), nullptr, 10);
        const bool handover = from_second_line && order.lines == 1;
        if ((after_blank || after_reader_error) && number == previous + 2) {
            ++order.reader_lost;
        } else if (previous != 0 && number != previous + 1) {
            // A line that is no number is told as it was printed (an error, a torn line).
            const bool numeric = !line.empty() && line[0] >= '0' && line[0] <= '9';
            const auto step = std::to_string(previous) + " -> " +
                              (numeric ? std::to_string(number) : "\"" + line.substr(0, 80) + "\"");
            if (handover) {
                order.handover = step;
            } else {
                if (number == previous + 2) ++order.one_line_skips;
                if (++order.breaks <= 3) order.first_breaks += (order.first_breaks.empty() ? "" : ", ") + step;
            }
        }
        if (!handover && previous != 0 && number <= previous) ++order.replays;
        previous = number;
        after_blank = false;
        after_reader_error = false;
    }
    return order;
}

// The "Getting new log line" errors Podman's service (podman-guard: <dir>/podman.log) logs
// from now on for its compat API's readers, which drop that line: `docker logs -f` on 5.4
// skipped one line (10016 -> 10018) with no cut near it (the first came ~20,000 lines later)
// and nothing printed, once in CI. Counted are those of a line read as it was being written
// ("'2026-12-07T15:10' is not a valid container log line"): an error whose text holds a NUL
// is a read into a punched hole, which excuses nothing.
class ServiceReaderErrors {
public:
    ServiceReaderErrors() : path_(engine().dir() + "/podman.log") {
        std::error_code ec;
        const auto size = fs::file_size(path_, ec);
        from_ = ec ? 0 : size;
    }
    std::size_t of_lines_being_written() const {
        std::ifstream in(path_);
        in.seekg(static_cast<std::streamoff>(from_));
        std::size_t errors = 0;
        for (std::string line; std::getline(in, line);)
            if (line.find("Getting new log line") != std::string::npos && line.find("\\x00") == std::string::npos)
                ++errors;
        return errors;
    }

private:
    std::string path_;
    std::uintmax_t from_ = 0;
};

// A follower (`logs -f --tail 1`, `cli` the command with those arguments) started by the
// test, its output in a file; stopped by its pid.
class Follower {
public:
    Follower(const std::string& cli, const std::string& path) : path_(path) {
        std::string command = "exec " + cli + " >" + path + " 2>&1";
        std::vector<char*> argv{const_cast<char*>("/bin/sh"), const_cast<char*>("-c"), command.data(), nullptr};
        BOOST_REQUIRE(::posix_spawn(&pid_, "/bin/sh", nullptr, nullptr, argv.data(), environ) == 0);
    }
    ~Follower() {
        ::kill(pid_, SIGTERM);
        ::waitpid(pid_, nullptr, 0);
        std::error_code ec;
        fs::remove(path_, ec);
    }
    bool running() const { return ::waitpid(pid_, nullptr, WNOHANG) == 0; }
    // The end of what it printed (an error from the daemon, when it ended).
    std::string last_text() const {
        std::ifstream in(path_, std::ios::binary);
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        return text.substr(text.size() - std::min<std::size_t>(text.size(), 300));
    }
    // The last complete line it printed, as a number (0: none). Only the output's end is read:
    // a follower of a runaway prints hundreds of MB.
    std::uint64_t last_number() const {
        std::ifstream in(path_, std::ios::binary | std::ios::ate);
        const std::streamoff size = in.tellg();
        if (size <= 0) return 0;
        const std::streamoff from = std::max<std::streamoff>(0, size - 4096);
        std::string text(static_cast<std::size_t>(size - from), '\0');
        in.seekg(from);
        in.read(text.data(), static_cast<std::streamsize>(text.size()));
        auto end = text.rfind('\n');
        if (end == std::string::npos) return 0;
        auto begin = text.rfind('\n', end - 1);
        begin = begin == std::string::npos ? 0 : begin + 1;
        try {
            return std::stoull(text.substr(begin, end - begin));
        } catch (const std::exception&) {
            return 0;
        }
    }

    LineOrder order(bool from_second_line = false) const {
        std::ifstream in(path_);
        return order_of(in, from_second_line);
    }

private:
    std::string path_;
    pid_t pid_ = -1;
};

// utime + stime of a process, in clock ticks.
std::uint64_t cpu_ticks(int pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    BOOST_REQUIRE_MESSAGE(stat.rfind(')') != std::string::npos, "cannot read /proc/" << pid << "/stat");
    std::istringstream fields(stat.substr(stat.rfind(')') + 2));
    std::string field;
    std::uint64_t utime = 0, stime = 0;
    for (int i = 3; fields >> field; ++i) {  // field 3 is the state
        if (i == 14) utime = std::stoull(field);
        if (i == 15) {
            stime = std::stoull(field);
            break;
        }
    }
    return utime + stime;
}

// The numbers carried by the log lines in `text`, from its first complete line: json-file's
// {"log":"N\n",...}, or Podman's k8s-file `<time> stdout F N`, whose conmon writes a line in
// parts (`P`, then the last `F`) when its read of the container's pipe ends inside the line:
// a busy conmon behind the slow writer does (seen on 5.8 beside three CPU-bound loops); the
// parts that end a first line written in parts are left out with it. Stops at the first line
// that is none of these (a hole's NULs, a torn line).
std::vector<std::uint64_t> numbers_in_log(const std::string& text, std::uint64_t& bytes) {
    std::vector<std::uint64_t> numbers;
    bytes = 0;
    const std::string json_key = "{\"log\":\"";
    const std::string k8s_key = " stdout F ";
    const std::string k8s_part_key = " stdout P ";
    std::string parts;
    const auto first_end = text.find('\n');
    bool first_line_parts =
        first_end != std::string::npos && text.substr(0, first_end).find(k8s_part_key) != std::string::npos;
    for (std::size_t at = first_end; at != std::string::npos && at + 1 < text.size();) {
        auto end = text.find('\n', at + 1);
        if (end == std::string::npos) break;
        std::string line = text.substr(at + 1, end - at - 1);
        if (line.rfind(json_key, 0) == 0) {
            numbers.push_back(std::strtoull(line.c_str() + json_key.size(), nullptr, 10));
        } else if (auto k8s = line.find(k8s_key); k8s != std::string::npos && line[0] != '\0') {
            parts += line.substr(k8s + k8s_key.size());
            if (!first_line_parts) numbers.push_back(std::strtoull(parts.c_str(), nullptr, 10));
            first_line_parts = false;
            parts.clear();
        } else if (auto part = line.find(k8s_part_key); part != std::string::npos && line[0] != '\0') {
            parts += line.substr(part + k8s_part_key.size());
        } else {
            break;
        }
        bytes += line.size() + 1;
        at = end;
    }
    return numbers;
}

bool consecutive(const std::vector<std::uint64_t>& numbers) {
    for (std::size_t i = 1; i < numbers.size(); ++i)
        if (numbers[i] != numbers[i - 1] + 1) return false;
    return !numbers.empty();
}

// A `logs --tail 200` answer (`ask` runs the reader once), as numbers. It is whole when it came
// within 1 s with 200 consecutive lines, the newest at least `newest_before`. Podman's own
// k8s-file reader is not whole now and then behind a live writer, cut or not: 4.3 answers
// "unable to read log file ... is not a valid container log line" (README, Rootless engines;
// once here a one-line answer beside two CPU-bound loops, once in CI 200 lines not
// consecutive, the newest older than the log's), and 5.8's `--tail 200` gave 400 lines, or
// 358 out of order, in 1-2 of 100 tries with no cut at all. So a Podman answer that is not
// whole is asked again, at most twice, and the first such answer is kept to be told.
struct TailAnswer {
    Output answer;
    std::vector<std::uint64_t> lines;
    bool whole = false;
    int podman_retries = 0;
    std::string first_answer;
};
template <typename Ask>
TailAnswer ask_tail_200(const Ask& ask, std::uint64_t newest_before, bool podman) {
    TailAnswer tail;
    for (;;) {
        tail.answer = ask();
        tail.lines.clear();
        std::istringstream text(tail.answer.text);
        for (std::string line; std::getline(text, line);) tail.lines.push_back(std::strtoull(line.c_str(), nullptr, 10));
        tail.whole = tail.answer.took < 1000ms && tail.lines.size() == 200u && consecutive(tail.lines) &&
                     tail.lines.back() >= newest_before;
        if (tail.whole || !podman || tail.podman_retries == 2) return tail;
        if (!tail.podman_retries++) tail.first_answer = tail.answer.text.substr(0, 200);
    }
}

// The newest log kept on disk, read as a user could: from the first data past the holes
// (SEEK_DATA). Read again when a cut came in the middle of the read. `told`, when given, says
// what the last read found: where its data began, how much was read and parsed, and the text
// that ended the parse.
std::uint64_t readable_newest_bytes(const std::string& path, std::vector<std::uint64_t>& numbers,
                                    std::string* told = nullptr) {
    std::uint64_t bytes = 0;
    for (int attempt = 0; attempt < 5; ++attempt) {
        int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        BOOST_REQUIRE(fd >= 0);
        off_t data = ::lseek(fd, 0, SEEK_DATA);
        std::string text;
        if (data >= 0 && ::lseek(fd, data, SEEK_SET) == data) {
            char buffer[65536];
            ssize_t n;
            while ((n = ::read(fd, buffer, sizeof buffer)) > 0) text.append(buffer, static_cast<std::size_t>(n));
        }
        ::close(fd);
        numbers = numbers_in_log(text, bytes);
        if (told) {
            const auto first_line_end = std::min(text.size(), text.find('\n') + 1);
            std::string after = text.substr(std::min(text.size(), first_line_end + bytes), 100);
            for (auto& c : after)
                if (c == '\0') c = '@';
            *told = "attempt " + std::to_string(attempt + 1) + ": data from byte " + std::to_string(data) + ", " +
                    std::to_string(text.size()) + " bytes read, " + std::to_string(bytes) +
                    " parsed after the first line, then [" + after + "] (a NUL shown as @)";
        }
        // Whole: every complete line after the first parsed (no hole punched into the read).
        if (consecutive(numbers) && bytes + 2 * 4096 >= text.size() - std::min(text.size(), text.find('\n')))
            return bytes;
    }
    return bytes;
}

// The number of the newest complete line in a json-file log (0: none yet).
std::uint64_t newest_number(const std::string& path) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    const std::streamoff size = in.tellg();
    if (size <= 0) return 0;
    const std::streamoff from = std::max<std::streamoff>(0, size - 64 * 1024);
    std::string text(static_cast<std::size_t>(size - from), '\0');
    in.seekg(from);
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    // The last complete line (the engine may be writing the next one), with its parts when
    // Podman's conmon wrote it in parts; the read's first line is whole only at the file's start.
    std::uint64_t bytes = 0;
    const auto numbers = numbers_in_log(from == 0 ? "\n" + text : text, bytes);
    return numbers.empty() ? 0 : numbers.back();
}

struct Cpu {
    std::uint64_t cut_ticks = 0;
    std::uint64_t uncut_ticks = 0;
};

// `driver`: "json-file" (the acceptance; Podman's conmon writes its k8s-file for it) or
// "local" (Docker's binary frames; measured and told, with the follower and --tail held to the
// same bar).
void check_readers(const std::string& writer, const std::string& what, bool lagging_follower_may_end,
                   const std::string& driver = "json-file") {
    const bool podman = engine().kind() == reaper::test::EngineKind::podman;
    reaperd::itest::Reaperd daemon("", "logs:\n  max_size: 2MiB\n");
    daemon.start();
    const std::string session = unique_name("readers");
    auto lease = daemon.control().lease(session);
    reaper::Client client{engine().client_options()};
    reaperd::itest::Cleanup cleanup;
    auto make = [&](const std::string& script, reaper::Labels extra) {
        reaper::ContainerSpec spec;
        spec.name = unique_name("readers");
        spec.image = reaper::test::PrivateEngine::image;
        spec.cmd = {"sh", "-c", script};
        spec.labels = std::move(extra);
        spec.labels["reaper.test"] = "logcap-readers";
        spec.labels["reaperd.session"] = session;
        if (!podman) spec.log_config.type = driver;
        auto id = client.create(spec);
        cleanup.ids.push_back(id);
        client.start(id);
        return id;
    };
    if (lagging_follower_may_end && driver == "json-file") {
        // How fast the engine's own follower reads behind this writer, on a log never cut
        // (exempt): what no cut can make up for (README, Log-size caps). Measured and told.
        const std::string free_writer = make(writer, {{"reaperd.log-max-size", "0"}});
        const std::string free_log = client.inspect(free_writer).log_path;
        Follower free_follower(docker("logs -f --tail 1 " + free_writer), daemon.dir + "/free-follower.out");
        BOOST_TEST_REQUIRE(eventually([&] { return free_follower.last_number() > 0; }, 30s));
        const auto read_from = free_follower.last_number();
        const auto written_from = newest_number(free_log);
        std::this_thread::sleep_for(1s);
        const auto read = free_follower.last_number() - read_from;
        const auto written = newest_number(free_log) - written_from;
        BOOST_TEST_MESSAGE(what << " on a log never cut: the engine's follower read " << read
                                << " lines in 1 s while the writer wrote " << written << " ("
                                << (written ? 100 * read / written : 0) << "%), then lagged by "
                                << newest_number(free_log) - free_follower.last_number() << " lines");
        client.remove(free_writer, {true, true});
    }

    // The same lines, about a cap's worth, in a log never cut (exempt): the reference for
    // dockerd's CPU during a --tail.
    const std::string uncut = make("seq 1 33000; exec sleep 600", {{"reaperd.log-max-size", "0"}});
    const std::string id = make(writer, {});
    const std::string log = driver == "local"
                                ? engine().data_root() + "/containers/" + id + "/local-logs/container.log"
                                : client.inspect(id).log_path;
    BOOST_TEST_REQUIRE(!log.empty());
    Follower follower(docker("logs -f --tail 1 " + id), daemon.dir + "/follower.out");
    // reaperctl's follower (issue 21, point 3), started beside the engine's: it reads the file
    // itself past the holes, so a runaway it falls behind costs it the lines cut meanwhile, not
    // the follow. It reads json-file and local logs (not Podman's k8s-file).
    std::optional<Follower> reaperctl_follower;
    if (podman)
        BOOST_TEST_MESSAGE(what << ": reaperctl logs -f not run (it reads json-file and local logs, not Podman's k8s-file)");
    else
        reaperctl_follower.emplace(std::string(REAPERCTL_PATH) + " logs --engine " + engine().address() +
                                       " -f --tail 1 " + id,
                                   daemon.dir + "/reaperctl-follower.out");

    auto cuts = [&] {
        auto actions = daemon.status()->getObject("counters")->getObject("actions");
        return actions->has("truncate") ? actions->getValue<std::uint64_t>("truncate") : 0;
    };
    const auto writing = Clock::now();
    BOOST_TEST_REQUIRE(eventually([&] { return cuts() >= 3u; }, 120s), daemon.log_text());
    const double seconds = std::chrono::duration<double>(Clock::now() - writing).count();
    BOOST_TEST_MESSAGE(what << " on " << engine().version() << ": " << cuts() << " cuts within " << seconds
                            << " s; apparent size " << fs::file_size(log) << " bytes");
    BOOST_TEST(daemon.log_count("CUT_METHOD=punch_hole") >= 1u, daemon.log_text());
    BOOST_TEST(daemon.log_count("CUT_METHOD=truncate") == 0u);

    // The follower started before the first cut still receives new lines. On Docker 23+ a
    // follower that lags more than the kept half behind the writer reads the hole and ends
    // (moby's json-file decoder does not resync across NULs): 26.1 says `invalid character
    // '\x00'`, 28.5 ends without a word (its forwarder logs the decode error at debug level
    // only). 20.10's decoder resyncs across up to ~10 MB of hole, and a follower that lagged
    // further (12 MB, the suite and a CPU-bound job beside it) ended the same way. Behind a
    // runaway under a 2 MiB cap, the engine's CLI lags by more than the 1 MiB kept within
    // ~30 ms (it reads a fifth to a third of the runaway's lines: measured above, on a log
    // never cut). That is allowed for the runaway only, when the follower's last line is
    // older than the oldest line still on disk (it lagged into the hole), and never a stall.
    const auto followed = follower.last_number();
    const bool advancing =
        eventually([&] { return follower.last_number() > followed && follower.last_number() > 0; }, 10s);
    std::vector<std::uint64_t> kept_now;
    if (driver == "json-file") readable_newest_bytes(log, kept_now);
    // One look at the follower, told and judged alike: 28.5's ends without a word, so one that
    // lagged into the hole can end between two looks (seen beside two CPU-bound loops).
    const bool follower_running = follower.running();
    const bool lagged_into_hole = !kept_now.empty() && follower.last_number() + 1 < kept_now.front();
    const bool ended_at_hole = !follower_running &&
                               (follower.last_text().find("invalid character '\\x00'") != std::string::npos ||
                                lagged_into_hole);
    BOOST_TEST_MESSAGE(what << ": follower " << (advancing && follower_running ? "goes on" : "ended") << " at line "
                            << follower.last_number() << (ended_at_hole ? ", at the hole (it lagged)" : "")
                            << (kept_now.empty() ? ""
                                                 : "; lines on disk " + std::to_string(kept_now.front()) + "-" +
                                                       std::to_string(kept_now.back())));
    if (!(lagging_follower_may_end && ended_at_hole)) {
        BOOST_TEST(advancing, what << ": the follower stalled at line " << followed);
        BOOST_TEST(follower_running, what << ": the follower ended: " << follower.last_text());
    }
    // reaperctl logs -f goes on behind every writer, each line once and in order; behind a
    // runaway it skips what was cut while it was behind (it polls every 100 ms, when the
    // runaway has written ~7 MB), behind the slow writer nothing. Asked again 2 s later, after
    // dozens more cuts of a runaway.
    if (reaperctl_follower) {
        bool goes_on = true;
        std::uint64_t from = 0;
        for (int round = 0; round < 2 && goes_on; ++round) {
            if (round > 0) std::this_thread::sleep_for(2s);
            from = reaperctl_follower->last_number();
            goes_on = eventually([&] { return reaperctl_follower->last_number() > from; }, 10s);
        }
        const bool running = reaperctl_follower->running();
        const auto order = reaperctl_follower->order();
        BOOST_TEST_MESSAGE(what << ": reaperctl logs -f " << (goes_on && running ? "goes on" : "stopped") << " at line "
                                << reaperctl_follower->last_number() << " after " << cuts() << " cuts, "
                                << order.lines << " lines, " << order.breaks - order.replays << " skips, "
                                << order.replays << " replays");
        BOOST_TEST(goes_on, what << ": reaperctl logs -f stalled at line " << from);
        BOOST_TEST(running, what << ": reaperctl logs -f ended: " << reaperctl_follower->last_text());
        BOOST_TEST(order.replays == 0u);
        if (!lagging_follower_may_end) BOOST_TEST(order.breaks == 0u);
        reaperctl_follower.reset();
    }

    // --tail 200 answers promptly with the 200 newest lines, consecutive.
    std::vector<std::uint64_t> on_disk;
    if (driver == "json-file") readable_newest_bytes(log, on_disk);
    const std::uint64_t newest_before = on_disk.empty() ? 0 : on_disk.back();
    const auto tail = ask_tail_200([&] { return run("timeout 6 " + docker("logs --tail 200 " + id) + " 2>&1"); },
                                   newest_before, podman);
    const auto& lines = tail.lines;
    BOOST_TEST_MESSAGE(what << ": --tail 200 took " << tail.answer.took.count() << " ms, " << lines.size() << " lines"
                            << (tail.podman_retries ? " (Podman's reader was not whole " +
                                                          std::to_string(tail.podman_retries) +
                                                          " time(s) first: " + tail.first_answer + ")"
                                                    : std::string()));
    BOOST_TEST(tail.answer.took < 1000ms);
    BOOST_TEST(lines.size() == 200u, tail.answer.text.substr(0, 300));
    BOOST_TEST(consecutive(lines));
    BOOST_TEST((!lines.empty() && lines.back() >= newest_before));

    // A plain read (no --tail), measured and told: Docker 23+'s decoder stops at the hole's
    // NULs (moby issue 53631), 20.10's resyncs past it. Not a requirement of the cut.
    auto plain = run("timeout 10 " + docker("logs " + id) + " 2>&1 | wc -l");
    BOOST_TEST_MESSAGE(what << ": plain docker logs printed " << std::strtoull(plain.text.c_str(), nullptr, 10)
                            << " lines in " << plain.took.count() << " ms");

    // Bytes on disk stay within 1.1x the cap; at least half the cap of the newest log is
    // readable (skipping the holes), whole lines in order.
    std::uint64_t max_allocated = 0;
    for (auto next = Clock::now(), end = next + 2s; next < end; next += 10ms) {
        max_allocated = std::max(max_allocated, reaperd::logcap::allocated_bytes(log));
        std::this_thread::sleep_until(next);
    }
    BOOST_TEST_MESSAGE(what << ": most bytes on disk over 2 s " << max_allocated << " (cap " << cap << ")");
    // The slow writer's log stays within issue 21's 1.1x of the cap whatever the load. A 70 MB/s
    // runaway's overshoot is how long the capper's thread waits for a core (~13 ms between the
    // mark and the cap): with the thread in the real-time class (SCHEDULING=realtime, as root
    // gets it) it held at 0.60-0.64x idle and beside two CPU-bound loops, so 1.1x holds it
    // too; at a nice level, 1.05x at a load average of ~5 on 2 cores and 1.98x at ~10 were
    // seen (README, Log-size caps), so there it is held to being capped (uncapped: ~140 MB in
    // these 2 s), the figure printed above.
    const bool realtime = daemon.log_count("SCHEDULING=realtime") > 0;
    BOOST_TEST_MESSAGE(what << ": the capper's thread " << (realtime ? "in" : "not in") << " the real-time class");
    BOOST_TEST(max_allocated <= (lagging_follower_may_end && !realtime ? 4 * cap : cap + cap / 10));
    if (driver == "json-file") {
        std::vector<std::uint64_t> kept;
        std::string read_told;
        const auto readable = readable_newest_bytes(log, kept, &read_told);
        BOOST_TEST_MESSAGE(what << ": newest readable past the holes " << readable << " bytes, " << kept.size()
                                << " lines");
        BOOST_TEST(readable >= cap / 2, read_told);
        BOOST_TEST(consecutive(kept));
    } else {
        // The local driver's frames are not read here: what --tail gives of the kept part. A
        // --tail reaching past the kept part into the hole gives nothing at all (seen with
        // 1,000,000), so ask for about the lines half the cap holds.
        auto all = run("timeout 10 " + docker("logs --tail 10000 " + id) + " 2>/dev/null");
        std::vector<std::uint64_t> kept;
        std::istringstream text(all.text);
        for (std::string line; std::getline(text, line);) kept.push_back(std::strtoull(line.c_str(), nullptr, 10));
        std::size_t run_from = kept.size();
        while (run_from > 1 && kept[run_from - 1] == kept[run_from - 2] + 1) --run_from;
        BOOST_TEST_MESSAGE(what << ": --tail 10000 gave " << kept.size() << " lines, the newest "
                                << kept.size() - std::min(kept.size(), run_from - 1) << " consecutive");
        BOOST_TEST(kept.size() >= 200u);
    }

    // dockerd's CPU during --tail: no more than for the same call on a log never cut. Five
    // calls of each, alternated, against the background of the writer's own logging.
    if (podman) {
        // Podman's service runs under podman-guard, which does not say its pid: its CPU during
        // --tail is not compared here.
        BOOST_TEST_MESSAGE(what << ": Podman: the service's CPU during --tail is not measured");
        lease->release();
        return;
    }
    const int dockerd = engine().daemon_pid();
    BOOST_TEST_REQUIRE(dockerd > 0);
    Cpu cpu;
    std::chrono::milliseconds cut_took{}, uncut_took{};
    for (int i = 0; i < 5; ++i) {
        for (bool on_cut : {true, false}) {
            auto before = cpu_ticks(dockerd);
            auto out = run("timeout 6 " + docker("logs --tail 200 " + (on_cut ? id : uncut)) + " >/dev/null 2>&1");
            auto ticks = cpu_ticks(dockerd) - before;
            (on_cut ? cpu.cut_ticks : cpu.uncut_ticks) += ticks;
            (on_cut ? cut_took : uncut_took) += out.took;
        }
    }
    BOOST_TEST_MESSAGE(what << ": dockerd ticks over 5 --tail calls: cut log " << cpu.cut_ticks << " in "
                            << cut_took.count() << " ms, log never cut " << cpu.uncut_ticks << " in "
                            << uncut_took.count() << " ms");
    // Within the noise of the writer's own logging (~1 tick per 10 ms of a busy core), the
    // call's duration being the same: a spinning reader burns ~120 ticks per second it lasts.
    // Under load the two sides' noise grew apart by 27 ticks (56 vs 29 at a load of 10), where
    // a --tail spinning past the end would burn ~700 over its 6 s timeout, each call.
    BOOST_TEST(cpu.cut_ticks <= 2 * cpu.uncut_ticks + 50);
    BOOST_TEST(cut_took < 5000ms);
    lease->release();
}

// Issue 21, point 4: what each reader does after each method of cut, side by side on this
// engine. No reaperd: the test cuts a slow writer's log itself with reaperd's own cut
// (LogFile::cut), by punching (what reaperd does) or by truncating (what it did before, and
// its fallback), each time the log holds 1.5 MiB on disk, keeping 1 MiB, 3 times; then each
// reader of the engine is asked what it gives. Under Podman the readers are the docker CLI on
// its Docker API and `podman logs` itself.

// The podman CLI on the test's Podman (PrivateEngine::podman_cli).
std::string podman_cli(const std::string& args) { return engine().podman_cli(args); }

struct Reader {
    std::string name;
    std::string (*cli)(const std::string& args);
};

std::vector<Reader> engine_readers() {
    std::vector<Reader> readers{{"docker logs", docker}};
    if (engine().kind() == reaper::test::EngineKind::podman) readers.push_back({"podman logs", podman_cli});
    return readers;
}

// What one reader gave after the cuts, and how it is told.
struct AfterCuts {
    bool follower_goes_on = false;
    bool follower_in_order = false;  // no line skipped or replayed
    bool tail_whole = false;  // 200 consecutive lines, the newest, within 1 s
    std::string told;
};

// Cuts the log at `path` by `method` each time it holds 1.5 MiB on disk, keeping 1 MiB, until
// it has been cut `cuts` times (each must cut the live file). Fails after 60 s.
void cut_repeatedly(const std::string& path, reaperd::logcap::CutMethod method, int cuts) {
    namespace lc = reaperd::logcap;
    const reaperd::LogFiles files{fs::path(path).parent_path().string(), fs::path(path).filename().string()};
    lc::LogFile file;
    bool identity_changed = false;
    BOOST_REQUIRE_EQUAL(file.open_if_closed(files, identity_changed), 0);
    const auto deadline = Clock::now() + 60s;
    for (int done = 0; done < cuts;) {
        BOOST_REQUIRE_MESSAGE(Clock::now() < deadline, "the log did not reach 1.5 MiB again after " << done << " cuts");
        file.measure_live();
        if (file.live_bytes() < 3 * MiB / 2) {
            std::this_thread::sleep_for(20ms);
            continue;
        }
        const auto outcome = file.cut(files, {method, MiB, false}, lc::system_cut_calls());
        BOOST_REQUIRE_MESSAGE(outcome.error == 0 && outcome.live_method == method,
                              "cut " << done + 1 << " by " << lc::to_string(method) << ": errno " << outcome.error);
        ++done;
    }
}

// A slow writer's container on `driver`, its log cut as above by `method`, and what each
// reader gives after: the follower started before the first cut, `logs --tail 200`, and a
// plain `logs`, with dockerd's CPU during the --tail.
std::vector<AfterCuts> readers_after(const std::string& driver, reaperd::logcap::CutMethod method,
                                     const std::string& out_dir) {
    const bool podman = engine().kind() == reaper::test::EngineKind::podman;
    reaper::Client client{engine().client_options()};
    reaper::ContainerSpec spec;
    spec.name = unique_name("methods");
    spec.image = reaper::test::PrivateEngine::image;
    spec.cmd = {"sh", "-c", slow};
    spec.labels["reaper.test"] = "logcap-methods";
    if (!podman) spec.log_config.type = driver;
    const std::string id = client.create(spec);
    const reaperd::itest::Cleanup remove{{id}};
    client.start(id);
    const std::string log = driver == "local"
                                ? engine().data_root() + "/containers/" + id + "/local-logs/container.log"
                                : client.inspect(id).log_path;
    BOOST_TEST_REQUIRE(!log.empty());

    const auto readers = engine_readers();
    std::optional<ServiceReaderErrors> service_errors;
    if (podman) service_errors.emplace();
    std::vector<std::unique_ptr<Follower>> followers;
    for (std::size_t i = 0; i < readers.size(); ++i)
        followers.push_back(std::make_unique<Follower>(readers[i].cli("logs -f --tail 1 " + id),
                                                       out_dir + "/follower" + std::to_string(i) + ".out"));
    for (const auto& follower : followers)
        BOOST_TEST_REQUIRE(eventually([&] { return follower->last_number() > 0; }, 30s), follower->last_text());
    BOOST_TEST_REQUIRE(fs::exists(log), log);
    cut_repeatedly(log, method, 3);

    std::vector<AfterCuts> seen(readers.size());
    for (std::size_t i = 0; i < readers.size(); ++i) {
        const auto& follower = *followers[i];
        const auto followed = follower.last_number();
        seen[i].follower_goes_on = eventually([&] { return follower.last_number() > followed; }, 5s) &&
                                   follower.running();
        // Podman hands `logs -f --tail 1` over from its tail line to the followed ones with
        // lines skipped now and then, cut or not: with no cut, `docker logs -f --tail 1` through
        // its compat API skipped 129-400 lines (most often one burst of the writer, 200) right
        // after its first line in 2 of 100 followers on 5.8 beside three CPU-bound loops, and on
        // 4.3, 5.4 and 5.8 in 9, 13 and 6 of 100 with three such runs beside them; never later
        // in a follower. It failed this test once in CI. `podman logs` runs the same libpod
        // reader. So a Podman follower's order is judged from its second line, and a break
        // before it is told.
        const auto order = follower.order(podman);
        // A line Podman's reader lost (order_of) is its reader's, reading the line at the
        // file's end as it was written, where no punched cut reaches: under Docker it is a break.
        // Through the compat API (the docker CLI on Podman) the reader's lost line is only
        // skipped: each one-line skip its service logged an error for is its reader's too.
        const auto silently_lost = podman && readers[i].cli == docker
                                       ? std::min(order.one_line_skips, service_errors->of_lines_being_written())
                                       : 0;
        const auto breaks =
            order.breaks - silently_lost + (podman ? 0 : order.reader_lost + order.reader_errors);
        seen[i].follower_in_order = breaks == 0;
        seen[i].told = "follower " + (seen[i].follower_goes_on ? std::string("goes on")
                                      : follower.running() ? "stalled at line " + std::to_string(follower.last_number())
                                                           : "ended at line " + std::to_string(follower.last_number()) +
                                                                 ": " + follower.last_text().substr(0, 120)) +
                       (breaks ? ", " + std::to_string(breaks) + " breaks in its order (lines skipped or replayed: " +
                                     order.first_breaks + ")"
                               : ", its lines in order") +
                       (order.handover.empty() ? ""
                                               : "; between its --tail line and the first followed one " +
                                                     order.handover + " (Podman's handover, not judged)") +
                       (podman && order.reader_lost
                            ? " (" + std::to_string(order.reader_lost) + " lost by its reader: printed empty or failed)"
                            : "") +
                       (podman && order.reader_errors
                            ? " (" + std::to_string(order.reader_errors) + " of its reader's 'Getting new log line' errors)"
                            : "") +
                       (silently_lost ? " (" + std::to_string(silently_lost) +
                                            " skipped by its reader: one line each, logged by Podman's service as "
                                            "'Getting new log line' errors)"
                                      : "");
    }
    for (std::size_t i = 0; i < readers.size(); ++i) {
        const std::uint64_t newest_before = driver == "local" ? 0 : newest_number(log);
        const int dockerd = podman ? -1 : engine().daemon_pid();
        const auto ticks_before = dockerd > 0 ? cpu_ticks(dockerd) : 0;
        const auto tail = ask_tail_200(
            [&] { return run("timeout 6 " + readers[i].cli("logs --tail 200 " + id) + " 2>&1"); }, newest_before, podman);
        const auto& lines = tail.lines;
        const auto ticks = dockerd > 0 ? cpu_ticks(dockerd) - ticks_before : 0;
        seen[i].tail_whole = tail.whole;
        const auto plain = run("timeout 6 " + readers[i].cli("logs " + id) + " 2>/dev/null");
        std::istringstream plain_text(plain.text);
        const auto plain_order = order_of(plain_text);
        seen[i].told += "; --tail 200: " +
                        (tail.podman_retries ? "(Podman's reader was not whole " +
                                                       std::to_string(tail.podman_retries) +
                                                       " time(s) first: " + tail.first_answer + ") "
                                                 : std::string()) +
                        (lines.size() == 200u ? "" : "[" + tail.answer.text.substr(0, 200) + "] ") +
                        std::to_string(lines.size()) + " lines" +
                        (lines.size() == 200u && consecutive(lines) ? ", consecutive" : "") + ", in " +
                        std::to_string(tail.answer.took.count()) + " ms" +
                        (dockerd > 0 ? ", dockerd " + std::to_string(ticks) + " ticks" : "") + "; plain: " +
                        std::to_string(plain_order.lines) + " lines (" + std::to_string(plain_order.breaks) +
                        " breaks in their order) in " + std::to_string(plain.took.count()) + " ms";
    }
    return seen;
}

// Each method, each reader, told as a row; held: after punched cuts every reader's follower
// goes on with its lines in order and its --tail gives the newest lines, and no reader's
// follower or --tail does better after truncating (what makes punching the least harmful here). A plain read is told
// only: after a truncate Docker 23+ reads what was written since, after a punch nothing
// (README, Log-size caps), and reaperctl logs reads what a punch kept.
void compare_methods(const std::string& driver) {
    using reaperd::logcap::CutMethod;
    const fs::path out_dir = fs::temp_directory_path() / unique_name("logcap-methods");
    fs::create_directories(out_dir);
    const auto punched = readers_after(driver, CutMethod::punch_hole, out_dir.string());
    const auto truncated = readers_after(driver, CutMethod::truncate, out_dir.string());
    fs::remove_all(out_dir);
    const auto readers = engine_readers();
    for (std::size_t i = 0; i < readers.size(); ++i) {
        const std::string row = engine().version() + ", " + (engine().kind() == reaper::test::EngineKind::podman
                                                                  ? std::string("k8s-file")
                                                                  : driver) +
                                ", " + readers[i].name;
        BOOST_TEST_MESSAGE(row << ", after punched cuts: " << punched[i].told);
        BOOST_TEST_MESSAGE(row << ", after truncated cuts: " << truncated[i].told);
        BOOST_TEST(punched[i].follower_goes_on, row << ": " << punched[i].told);
        BOOST_TEST(punched[i].follower_in_order, row << ": " << punched[i].told);
        BOOST_TEST(punched[i].tail_whole, row << ": " << punched[i].told);
        BOOST_TEST((punched[i].follower_goes_on || !truncated[i].follower_goes_on), row);
        BOOST_TEST((punched[i].tail_whole || !truncated[i].tail_whole), row);
    }
}

// The runaway and the local driver are Docker's: under REAPER_TEST_ENGINE=podman those cases
// say so and do not run (Podman: the slow writer's case, in tests/build's podman selection).
boost::test_tools::assertion_result docker_engine(boost::unit_test::test_unit_id) {
    boost::test_tools::assertion_result docker(engine().kind() == reaper::test::EngineKind::docker);
    docker.message() << "a Docker case (runaway, local driver): not run under REAPER_TEST_ENGINE="
                     << reaper::test::test_engine().name;
    return docker;
}

}  // namespace

// How the readers' output is judged (order_of), on outputs of the kinds the engines printed.
BOOST_AUTO_TEST_CASE(line_order_counts_breaks_replays_and_blanks_and_tells_the_handover) {
    struct Row {
        const char* what;
        const char* output;
        bool from_second_line;
        std::size_t lines, breaks, replays, reader_lost, reader_errors, one_line_skips;
        const char* first_breaks;
        const char* handover;
    };
    const Row rows[] = {
        {"in order, a torn last line left out", "1\n2\n3\n4", false, 3, 0, 0, 0, 0, 0, "", ""},
        {"a skip and a replay", "1\n2\n5\n6\n4\n5\n", false, 6, 2, 1, 0, 0, 0, "2 -> 5, 6 -> 4", ""},
        {"one line printed empty", "7\n\n9\n10\n", false, 4, 0, 0, 1, 0, 0, "", ""},
        {"only the first three breaks told", "1\n3\n5\n7\n9\n", false, 5, 4, 0, 0, 0, 4, "1 -> 3, 3 -> 5, 5 -> 7", ""},
        {"the handover told, not judged", "100\n301\n302\n", true, 3, 0, 0, 0, 0, 0, "", "100 -> 301"},
        {"a replay at the handover", "100\n90\n91\n", true, 3, 0, 0, 0, 0, 0, "", "100 -> 90"},
        {"a break after the handover judged", "100\n301\n303\n", true, 3, 1, 0, 0, 0, 1, "301 -> 303", "100 -> 301"},
        {"an unbroken handover", "100\n101\n102\n", true, 3, 0, 0, 0, 0, 0, "", ""},
        {"the same break judged from the first line", "100\n301\n302\n", false, 3, 1, 0, 0, 0, 0, "100 -> 301", ""},
        {"a line that is no number told as printed", "5\nError: gone\n", false, 2, 1, 1, 0, 0, 0, "5 -> \"Error: gone\"", ""},
        {"podman logs: empty, then its reader's error on the line's text",
         "17241\n17242\n\ntime=\"...\" level=error msg=\"Getting new log line: '17243' is not a valid container log line\"\n"
         "17244\n",
         false, 5, 0, 0, 1, 1, 0, "", ""},
        {"podman logs: its reader's errors on the line's two parts, no line printed for it",
         "18884\n18885\nlevel=error msg=\"Getting new log line: '2026-12-06T1'\"\n"
         "level=error msg=\"Getting new log line: '18886' is not a valid container log line\"\n18887\n",
         false, 5, 0, 0, 1, 2, 0, "", ""},
        {"one line skipped without a word (Podman's compat API)", "10015\n10016\n10018\n10019\n", false, 4, 1, 0, 0, 0, 1,
         "10016 -> 10018", ""},
        {"a reader error with more lost is a break", "1\nlevel=error msg=\"Getting new log line: 'x'\"\n4\n", false,
         3, 1, 0, 0, 1, 0, "1 -> 4", ""},
    };
    for (const auto& row : rows) {
        std::istringstream in(row.output);
        const auto order = order_of(in, row.from_second_line);
        BOOST_TEST_CONTEXT(row.what) {
            BOOST_TEST(order.lines == row.lines);
            BOOST_TEST(order.breaks == row.breaks);
            BOOST_TEST(order.replays == row.replays);
            BOOST_TEST(order.reader_lost == row.reader_lost);
            BOOST_TEST(order.reader_errors == row.reader_errors);
            BOOST_TEST(order.one_line_skips == row.one_line_skips);
            BOOST_TEST(order.first_breaks == row.first_breaks);
            BOOST_TEST(order.handover == row.handover);
        }
    }
}

BOOST_AUTO_TEST_CASE(a_runaway_under_a_2mib_cap_keeps_its_follower_tail_and_newest_half, *boost::unit_test::precondition(docker_engine)) {
    check_readers(runaway, "runaway", true);
}

BOOST_AUTO_TEST_CASE(a_slow_line_writer_under_a_2mib_cap_keeps_its_follower_tail_and_newest_half) {
    check_readers(slow, "slow writer", false);
}

// Issue 21, point 4: the local driver (binary frames) after punched cuts, measured.
BOOST_AUTO_TEST_CASE(a_slow_line_writer_with_the_local_driver_keeps_its_follower_and_tail, *boost::unit_test::precondition(docker_engine)) {
    check_readers(slow, "slow writer, local driver", false, "local");
}

// Issue 21, point 4: each method against each reader, json-file (Podman: its k8s-file, and
// `podman logs` beside the docker CLI).
BOOST_AUTO_TEST_CASE(each_cut_method_side_by_side_for_every_reader) {
    compare_methods("json-file");
}

BOOST_AUTO_TEST_CASE(each_cut_method_side_by_side_for_every_reader_of_the_local_driver, *boost::unit_test::precondition(docker_engine)) {
    compare_methods("local");
}
