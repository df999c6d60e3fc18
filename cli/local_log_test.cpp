// How a local entry decodes, what a frame-reader passes over, and how it tells a cut; what
// every log reader does with a file is log_readers_test's.
#include "local_log.hpp"
#include "test_log_file.hpp"

#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

using namespace reaperctl;
using namespace reaperctl::test;

namespace {

std::string entry(int i) { return local_entry(i); }

// A local log: lines 0..count-1, stderr every 7th.
struct LogFile : test::TestLogFile {
    explicit LogFile(int count = 0) : TestLogFile("container.log") {
        for (int i = 0; i < count; ++i) append(local_entry(i, i % 7 == 0));
    }
};

std::vector<LogEntry> read_all(int fd) {
    std::vector<LogEntry> entries;
    read_local_entries(fd, 0, [&](const LogEntry& e) { entries.push_back(e); });
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

// Bytes that do not frame between two frames (not something the engine writes): passed over.
BOOST_AUTO_TEST_CASE(bytes_that_do_not_frame_are_passed_over) {
    LogFile log(20);
    log.append(std::string("\0\0\0\x05garbage that is no frame", 28) + big_endian(999'999));
    for (int i = 20; i < 30; ++i) log.append(entry(i));
    BOOST_TEST(numbers(read_all(log.fd)) == range(0, 30), boost::test_tools::per_element());
    BOOST_TEST(numbers(tail_local_entries(log.fd, 5)) == range(25, 30), boost::test_tools::per_element());
    BOOST_TEST(numbers(tail_local_entries(log.fd, 25)) == range(5, 30), boost::test_tools::per_element());
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

