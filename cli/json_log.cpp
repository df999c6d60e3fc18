#include "json_log.hpp"

#include <Poco/Exception.h>
#include <Poco/JSON/Object.h>
#include <Poco/JSON/Parser.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <filesystem>
#include <system_error>
#include <utility>

#include <fcntl.h>

#include <sys/stat.h>
#include <unistd.h>

namespace reaperctl {

namespace {

// One read: a json-file line of `yes` is ~70 bytes, of a 16 KiB chunk of output (the most the
// engine puts in one entry) up to ~100 KB with escapes; 64 KiB reads a `--tail 200` of short
// lines in one call.
constexpr std::size_t block = 64 * 1024;

[[noreturn]] void throw_errno(const char* what) {
    throw std::system_error(errno, std::generic_category(), what);
}

// A json-file log cut from outside before `offset`: shorter than it, or what precedes it is
// no longer the '\n' read there (a hole's NUL is a punch, which changes no offset).
bool json_cut_before(int fd, std::uint64_t offset) {
    char before = '\n';
    return file_size(fd) < offset ||
           (::pread(fd, &before, 1, static_cast<off_t>(offset - 1)) == 1 && before != '\n' && before != '\0');
}

}  // namespace

const LogFormat json_file_format{read_entries, tail_entries, json_cut_before};

std::string read_at(int fd, std::uint64_t begin, std::uint64_t end) {
    std::string data(static_cast<std::size_t>(end - begin), '\0');
    std::size_t done = 0;
    while (done < data.size()) {
        const auto n = ::pread(fd, data.data() + done, data.size() - done, static_cast<off_t>(begin + done));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw_errno("reading the log");
        if (n == 0) break;  // shrunk under us (a cut): what is there is all there is
        done += static_cast<std::size_t>(n);
    }
    data.resize(done);
    return data;
}

std::uint64_t file_size(int fd) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw_errno("fstat of the log");
    return static_cast<std::uint64_t>(st.st_size);
}

std::optional<LogEntry> decode_json_log_line(std::string_view line) {
    if (line.empty() || line.front() != '{') return std::nullopt;  // NULs of a hole, a torn start
    try {
        Poco::JSON::Parser parser;
        const auto object = parser.parse(std::string(line)).extract<Poco::JSON::Object::Ptr>();
        const auto log = object->get("log");
        const auto stream = object->get("stream");
        if (!log.isString() || !stream.isString()) return std::nullopt;
        const auto name = stream.extract<std::string>();
        if (name != "stdout" && name != "stderr") return std::nullopt;
        return LogEntry{log.extract<std::string>(), name == "stderr"};
    } catch (const Poco::Exception&) {
        return std::nullopt;
    } catch (const std::exception&) {  // Poco's bad casts
        return std::nullopt;
    }
}

std::vector<DataRegion> data_regions(int fd, std::uint64_t from, std::uint64_t size) {
    std::vector<DataRegion> regions;
    auto at = from;
    while (at < size) {
        const auto data = ::lseek(fd, static_cast<off_t>(at), SEEK_DATA);
        if (data < 0) {
            if (errno == ENXIO) break;  // nothing but hole from here to the end
            if (errno == EINVAL) {      // a file system without SEEK_DATA: all data
                regions.push_back({at, size});
                break;
            }
            throw_errno("lseek SEEK_DATA on the log");
        }
        const auto hole = ::lseek(fd, data, SEEK_HOLE);
        if (hole < 0) throw_errno("lseek SEEK_HOLE on the log");
        const auto end = std::min<std::uint64_t>(static_cast<std::uint64_t>(hole), size);
        if (static_cast<std::uint64_t>(data) >= end) break;
        regions.push_back({static_cast<std::uint64_t>(data), end});
        at = end;
    }
    return regions;
}

std::uint64_t read_entries(int fd, std::uint64_t offset, const EntrySink& sink) {
    std::uint64_t next = offset;
    for (const auto& region : data_regions(fd, offset, file_size(fd))) {
        std::string partial;  // a line whose '\n' is not read yet; a hole ends it torn
        for (auto at = region.begin; at < region.end;) {
            const auto upto = std::min(region.end, at + block);
            const auto data = read_at(fd, at, upto);
            if (data.empty()) return next;
            std::string_view rest(data);
            for (auto nl = rest.find('\n'); nl != std::string_view::npos; nl = rest.find('\n')) {
                partial.append(rest.substr(0, nl));
                if (auto entry = decode_json_log_line(partial)) sink(*entry);
                partial.clear();
                rest.remove_prefix(nl + 1);
                next = at + (data.size() - rest.size());
            }
            partial.append(rest);
            at += data.size();
        }
    }
    return next;
}

std::vector<LogEntry> tail_entries(int fd, std::size_t n, std::uint64_t* follow_from) {
    std::deque<LogEntry> kept;
    const auto regions = data_regions(fd, 0, file_size(fd));
    // Where following starts: after the file's last '\n'; a file without one is followed from
    // its last data region's start.
    std::optional<std::uint64_t> last_end;
    const auto more = [&] { return kept.size() < n || (follow_from && !last_end); };
    for (auto region = regions.rbegin(); region != regions.rend() && more(); ++region) {
        // Bytes after the last '\n' of a region are an unfinished line (at the file's end) or
        // one torn by a hole: left out. `line` gathers one line backward once its '\n' is seen.
        std::string line;
        bool have_end = false;
        const auto keep = [&](const std::string& text) {
            if (kept.size() >= n) return;
            if (auto entry = decode_json_log_line(text)) kept.push_front(std::move(*entry));
        };
        for (auto pos = region->end; pos > region->begin && more();) {
            const auto start = pos - std::min<std::uint64_t>(block, pos - region->begin);
            const auto data = read_at(fd, start, pos);
            auto upto = data.size();
            while (upto > 0 && more()) {
                const auto nl = data.rfind('\n', upto - 1);
                if (nl == std::string::npos) {
                    if (have_end) line.insert(0, data, 0, upto);
                    break;
                }
                if (have_end) {
                    keep(data.substr(nl + 1, upto - nl - 1) + line);
                    line.clear();
                } else if (!last_end) {
                    last_end = start + nl + 1;
                }
                have_end = true;
                upto = nl;
            }
            pos = start;
        }
        // The region's first line: whole at the file's start, torn after a hole (then it does
        // not decode).
        if (have_end) keep(line);
    }
    if (follow_from) *follow_from = last_end.value_or(regions.empty() ? 0 : regions.back().begin);
    return {std::make_move_iterator(kept.begin()), std::make_move_iterator(kept.end())};
}

LogFollower::LogFollower(std::string path, int fd, std::uint64_t offset, const LogFormat& format)
    : path_(std::move(path)), fd_(fd), offset_(offset), format_(format) {}

LogFollower::~LogFollower() { ::close(fd_); }

bool LogFollower::poll(const EntrySink& sink) {
    // Cut from outside (a truncate, reaperd's fallback where holes cannot be punched): what is
    // there now is new.
    if (offset_ > 0 && format_.cut_before(fd_, offset_)) offset_ = 0;
    offset_ = format_.read_entries(fd_, offset_, sink);
    struct stat at_path {};
    if (::stat(path_.c_str(), &at_path) != 0) {
        if (errno != ENOENT) throw_errno("stat of the log");
        // Between a rotation's rename and the new file, or gone with its container.
        return std::filesystem::exists(std::filesystem::path(path_).parent_path());
    }
    struct stat open_now {};
    if (::fstat(fd_, &open_now) != 0) throw_errno("fstat of the log");
    if (at_path.st_ino == open_now.st_ino && at_path.st_dev == open_now.st_dev) return true;
    // Rotated: the old file is complete (the engine writes only to the new one now).
    format_.read_entries(fd_, offset_, sink);
    const int fresh = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fresh < 0) {
        if (errno == ENOENT) return true;  // rotated again already: the next poll finds it
        throw_errno("opening the rotated log");
    }
    ::close(fd_);
    fd_ = fresh;
    offset_ = format_.read_entries(fd_, 0, sink);
    return true;
}

}  // namespace reaperctl
