// What the json-file and the local reader of `reaperctl logs` promise alike, each case run on
// both formats: a whole file in order, a punched file from the first whole entry past the
// hole, an entry still being written left for later, tails that say where to follow from, and
// a file that is almost all hole read by its data alone, and a follower. Each format's own
// cases (decoding, telling a cut) are in json_log_test and local_log_test.
#include "json_log.hpp"
#include "local_log.hpp"
#include "test_log_file.hpp"

#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

using namespace reaperctl;
using namespace reaperctl::test;

namespace {

struct Format {
    const char* name;
    const char* file_name;
    std::string (*entry)(int i, bool to_stderr);
    const LogFormat& reader;
};
const std::vector<Format> formats{
    {"json-file", "c-json.log", json_entry, json_file_format},
    {"local", "container.log", local_entry, local_format},
};

// A log of `format`: lines 0..count-1, stderr every 7th.
struct LogFile : TestLogFile {
    LogFile(const Format& format, int count) : TestLogFile(format.file_name) {
        for (int i = 0; i < count; ++i) append(format.entry(i, i % 7 == 0));
    }
};

std::vector<LogEntry> read_all(const Format& format, int fd, std::uint64_t offset = 0, std::uint64_t* next = nullptr) {
    std::vector<LogEntry> entries;
    const auto end = format.reader.read_entries(fd, offset, [&](const LogEntry& e) { entries.push_back(e); });
    if (next) *next = end;
    return entries;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_whole_file_reads_in_order_with_its_streams) {
    for (const auto& format : formats) {
        BOOST_TEST_CONTEXT(format.name) {
            LogFile log(format, 100);
            std::uint64_t next = 0;
            const auto entries = read_all(format, log.fd, 0, &next);
            BOOST_TEST(numbers(entries) == range(0, 100), boost::test_tools::per_element());
            BOOST_TEST(entries[0].from_stderr);
            BOOST_TEST(!entries[1].from_stderr);
            BOOST_TEST(next == log.size());
            BOOST_TEST(read_all(format, log.fd, next).empty());
        }
    }
}

// Table: where the oldest part is punched out, what a full read and tails find.
BOOST_AUTO_TEST_CASE(punched_files_read_from_the_first_whole_entry_after_the_hole) {
    struct Row {
        const char* what;
        int lines;
        std::uint64_t punch;  // bytes at the start, rounded down to blocks
    };
    const std::vector<Row> rows{
        {"no hole", 3000, 0},
        {"one block", 3000, 4096},
        {"most of the file", 5000, 150'000},
        {"a hole over more than one read block (64 KiB json-file, 1 MiB local)", 60'000, 1'500'000},
    };
    for (const auto& format : formats) {
        for (const auto& row : rows) {
            BOOST_TEST_CONTEXT(format.name << ", " << row.what) {
                LogFile log(format, row.lines);
                const auto size = log.size();
                const auto punched = log.punch_start(row.punch);
                BOOST_TEST(log.size() == size);  // KEEP_SIZE: every offset stays valid
                // The first entry kept is the first one that starts at or after the hole's end.
                int first = 0;
                for (std::uint64_t at = 0; at < punched; ++first) at += format.entry(first, false).size();

                BOOST_TEST(numbers(read_all(format, log.fd)) == range(first, row.lines),
                           boost::test_tools::per_element());
                std::uint64_t follow_from = 0;
                BOOST_TEST(numbers(format.reader.tail_entries(log.fd, 5, &follow_from)) ==
                               range(row.lines - 5, row.lines),
                           boost::test_tools::per_element());
                BOOST_TEST(follow_from == size);
                // Asking for more than was kept gives what was kept.
                BOOST_TEST(numbers(format.reader.tail_entries(log.fd, 100'000, nullptr)) == range(first, row.lines),
                           boost::test_tools::per_element());
            }
        }
    }
}

// An entry the engine is still writing is left for later, by a read and by a tail.
BOOST_AUTO_TEST_CASE(an_unfinished_last_entry_waits_for_its_end) {
    for (const auto& format : formats) {
        BOOST_TEST_CONTEXT(format.name) {
            LogFile log(format, 10);
            const auto whole = log.size();
            const auto eleventh = format.entry(10, false);
            log.append(eleventh.substr(0, 9));
            std::uint64_t next = 0;
            BOOST_TEST(numbers(read_all(format, log.fd, 0, &next)) == range(0, 10), boost::test_tools::per_element());
            BOOST_TEST(next == whole);
            std::uint64_t follow_from = 0;
            BOOST_TEST(numbers(format.reader.tail_entries(log.fd, 3, &follow_from)) == range(7, 10),
                       boost::test_tools::per_element());
            BOOST_TEST(follow_from == whole);

            log.append(eleventh.substr(9));
            std::uint64_t after = 0;
            BOOST_TEST(numbers(read_all(format, log.fd, next, &after)) == std::vector<int>{10},
                       boost::test_tools::per_element());
            BOOST_TEST(after == log.size());
        }
    }
}

BOOST_AUTO_TEST_CASE(tail_zero_and_empty_files_say_where_to_follow_from) {
    for (const auto& format : formats) {
        BOOST_TEST_CONTEXT(format.name) {
            LogFile log(format, 50);
            std::uint64_t follow_from = 0;
            BOOST_TEST(format.reader.tail_entries(log.fd, 0, &follow_from).empty());
            BOOST_TEST(follow_from == log.size());

            LogFile empty(format, 0);
            BOOST_TEST(format.reader.tail_entries(empty.fd, 5, &follow_from).empty());
            BOOST_TEST(follow_from == 0u);
            BOOST_TEST(read_all(format, empty.fd).empty());
        }
    }
}

// A log that is all hole but for its newest entries, the first of them torn: the sizes stay,
// nothing before is read.
BOOST_AUTO_TEST_CASE(a_file_that_is_mostly_hole_reads_only_its_data) {
    for (const auto& format : formats) {
        BOOST_TEST_CONTEXT(format.name) {
            LogFile log(format, 0);
            const std::uint64_t hole = std::uint64_t{1} << 32;  // 4 GiB of apparent size, no blocks
            BOOST_REQUIRE(::ftruncate(log.fd, static_cast<off_t>(hole)) == 0);
            const auto torn = format.entry(99, false);
            log.append(torn.substr(torn.size() / 2));  // the end of an entry whose start was punched out
            for (int i = 0; i < 3; ++i) log.append(format.entry(i, false));
            BOOST_TEST(numbers(read_all(format, log.fd)) == range(0, 3), boost::test_tools::per_element());
            BOOST_TEST(numbers(format.reader.tail_entries(log.fd, 10, nullptr)) == range(0, 3),
                       boost::test_tools::per_element());
            const auto regions = data_regions(log.fd, 0, log.size());
            BOOST_REQUIRE(regions.size() == 1u);
            BOOST_TEST(regions[0].begin >= hole - 4096);
        }
    }
}

// A follower reads what is appended, the last entries of a file the engine rotated away and
// then the new file, a file truncated and written again (from its start), nothing more after a
// punch behind it, and ends when the directory goes.
BOOST_AUTO_TEST_CASE(a_follower_follows_appends_rotations_and_cuts) {
    for (const auto& format : formats) {
        BOOST_TEST_CONTEXT(format.name) {
            const auto entry = [&](int i) { return format.entry(i, false); };
            LogFile log(format, 3);
            std::vector<LogEntry> seen;
            const auto sink = [&](const LogEntry& e) { seen.push_back(e); };
            std::uint64_t from = 0;
            BOOST_TEST(numbers(format.reader.tail_entries(log.fd, 1, &from)) == std::vector<int>{2},
                       boost::test_tools::per_element());
            LogFollower follower(log.path, ::open(log.path.c_str(), O_RDONLY | O_CLOEXEC), from, format.reader);
            BOOST_TEST(follower.poll(sink));
            BOOST_TEST(seen.empty());
            log.append(entry(3));
            log.append(entry(4).substr(0, 10));
            BOOST_TEST(follower.poll(sink));
            BOOST_TEST(numbers(seen) == std::vector<int>{3}, boost::test_tools::per_element());

            // Rotation: the live file becomes .1 (its unfinished entry completed first), a new one
            // starts.
            log.append(entry(4).substr(10));
            BOOST_REQUIRE(::rename(log.path.c_str(), (log.path + ".1").c_str()) == 0);
            ::close(log.fd);
            log.fd = ::open(log.path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
            log.append(entry(5));
            BOOST_TEST(follower.poll(sink));
            BOOST_TEST(numbers(seen) == range(3, 6), boost::test_tools::per_element());

            // A cut from outside (truncate to 0), then a new entry one byte longer than the one
            // the follower read there: read from the start. (One that ended exactly at the old
            // offset would not be told apart.)
            BOOST_REQUIRE(::ftruncate(log.fd, 0) == 0);
            log.append(entry(16));
            BOOST_TEST(follower.poll(sink));
            auto expected = std::vector<int>{3, 4, 5, 16};
            BOOST_TEST(numbers(seen) == expected, boost::test_tools::per_element());

            // A punch behind the follower changes nothing for it.
            for (int i = 100; i < 300; ++i) log.append(entry(i));
            BOOST_TEST(follower.poll(sink));
            log.punch_start(4096);
            log.append(entry(17));
            BOOST_TEST(follower.poll(sink));
            for (int i : range(100, 300)) expected.push_back(i);
            expected.push_back(17);
            BOOST_TEST(numbers(seen) == expected, boost::test_tools::per_element());

            std::filesystem::remove_all(log.dir);
            BOOST_TEST(!follower.poll(sink));
        }
    }
}
