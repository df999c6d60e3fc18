#include "local_log.hpp"
#include "test_log_file.hpp"

#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

using namespace reaperctl;
using reaperctl::test::numbers;
using reaperctl::test::range;

namespace {

// The protobuf wire format as moby's local driver writes a LogEntry (gogo/protobuf, proto3:
// fields in number order, defaults left out).
std::string varint(std::uint64_t value) {
    std::string out;
    do {
        auto byte = static_cast<unsigned char>(value & 0x7f);
        value >>= 7;
        if (value) byte |= 0x80;
        out += static_cast<char>(byte);
    } while (value);
    return out;
}
std::string bytes_field(unsigned field, std::string_view value) {
    return varint(field << 3 | 2) + varint(value.size()) + std::string(value);
}
std::string varint_field(unsigned field, std::uint64_t value) { return varint(field << 3 | 0) + varint(value); }

struct Partial {
    bool last = false;
};
std::string proto_entry(std::string_view line, std::string_view source = "stdout",
                        std::optional<Partial> partial = std::nullopt) {
    std::string entry = bytes_field(1, source) + varint_field(2, 1'764'669'600'000'000'001) + bytes_field(3, line);
    if (partial) {
        std::string metadata = (partial->last ? varint_field(1, 1) : "") + bytes_field(2, "a1b2") + varint_field(3, 2);
        entry += varint_field(4, 1) + bytes_field(5, metadata);
    }
    return entry;
}
std::string big_endian(std::uint32_t value) {
    return {static_cast<char>(value >> 24), static_cast<char>(value >> 16 & 0xff), static_cast<char>(value >> 8 & 0xff),
            static_cast<char>(value & 0xff)};
}
std::string frame(const std::string& entry) {
    const auto size = big_endian(static_cast<std::uint32_t>(entry.size()));
    return size + entry + size;
}
std::string entry(int i, std::string_view source = "stdout") {
    return frame(proto_entry("line " + std::to_string(i), source));
}

// A local log: lines 0..count-1, stderr every 7th.
struct LogFile : test::TestLogFile {
    explicit LogFile(int count = 0) : TestLogFile("container.log") {
        for (int i = 0; i < count; ++i) append(entry(i, i % 7 == 0 ? "stderr" : "stdout"));
    }
};

std::vector<LogEntry> read_all(int fd, std::uint64_t offset = 0, std::uint64_t* next = nullptr) {
    std::vector<LogEntry> entries;
    const auto end = read_local_entries(fd, offset, [&](const LogEntry& e) { entries.push_back(e); });
    if (next) *next = end;
    return entries;
}

}  // namespace

BOOST_AUTO_TEST_CASE(entries_decode_as_the_engine_wrote_them_and_nothing_else_does) {
    struct Row {
        const char* what;
        std::string entry;
        std::optional<std::string> text;
        bool from_stderr = false;
    };
    const std::string whole = proto_entry("hi");
    const std::vector<Row> rows{
        {"stdout", whole, "hi\n"},
        {"stderr", proto_entry("oops", "stderr"), "oops\n", true},
        {"an empty line", bytes_field(1, "stdout") + varint_field(2, 5), "\n"},
        {"a partial entry, not its line's last", proto_entry("16 KiB of a line", "stdout", Partial{false}),
         "16 KiB of a line"},
        {"a partial entry, its line's last", proto_entry("the rest", "stdout", Partial{true}), "the rest\n"},
        {"a field this reader does not know", whole + varint_field(9, 1) + bytes_field(10, "x"), "hi\n"},
        {"fixed-width fields it does not know", whole + varint(11 << 3 | 1) + std::string(8, 'x') +
                                                    varint(12 << 3 | 5) + std::string(4, 'x'),
         "hi\n"},
        {"no source", bytes_field(3, "hi"), std::nullopt},
        {"another source", proto_entry("hi", "stdin"), std::nullopt},
        {"a hole's zeros", std::string(40, '\0'), std::nullopt},
        {"nothing", "", std::nullopt},
        {"a length past the end", whole + varint(3 << 3 | 2) + varint(100) + "short", std::nullopt},
        {"a varint that never ends", whole + varint(2 << 3 | 0) + std::string(11, '\xff'), std::nullopt},
        {"a group (wire type 3)", whole + varint(13 << 3 | 3), std::nullopt},
        {"metadata that does not decode", whole + varint_field(4, 1) + bytes_field(5, std::string(3, '\0')),
         std::nullopt},
        {"torn at its start", whole.substr(3), std::nullopt},
    };
    for (const auto& row : rows) {
        BOOST_TEST_CONTEXT(row.what) {
            const auto decoded = decode_local_entry(row.entry);
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

// Table: where the oldest part is punched out, what a full read and tails find: the first
// whole frame past the hole on, found by its framing.
BOOST_AUTO_TEST_CASE(punched_files_read_from_the_first_whole_frame_after_the_hole) {
    struct Row {
        const char* what;
        int lines;
        std::uint64_t punch;  // bytes at the start, rounded down to blocks
    };
    const std::vector<Row> rows{
        {"no hole", 3000, 0},
        {"one block", 3000, 4096},
        {"most of the file", 5000, 150'000},
        {"a hole over more than one read block", 60'000, 1'500'000},
    };
    for (const auto& row : rows) {
        BOOST_TEST_CONTEXT(row.what) {
            LogFile log(row.lines);
            const auto size = log.size();
            const auto punched = log.punch_start(row.punch);
            BOOST_TEST(log.size() == size);
            int first = 0;
            std::uint64_t at = 0;
            while (at < punched) at += entry(first++).size();

            BOOST_TEST(numbers(read_all(log.fd)) == range(first, row.lines), boost::test_tools::per_element());
            std::uint64_t follow_from = 0;
            BOOST_TEST(numbers(tail_local_entries(log.fd, 5, &follow_from)) == range(row.lines - 5, row.lines),
                       boost::test_tools::per_element());
            BOOST_TEST(follow_from == size);
            BOOST_TEST(numbers(tail_local_entries(log.fd, 100'000)) == range(first, row.lines),
                       boost::test_tools::per_element());
        }
    }
}

// A frame the engine is still writing is left for later, by a read and by a tail (which then
// reads the file forward).
BOOST_AUTO_TEST_CASE(an_unfinished_last_frame_waits_for_its_end) {
    LogFile log(10);
    const auto whole = log.size();
    const auto eleventh = entry(10);
    log.append(eleventh.substr(0, 9));
    std::uint64_t next = 0;
    BOOST_TEST(numbers(read_all(log.fd, 0, &next)) == range(0, 10), boost::test_tools::per_element());
    BOOST_TEST(next == whole);
    std::uint64_t follow_from = 0;
    BOOST_TEST(numbers(tail_local_entries(log.fd, 3, &follow_from)) == range(7, 10), boost::test_tools::per_element());
    BOOST_TEST(follow_from == whole);

    log.append(eleventh.substr(9));
    std::uint64_t after = 0;
    BOOST_TEST(numbers(read_all(log.fd, next, &after)) == std::vector<int>{10}, boost::test_tools::per_element());
    BOOST_TEST(after == log.size());
}

// Bytes that do not frame between two frames (not something the engine writes): passed over.
BOOST_AUTO_TEST_CASE(bytes_that_do_not_frame_are_passed_over) {
    LogFile log(20);
    log.append(std::string("\0\0\0\x05garbage that is no frame", 28) + big_endian(999'999));
    for (int i = 20; i < 30; ++i) log.append(entry(i));
    BOOST_TEST(numbers(read_all(log.fd)) == range(0, 30), boost::test_tools::per_element());
    BOOST_TEST(numbers(tail_local_entries(log.fd, 5)) == range(25, 30), boost::test_tools::per_element());
    BOOST_TEST(numbers(tail_local_entries(log.fd, 25)) == range(5, 30), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(tail_zero_and_empty_files_say_where_to_follow_from) {
    LogFile log(50);
    std::uint64_t follow_from = 0;
    BOOST_TEST(tail_local_entries(log.fd, 0, &follow_from).empty());
    BOOST_TEST(follow_from == log.size());

    LogFile empty;
    BOOST_TEST(tail_local_entries(empty.fd, 5, &follow_from).empty());
    BOOST_TEST(follow_from == 0u);
    BOOST_TEST(read_all(empty.fd).empty());
}

// A log that is all hole but for its newest frames, the first of them torn: only its data is
// read.
BOOST_AUTO_TEST_CASE(a_file_that_is_mostly_hole_reads_only_its_data) {
    LogFile log;
    const std::uint64_t hole = std::uint64_t{1} << 32;
    BOOST_REQUIRE(::ftruncate(log.fd, static_cast<off_t>(hole)) == 0);
    log.append(entry(99).substr(6));  // the end of a frame whose start was punched out
    for (int i = 0; i < 3; ++i) log.append(entry(i));
    BOOST_TEST(numbers(read_all(log.fd)) == range(0, 3), boost::test_tools::per_element());
    BOOST_TEST(numbers(tail_local_entries(log.fd, 10)) == range(0, 3), boost::test_tools::per_element());
}

// Table: whether a follower at `offset` (where a frame ended) finds the file cut from outside.
BOOST_AUTO_TEST_CASE(a_cut_before_the_offset_is_told_from_a_punch) {
    LogFile log(100);
    const auto offset = log.size();
    BOOST_TEST(!local_cut_before(log.fd, offset));
    log.punch_start(4096);                          // all of it (3,490 bytes)
    BOOST_TEST(!local_cut_before(log.fd, offset));  // a punch moves no offset
    BOOST_REQUIRE(::ftruncate(log.fd, 0) == 0);
    BOOST_TEST(local_cut_before(log.fd, offset));  // shorter than the offset
    for (int i = 0; i < 300; ++i) log.append(entry(1000 + i));  // 37 bytes each: none ends at 3,490
    BOOST_REQUIRE(log.size() > offset);
    BOOST_TEST(local_cut_before(log.fd, offset));  // written past it again, frames elsewhere
}

// A follower reads what is appended, the last frames of a file the engine rotated away and
// then the new file, a file truncated and written again from its start, and ends when the
// directory goes.
BOOST_AUTO_TEST_CASE(a_follower_follows_appends_rotations_and_cuts) {
    LogFile log(3);
    std::vector<LogEntry> seen;
    const auto sink = [&](const LogEntry& e) { seen.push_back(e); };
    std::uint64_t from = 0;
    BOOST_TEST(numbers(tail_local_entries(log.fd, 1, &from)) == std::vector<int>{2}, boost::test_tools::per_element());
    LogFollower follower(log.path, ::open(log.path.c_str(), O_RDONLY | O_CLOEXEC), from, local_format);
    BOOST_TEST(follower.poll(sink));
    BOOST_TEST(seen.empty());
    log.append(entry(3));
    log.append(entry(4).substr(0, 10));
    BOOST_TEST(follower.poll(sink));
    BOOST_TEST(numbers(seen) == std::vector<int>{3}, boost::test_tools::per_element());

    log.append(entry(4).substr(10));
    BOOST_REQUIRE(::rename(log.path.c_str(), (log.path + ".1").c_str()) == 0);
    ::close(log.fd);
    log.fd = ::open(log.path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    log.append(entry(5));
    BOOST_TEST(follower.poll(sink));
    BOOST_TEST(numbers(seen) == range(3, 6), boost::test_tools::per_element());

    for (int i = 6; i < 200; ++i) log.append(entry(i));
    BOOST_TEST(follower.poll(sink));
    BOOST_REQUIRE(::ftruncate(log.fd, 0) == 0);
    for (int i = 1000; i < 1300; ++i) log.append(entry(i));
    BOOST_TEST(follower.poll(sink));
    auto expected = range(3, 200);
    for (int i : range(1000, 1300)) expected.push_back(i);
    BOOST_TEST(numbers(seen) == expected, boost::test_tools::per_element());

    log.punch_start(8192);
    log.append(entry(1300));
    BOOST_TEST(follower.poll(sink));
    BOOST_TEST(numbers(seen).back() == 1300);
    BOOST_TEST(seen.size() == expected.size() + 1);

    std::filesystem::remove_all(log.dir);
    BOOST_TEST(!follower.poll(sink));
}
