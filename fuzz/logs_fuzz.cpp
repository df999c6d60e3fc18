// The log files `reaperctl logs` reads: the engine's json-file and local logs, as a punched
// cut, a torn write or anything else left them. The promise: entries or nothing, never a
// crash, a hang or a read past the file; a tail gives at most what it was asked for and says
// where to follow from within the file; a follower's test of a cut answers either way.
#include "check.hpp"

#include "json_log.hpp"
#include "local_log.hpp"

#include <string>

#include <sys/mman.h>
#include <unistd.h>

namespace {

void decode(const std::string& text) {
    if (const auto entry = reaperctl::decode_json_log_line(text)) FUZZ_CHECK(text.front() == '{');
    if (const auto entry = reaperctl::decode_local_entry(text)) FUZZ_CHECK(entry->text.size() <= text.size() + 1);
}

// The input as a file: an fd of a memfd holding it.
void read_as_files(const std::string& text) {
    const int fd = ::memfd_create("logs_fuzz", MFD_CLOEXEC);
    FUZZ_CHECK(fd >= 0);
    FUZZ_CHECK(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
    for (const auto* format : {&reaperctl::json_file_format, &reaperctl::local_format}) {
        std::size_t entries = 0;
        const auto next = format->read_entries(fd, 0, [&](const reaperctl::LogEntry&) { ++entries; });
        FUZZ_CHECK(next <= text.size());
        FUZZ_CHECK(entries <= text.size());
        for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{5}, entries + 1}) {
            std::uint64_t follow_from = 0;
            FUZZ_CHECK(format->tail_entries(fd, n, &follow_from).size() <= n);
            FUZZ_CHECK(follow_from <= text.size());
        }
        for (std::uint64_t offset : {std::uint64_t{1}, next, std::uint64_t{text.size()}})
            if (offset > 0) (void)format->cut_before(fd, offset);
    }
    ::close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string text = fuzz_text(data, size);
    decode(text);
    read_as_files(text);
    return 0;
}
