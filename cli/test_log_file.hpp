// Test support for the log readers' unit tests (json_log_test, local_log_test,
// log_readers_test): entries as the engine writes them in each format, a log file in a temp
// dir of its own, written and punched as the engine and reaperd's capper do, and the numbers
// of the "line N" entries a reader gave.
#pragma once

#include "json_log.hpp"

#include <boost/test/unit_test.hpp>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <unistd.h>

namespace reaperctl::test {

// A json-file entry of "line N", as the engine writes it.
inline std::string json_entry(int i, bool to_stderr = false) {
    return R"({"log":"line )" + std::to_string(i) + R"(\n","stream":")" + (to_stderr ? "stderr" : "stdout") +
           R"(","time":"2026-12-02T10:00:00.000000001Z"})" + "\n";
}

// The protobuf wire format as moby's local driver writes a LogEntry (gogo/protobuf, proto3:
// fields in number order, defaults left out), and its frame: [size][entry][size].
inline std::string varint(std::uint64_t value) {
    std::string out;
    do {
        auto byte = static_cast<unsigned char>(value & 0x7f);
        value >>= 7;
        if (value) byte |= 0x80;
        out += static_cast<char>(byte);
    } while (value);
    return out;
}
inline std::string bytes_field(unsigned field, std::string_view value) {
    return varint(field << 3 | 2) + varint(value.size()) + std::string(value);
}
inline std::string varint_field(unsigned field, std::uint64_t value) { return varint(field << 3 | 0) + varint(value); }
struct Partial {
    bool last = false;
};
inline std::string proto_entry(std::string_view line, std::string_view source = "stdout",
                               std::optional<Partial> partial = std::nullopt) {
    std::string entry = bytes_field(1, source) + varint_field(2, 1'764'669'600'000'000'001) + bytes_field(3, line);
    if (partial) {
        std::string metadata = (partial->last ? varint_field(1, 1) : "") + bytes_field(2, "a1b2") + varint_field(3, 2);
        entry += varint_field(4, 1) + bytes_field(5, metadata);
    }
    return entry;
}
inline std::string big_endian(std::uint32_t value) {
    return {static_cast<char>(value >> 24), static_cast<char>(value >> 16 & 0xff), static_cast<char>(value >> 8 & 0xff),
            static_cast<char>(value & 0xff)};
}
inline std::string frame(const std::string& entry) {
    const auto size = big_endian(static_cast<std::uint32_t>(entry.size()));
    return size + entry + size;
}
// A local entry of "line N", as the engine writes it.
inline std::string local_entry(int i, bool to_stderr = false) {
    return frame(proto_entry("line " + std::to_string(i), to_stderr ? "stderr" : "stdout"));
}

class TestLogFile {
public:
    // An empty file `name` in a new temp dir, removed with it.
    explicit TestLogFile(const std::string& name) {
        char dir_template[] = "/tmp/reaperctl-log-test.XXXXXX";
        dir = ::mkdtemp(dir_template);
        path = dir + "/" + name;
        fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        BOOST_REQUIRE(fd >= 0);
    }
    ~TestLogFile() {
        ::close(fd);
        std::filesystem::remove_all(dir);
    }
    TestLogFile(const TestLogFile&) = delete;
    TestLogFile& operator=(const TestLogFile&) = delete;

    void append(const std::string& bytes) {
        BOOST_REQUIRE(::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(size())) ==
                      static_cast<ssize_t>(bytes.size()));
    }
    std::uint64_t size() const {
        struct stat st {};
        ::fstat(fd, &st);
        return static_cast<std::uint64_t>(st.st_size);
    }
    // Punches [0, bytes rounded down to the block size) out as reaperd's capper does; a file
    // system that cannot is a failure here, not a skip.
    std::uint64_t punch_start(std::uint64_t bytes) {
        struct stat st {};
        ::fstat(fd, &st);
        const auto length = bytes / static_cast<std::uint64_t>(st.st_blksize) * static_cast<std::uint64_t>(st.st_blksize);
        if (length == 0) return 0;
        const int rc = ::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(length));
        const int error = errno;
        BOOST_REQUIRE_MESSAGE(rc == 0, "fallocate PUNCH_HOLE in /tmp: " << std::strerror(error));
        return length;
    }

    std::string dir;
    std::string path;
    int fd = -1;
};

// The numbers of the entries read, in order; -1 for an entry that is not "line N\n".
inline std::vector<int> numbers(const std::vector<LogEntry>& entries) {
    std::vector<int> out;
    for (const auto& e : entries) {
        int n = -1;
        if (std::sscanf(e.text.c_str(), "line %d\n", &n) != 1) n = -1;
        out.push_back(n);
    }
    return out;
}

inline std::vector<int> range(int from, int to) {
    std::vector<int> out;
    for (int i = from; i < to; ++i) out.push_back(i);
    return out;
}

}  // namespace reaperctl::test
