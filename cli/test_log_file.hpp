// Test support for the log readers' unit tests (json_log_test, local_log_test): a log file in
// a temp dir of its own, written and punched as the engine and reaperd's capper do, and the
// numbers of the "line N" entries a reader gave.
#pragma once

#include "json_log.hpp"

#include <boost/test/unit_test.hpp>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <unistd.h>

namespace reaperctl::test {

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
