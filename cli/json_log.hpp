// Reading a container's json-file log as the engine wrote it, holes included: what
// `reaperctl logs` prints where the engine's own reader cannot.
//
// After reaperd punches the oldest part of a log out (fallocate PUNCH_HOLE | KEEP_SIZE, issue
// 21), the file starts with a hole of NUL bytes. Docker 23+'s decoder stops at the first NUL,
// so plain `docker logs` shows nothing of what was kept (moby issue 53631). These functions
// read only the file's data (lseek SEEK_DATA / SEEK_HOLE), so a hole costs no read, and keep
// only whole lines that decode: the line torn by a block-aligned punch (and one a writer is
// still appending) is left out.
//
// The file format, one entry per line: {"log":"<text, its '\n' included>","stream":
// "stdout"|"stderr","time":"<RFC 3339>"}.
//
// What the local driver's reader (local_log.hpp) shares with this one is here too: the entry
// printed, the file's data regions, reading at an offset, and the follower, which takes either
// format (LogFormat).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace reaperctl {

struct LogEntry {
    std::string text;  // the "log" field as written, its '\n' included when the line had one
    bool from_stderr = false;
};

// One line of the file, without its '\n'. nullopt for anything that is not a json-file entry
// (a torn line, a line of NULs, a "log" that is not a string, a stream other than stdout or
// stderr).
std::optional<LogEntry> decode_json_log_line(std::string_view line);

// The file's data regions [begin, end) from `from` up to `size`, in order (holes skipped).
// A file system that knows no holes reports all of it as data.
struct DataRegion {
    std::uint64_t begin = 0;
    std::uint64_t end = 0;
};
std::vector<DataRegion> data_regions(int fd, std::uint64_t from, std::uint64_t size);

using EntrySink = std::function<void(const LogEntry&)>;

// pread of [begin, end): shorter only where the file ends first (cut under us). Throws
// std::system_error on a read error.
std::string read_at(int fd, std::uint64_t begin, std::uint64_t end);
// The file's apparent size (st_size). Throws std::system_error.
std::uint64_t file_size(int fd);

// Every entry of the whole lines from `offset` to the file's current end, in order. A line
// cut by a hole is skipped; the part after the last '\n' is left for a later call. Returns the
// offset after the last whole line (or `offset` when there is none): where the next call
// starts. Throws std::system_error on a read error.
std::uint64_t read_entries(int fd, std::uint64_t offset, const EntrySink& sink);

// The last `n` entries of the file, oldest first, read backward from its end in blocks: only
// as much of the file as holds them is read. `follow_from` (when given) gets the offset after
// the last whole line, where following starts. Throws std::system_error on a read error.
std::vector<LogEntry> tail_entries(int fd, std::size_t n, std::uint64_t* follow_from = nullptr);

// How `logs` reads one driver's file: json-file (the functions above) or local
// (local_log.hpp), each with the contracts of read_entries() and tail_entries().
struct LogFormat {
    std::uint64_t (*read_entries)(int fd, std::uint64_t offset, const EntrySink& sink);
    std::vector<LogEntry> (*tail_entries)(int fd, std::size_t n, std::uint64_t* follow_from);
    // Whether the file was cut from outside before `offset`, where an entry ended when it was
    // read: truncated (shorter than `offset`), or truncated and written past it again (what
    // precedes `offset` is no longer an entry's end). A punched hole (NULs) is not a cut: it
    // changes no offset.
    bool (*cut_before)(int fd, std::uint64_t offset);
};
extern const LogFormat json_file_format;

// Follows a log of `format` by its path, from an offset: each poll() reads the whole entries
// appended since the last. When the engine rotates the log (renames it to .1 and starts a new
// file at the path), the old file's last entries are read first, then the new file from its
// start; a file cut from outside (format.cut_before) is read again from 0.
// The caller decides how often to poll.
class LogFollower {
public:
    // Takes `fd`, open on the file at `path`, and closes it.
    LogFollower(std::string path, int fd, std::uint64_t offset, const LogFormat& format);
    ~LogFollower();
    LogFollower(const LogFollower&) = delete;
    LogFollower& operator=(const LogFollower&) = delete;

    // Sends what is new to `sink`. False once the log's directory is gone (the container was
    // removed): nothing more will come. Throws std::system_error on a read error.
    bool poll(const EntrySink& sink);

private:
    std::string path_;
    int fd_;
    std::uint64_t offset_;
    const LogFormat& format_;
};

}  // namespace reaperctl
