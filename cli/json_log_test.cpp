#include "json_log.hpp"
#include "test_log_file.hpp"

#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

using namespace reaperctl;
using reaperctl::test::numbers;
using reaperctl::test::range;

namespace {

std::string entry(int i, const char* stream = "stdout") {
    return R"({"log":"line )" + std::to_string(i) + R"(\n","stream":")" + stream +
           R"(","time":"2026-12-02T10:00:00.000000001Z"})" + "\n";
}

// A json-file log: lines 0..count-1, stderr every 7th.
struct LogFile : test::TestLogFile {
    explicit LogFile(int count = 0) : TestLogFile("c-json.log") {
        for (int i = 0; i < count; ++i) append(entry(i, i % 7 == 0 ? "stderr" : "stdout"));
    }
};

std::vector<LogEntry> read_all(int fd, std::uint64_t offset = 0, std::uint64_t* next = nullptr) {
    std::vector<LogEntry> entries;
    const auto end = read_entries(fd, offset, [&](const LogEntry& e) { entries.push_back(e); });
    if (next) *next = end;
    return entries;
}

}  // namespace

BOOST_AUTO_TEST_CASE(lines_decode_as_the_engine_wrote_them_and_nothing_else_does) {
    struct Row {
        std::string line;
        std::optional<std::string> text;
        bool from_stderr = false;
    };
    const std::vector<Row> rows{
        {R"({"log":"hi\n","stream":"stdout","time":"2026-12-02T10:00:00Z"})", "hi\n"},
        {R"({"log":"oops\n","stream":"stderr","time":"2026-12-02T10:00:00Z"})", "oops\n", true},
        {R"({"log":"no newline: a partial entry","stream":"stdout","time":"t"})", "no newline: a partial entry"},
        {R"({"log":"\u00e9\t\"q\"\n","stream":"stdout","time":"t"})", "\xC3\xA9\t\"q\"\n"},
        {R"({"stream":"stdout","time":"t"})", std::nullopt},
        {R"({"log":7,"stream":"stdout","time":"t"})", std::nullopt},
        {R"({"log":"x","stream":"stdin","time":"t"})", std::nullopt},
        {R"("stream":"stdout","time":"2026-12-02T10:00:00Z"})", std::nullopt},  // torn by a punch
        {R"({"log":"torn","stre)", std::nullopt},                               // torn by a writer
        {std::string(100, '\0'), std::nullopt},                                  // a hole's NULs
        {"", std::nullopt},
        {"[1]", std::nullopt},
    };
    for (const auto& row : rows) {
        BOOST_TEST_CONTEXT(row.line) {
            const auto decoded = decode_json_log_line(row.line);
            BOOST_TEST(decoded.has_value() == row.text.has_value());
            if (decoded && row.text) {
                BOOST_TEST(decoded->text == *row.text);
                BOOST_TEST(decoded->from_stderr == row.from_stderr);
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(a_whole_file_reads_in_order_with_its_streams) {
    LogFile log(100);
    std::uint64_t next = 0;
    const auto entries = read_all(log.fd, 0, &next);
    BOOST_TEST(numbers(entries) == range(0, 100), boost::test_tools::per_element());
    BOOST_TEST(entries[0].from_stderr);
    BOOST_TEST(!entries[1].from_stderr);
    BOOST_TEST(next == log.size());
    BOOST_TEST(read_all(log.fd, next).empty());
}

// Table: where the oldest part is punched out, what a full read and tails find.
BOOST_AUTO_TEST_CASE(punched_files_read_from_the_first_whole_line_after_the_hole) {
    struct Row {
        const char* what;
        int lines;
        std::uint64_t punch;  // bytes at the start, rounded down to blocks
    };
    const std::vector<Row> rows{
        {"no hole", 3000, 0},
        {"one block", 3000, 4096},
        {"most of the file", 3000, 150'000},
        {"a hole over more than one read block", 5000, 200'000},
    };
    for (const auto& row : rows) {
        BOOST_TEST_CONTEXT(row.what) {
            LogFile log(row.lines);
            const auto size = log.size();
            const auto punched = log.punch_start(row.punch);
            BOOST_TEST(log.size() == size);  // KEEP_SIZE: every offset stays valid
            // The first line kept is the first one that starts at or after the hole's end.
            int first = 0;
            std::uint64_t at = 0;
            while (at < punched) at += entry(first++).size();

            const auto all = read_all(log.fd);
            BOOST_TEST(numbers(all) == range(first, row.lines), boost::test_tools::per_element());

            std::uint64_t follow_from = 0;
            const auto last5 = tail_entries(log.fd, 5, &follow_from);
            BOOST_TEST(numbers(last5) == range(row.lines - 5, row.lines), boost::test_tools::per_element());
            BOOST_TEST(follow_from == size);
            // Asking for more than was kept gives what was kept.
            const auto many = tail_entries(log.fd, 100'000);
            BOOST_TEST(numbers(many) == range(first, row.lines), boost::test_tools::per_element());
        }
    }
}

BOOST_AUTO_TEST_CASE(an_unfinished_last_line_waits_for_its_newline) {
    LogFile log(10);
    const auto whole = log.size();
    const auto eleventh = entry(10);
    log.append(eleventh.substr(0, 20));
    std::uint64_t next = 0;
    BOOST_TEST(numbers(read_all(log.fd, 0, &next)) == range(0, 10), boost::test_tools::per_element());
    BOOST_TEST(next == whole);
    std::uint64_t follow_from = 0;
    BOOST_TEST(numbers(tail_entries(log.fd, 3, &follow_from)) == range(7, 10), boost::test_tools::per_element());
    BOOST_TEST(follow_from == whole);

    log.append(eleventh.substr(20));
    std::uint64_t after = 0;
    BOOST_TEST(numbers(read_all(log.fd, next, &after)) == std::vector<int>{10}, boost::test_tools::per_element());
    BOOST_TEST(after == log.size());
}

BOOST_AUTO_TEST_CASE(tail_zero_and_empty_files_say_where_to_follow_from) {
    LogFile log(50);
    std::uint64_t follow_from = 0;
    BOOST_TEST(tail_entries(log.fd, 0, &follow_from).empty());
    BOOST_TEST(follow_from == log.size());

    LogFile empty;
    BOOST_TEST(tail_entries(empty.fd, 5, &follow_from).empty());
    BOOST_TEST(follow_from == 0u);
    BOOST_TEST(read_all(empty.fd).empty());
}

// A log that is all hole but for its newest lines: the sizes stay, nothing before is read.
BOOST_AUTO_TEST_CASE(a_file_that_is_mostly_hole_reads_only_its_data) {
    LogFile log;
    const std::uint64_t hole = std::uint64_t{1} << 32;  // 4 GiB of apparent size, no blocks
    BOOST_REQUIRE(::ftruncate(log.fd, static_cast<off_t>(hole)) == 0);
    log.append("\n");  // the end of a line whose start was punched out
    for (int i = 0; i < 3; ++i) log.append(entry(i));
    BOOST_TEST(numbers(read_all(log.fd)) == range(0, 3), boost::test_tools::per_element());
    BOOST_TEST(numbers(tail_entries(log.fd, 10)) == range(0, 3), boost::test_tools::per_element());
    const auto regions = data_regions(log.fd, 0, log.size());
    BOOST_REQUIRE(regions.size() == 1u);
    BOOST_TEST(regions[0].begin >= hole - 4096);
}

// A follower reads what is appended, the last lines of a file the engine rotated away and then
// the new file, a file cut shorter from its start again, and ends when the directory goes.
BOOST_AUTO_TEST_CASE(a_follower_follows_appends_rotations_and_cuts) {
    LogFile log(3);
    std::vector<LogEntry> seen;
    const auto sink = [&](const LogEntry& e) { seen.push_back(e); };
    std::uint64_t from = 0;
    BOOST_TEST(numbers(tail_entries(log.fd, 1, &from)) == std::vector<int>{2}, boost::test_tools::per_element());
    LogFollower follower(log.path, ::open(log.path.c_str(), O_RDONLY | O_CLOEXEC), from, json_file_format);
    BOOST_TEST(follower.poll(sink));
    BOOST_TEST(seen.empty());
    log.append(entry(3));
    log.append(entry(4).substr(0, 10));
    BOOST_TEST(follower.poll(sink));
    BOOST_TEST(numbers(seen) == std::vector<int>{3}, boost::test_tools::per_element());

    // Rotation: the live file becomes .1 (its unfinished line completed first), a new one starts.
    log.append(entry(4).substr(10));
    BOOST_REQUIRE(::rename(log.path.c_str(), (log.path + ".1").c_str()) == 0);
    ::close(log.fd);
    log.fd = ::open(log.path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    log.append(entry(5));
    BOOST_TEST(follower.poll(sink));
    BOOST_TEST(numbers(seen) == range(3, 6), boost::test_tools::per_element());

    // A cut from outside (truncate to 0), then new lines: read from the start. (A new line of
    // exactly the old length would end on a '\n' at the old offset: not told apart.)
    BOOST_REQUIRE(::ftruncate(log.fd, 0) == 0);
    log.append(entry(16));
    BOOST_TEST(follower.poll(sink));
    BOOST_TEST(numbers(seen) == (std::vector<int>{3, 4, 5, 16}), boost::test_tools::per_element());

    // A punched start changes nothing for a follower past it.
    log.append(std::string(8192, ' ') + "\n");
    log.punch_start(4096);
    log.append(entry(17));
    BOOST_TEST(follower.poll(sink));
    BOOST_TEST(numbers(seen) == (std::vector<int>{3, 4, 5, 16, 17}), boost::test_tools::per_element());

    std::filesystem::remove_all(log.dir);
    BOOST_TEST(!follower.poll(sink));
}
