// `reaperctl logs` against the real engine (issue 21, point 3): a container writes numbered
// lines (every 100th to stderr), the test punches the oldest part of its json-file or local
// log out itself, block aligned, as reaperd's capper does (fallocate PUNCH_HOLE | KEEP_SIZE), and then
// `reaperctl logs --tail 5` prints the 5 newest lines, plain `reaperctl logs` everything after
// the hole (stdout and stderr apart), and `reaperctl logs -f` the lines written after it
// started. Docker 23+'s plain `docker logs` shows nothing after such a hole (any Docker's, of
// a local log); it is printed for the record. Run on each engine: default (20.10), REAPER_TEST_ENGINE=docker-trixie (26.1) and
// docker-sid (28.5).
#include "daemon_fixture.hpp"
#include "engine.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>

#include <linux/falloc.h>
#include <sys/stat.h>

using namespace reaperd::itest;

namespace {

// Lines "line N", 3000 at once, then one every 100 ms; on_stderr(N) go to stderr. Some of the
// slow phase's go to stderr too: the engine copies the two streams apart, and the burst's
// stderr lines can all land in the file's first 100 KB, before stdout's.
const char* const writer =
    "i=0; while [ $i -lt 3000 ]; do if [ $((i % 100)) -eq 0 ]; then echo line $i >&2; else echo line $i; fi; "
    "i=$((i+1)); done; while true; do if [ $((i % 10)) -eq 0 ]; then echo line $i >&2; else echo line $i; fi; "
    "i=$((i+1)); sleep 0.1; done";

bool on_stderr(int n) { return n < 3000 ? n % 100 == 0 : n % 10 == 0; }

// The line after `n` on the same stream.
int next_on_stream(int n) {
    const bool err = on_stderr(n);
    do ++n;
    while (on_stderr(n) != err);
    return n;
}

std::vector<int> numbers(const std::string& text) {
    std::vector<int> out;
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
        int n = -1;
        BOOST_TEST(std::sscanf(line.c_str(), "line %d", &n) == 1, line);
        out.push_back(n);
    }
    return out;
}

std::vector<std::string> logs_argv(const std::string& id, std::vector<std::string> options) {
    std::vector<std::string> argv{REAPERCTL_PATH, "logs", "--engine", reaper::test::engine().address()};
    argv.insert(argv.end(), options.begin(), options.end());
    argv.push_back(id);
    return argv;
}

// A driver's file, and how much of it the burst writes and the test punches: json-file's
// lines are ~70 bytes, local's frames ~37.
struct Driver {
    const char* name;
    std::uint64_t written;  // bytes, reached within the burst of 3000 lines
    std::uint64_t punched;  // bytes at the start, rounded down to blocks
    std::string path(const std::string& id) const {
        return std::string(name) == "local"
                   ? reaper::test::engine().data_root() + "/containers/" + id + "/local-logs/container.log"
                   : engine_client().inspect(id).log_path;
    }
};
const Driver json_file{"json-file", 200'000, 100'000};
const Driver local{"local", 100'000, 50'000};

void logs_read_what_a_punched_cut_kept(const Driver& driver) {
    char pattern[] = "/tmp/reaperctl-logs.XXXXXX";
    const std::string dir = ::mkdtemp(pattern);
    reaper::ContainerSpec spec;
    spec.name = reaper::test::unique_name("logs-writer");
    spec.image = reaper::test::PrivateEngine::image;
    spec.cmd = {"sh", "-c", writer};
    spec.network_mode = "none";
    spec.log_config.type = driver.name;
    const auto id = engine_client().create(spec);
    engine_client().start(id);
    const auto path = driver.path(id);
    BOOST_TEST_REQUIRE(eventually([&] {
        std::error_code ec;
        return fs::file_size(path, ec) > driver.written;
    }), path);
    // Into the slow phase for ~15 lines, so that the newest entries are all of it: the engine
    // copies stderr apart, and its entries of the burst can land after stdout's last ones.
    std::this_thread::sleep_for(1500ms);

    // The cut, as reaperd's capper makes it: the oldest ~100 KB, rounded down to whole blocks.
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    BOOST_TEST_REQUIRE(fd >= 0);
    struct stat st {};
    ::fstat(fd, &st);
    const auto punched = driver.punched / st.st_blksize * st.st_blksize;
    const int rc = ::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, punched);
    const int error = errno;
    ::close(fd);
    BOOST_TEST_REQUIRE(rc == 0, "fallocate PUNCH_HOLE on the engine's log: " << std::strerror(error));
    BOOST_TEST_MESSAGE(driver.name << ": plain docker logs after the punch (Docker 23+ stops at the hole), lines: "
                       << shell_output("timeout 10 " + reaper::test::test_engine().docker_cli() + " --host " +
                                       reaper::test::engine().address() + " logs " + id + " 2>&1 | wc -l"));

    Child tail(dir, logs_argv(id, {"--tail", "5"}));
    BOOST_TEST(tail.wait(30s) == 0, tail.stderr_text());
    // The 5 newest entries of both streams, each printed to its own.
    auto newest = numbers(tail.stdout_text());
    for (int n : numbers(tail.stderr_text())) {
        BOOST_TEST(on_stderr(n));
        newest.push_back(n);
    }
    std::sort(newest.begin(), newest.end());
    BOOST_REQUIRE_MESSAGE(newest.size() == 5u, "reaperctl logs --tail 5 printed:\n" << tail.stdout_text() << tail.stderr_text());
    BOOST_TEST(newest.front() >= 3005);
    for (std::size_t i = 1; i < newest.size(); ++i) BOOST_TEST(newest[i] == newest[i - 1] + 1);

    Child all(dir, logs_argv(id, {}));
    BOOST_TEST(all.wait(30s) == 0, all.stderr_text());
    const auto out = numbers(all.stdout_text());
    const auto err = numbers(all.stderr_text());
    BOOST_REQUIRE(!out.empty());
    BOOST_REQUIRE(!err.empty());
    // Everything after the hole: from the first whole line past it (well past line 1000), each
    // line once, stdout and stderr apart. The engine
    // copies the two streams apart, so where a stream's lines sit in the file relative to the
    // other's is its own: each stream is checked on its own.
    // Lines emitted after the file passed 200 KB (the slow phase's, 1.5 s of them) are all past
    // the hole, on both streams.
    BOOST_TEST(out.front() > 1000);
    BOOST_TEST(out.back() >= 2999);
    for (std::size_t i = 1; i < out.size(); ++i) BOOST_TEST(out[i] == next_on_stream(out[i - 1]));
    BOOST_TEST(err.back() >= 3000);
    for (std::size_t i = 1; i < err.size(); ++i) BOOST_TEST(err[i] == next_on_stream(err[i - 1]));
    BOOST_TEST_MESSAGE(driver.name << ": reaperctl logs: stdout lines " << out.front() << " to " << out.back() << ", stderr lines "
                                                       << err.front() << " to " << err.back() << " after a hole of "
                                                       << punched << " bytes");

    Child follower(dir, logs_argv(id, {"-f", "--tail", "1"}));
    std::this_thread::sleep_for(2s);  // the writer adds ~20 lines meanwhile
    BOOST_TEST(follower.running(), follower.stderr_text());
    engine_client().remove(id, {true, true});  // the follower ends with its container
    BOOST_TEST(follower.wait(30s) == 0, follower.stderr_text());
    const auto followed = numbers(follower.stdout_text());
    BOOST_TEST(followed.size() >= 5u);
    BOOST_TEST(followed.back() > out.back());
    for (std::size_t i = 1; i < followed.size(); ++i) BOOST_TEST(followed[i] == next_on_stream(followed[i - 1]));

    std::error_code ec;
    fs::remove_all(dir, ec);
}

}  // namespace

BOOST_AUTO_TEST_CASE(logs_reads_what_a_punched_cut_kept_the_newest_lines_and_follows) {
    logs_read_what_a_punched_cut_kept(json_file);
}

// The local driver's frames after a punch: every Docker's plain read shows nothing of them.
BOOST_AUTO_TEST_CASE(logs_reads_what_a_punched_cut_kept_of_a_local_log) {
    logs_read_what_a_punched_cut_kept(local);
}

// A `--tail` that asks for more lines than a cut kept. Docker's reader (pkg/tailfile) looks for
// line ends backwards from the end, 1 KiB at a time, through the whole hole, then prints
// nothing of the log: measured and told here with a 1 GiB hole (README, Log-size caps: about
// 3 s of a core per GiB on every Docker). reaperctl reads only the file's data: every line
// kept, whatever the hole, here one of 1 TiB (which a reader of the hole would take minutes on).
BOOST_AUTO_TEST_CASE(logs_tail_past_what_a_cut_kept_prints_all_of_it_without_reading_the_hole) {
    char pattern[] = "/tmp/reaperctl-logs.XXXXXX";
    const std::string dir = ::mkdtemp(pattern);
    reaper::ContainerSpec spec;
    spec.name = reaper::test::unique_name("logs-kept");
    spec.image = reaper::test::PrivateEngine::image;
    spec.cmd = {"sh", "-c", "i=1; while [ $i -le 2000 ]; do echo line $i; i=$((i+1)); done"};
    spec.network_mode = "none";
    const auto id = engine_client().create(spec);
    engine_client().start(id);
    BOOST_TEST_REQUIRE(engine_client().wait(id, 30s) == 0);
    const auto path = engine_client().inspect(id).log_path;
    std::ifstream in(path, std::ios::binary);
    const std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    BOOST_TEST_REQUIRE(std::count(kept.begin(), kept.end(), '\n') == 2000);
    // The stopped container's log as a punched cut leaves it: a hole, then what was kept.
    // A file system whose files cannot be that large (EFBIG: ext4 with 1 KiB blocks holds
    // 16 GiB) gets the largest power of two it takes.
    auto lay_out = [&](std::uint64_t hole_bytes) {
        const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
        BOOST_TEST_REQUIRE(fd >= 0);
        ssize_t wrote = -1;
        for (; hole_bytes >= (std::uint64_t{1} << 30); hole_bytes /= 2) {
            wrote = ::pwrite(fd, kept.data(), kept.size(), static_cast<off_t>(hole_bytes));
            if (wrote >= 0 || errno != EFBIG) break;
        }
        const int error = errno;
        ::close(fd);
        BOOST_TEST_REQUIRE(wrote == static_cast<ssize_t>(kept.size()), "writing the log: " << std::strerror(error));
        return hole_bytes;
    };

    lay_out(std::uint64_t{1} << 30);
    const auto asked = std::chrono::steady_clock::now();
    const auto docker_lines = shell_output("timeout 60 " + reaper::test::test_engine().docker_cli() + " --host " +
                                           reaper::test::engine().address() + " logs --tail 5000 " + id +
                                           " 2>/dev/null | wc -l");
    BOOST_TEST_MESSAGE("docker logs --tail 5000 past the 2,000 lines kept after a 1 GiB hole: "
                       << std::strtoul(docker_lines.c_str(), nullptr, 10) << " lines in "
                       << std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - asked)
                              .count()
                       << " ms");

    const auto hole_bytes = lay_out(std::uint64_t{1} << 40);
    BOOST_TEST_MESSAGE("reaperctl logs --tail 5000 after a hole of " << (hole_bytes >> 30) << " GiB");
    Child tail(dir, logs_argv(id, {"--tail", "5000"}));
    BOOST_TEST(tail.wait(30s) == 0, tail.stderr_text());
    const auto lines = numbers(tail.stdout_text());
    BOOST_TEST(lines.size() == 2000u);
    for (std::size_t i = 0; i < lines.size(); ++i) BOOST_TEST(lines[i] == static_cast<int>(i) + 1);
    engine_client().remove(id, {true, true});
    std::error_code ec;
    fs::remove_all(dir, ec);
}

BOOST_AUTO_TEST_CASE(logs_refuses_what_it_cannot_read) {
    char pattern[] = "/tmp/reaperctl-logs.XXXXXX";
    const std::string dir = ::mkdtemp(pattern);
    Child missing(dir, logs_argv("no-such-container-" + reaper::test::unique_name("x"), {}));
    BOOST_TEST(missing.wait(30s) == 1);
    BOOST_TEST(missing.stderr_text().find("no such container") != std::string::npos, missing.stderr_text());

    // Containers it cannot read, never started: one whose driver writes no file, and a
    // json-file one, whose file the engine names at its first start.
    struct Unreadable {
        const char* driver;
        const char* says;
    };
    for (const auto& row :
         {Unreadable{"none", "json-file and local logs only"}, Unreadable{"json-file", "has no log file yet"}}) {
        reaper::ContainerSpec spec;
        spec.name = reaper::test::unique_name("logs-unreadable");
        spec.image = reaper::test::PrivateEngine::image;
        spec.cmd = {"true"};
        spec.network_mode = "none";
        spec.log_config.type = row.driver;
        const auto id = engine_client().create(spec);
        Child refused(dir, logs_argv(id, {}));
        BOOST_TEST(refused.wait(30s) == 1, row.driver);
        BOOST_TEST(refused.stderr_text().find(row.says) != std::string::npos, refused.stderr_text());
        engine_client().remove(id, {true, true});
    }

    Child usage(dir, {REAPERCTL_PATH, "logs", "--tail", "x", "some-container"});
    BOOST_TEST(usage.wait(30s) == 64);
    std::error_code ec;
    fs::remove_all(dir, ec);
}
