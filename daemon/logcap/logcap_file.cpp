#include "logcap_file.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <limits>
#include <memory>

#include <dirent.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

namespace reaperd::logcap {

namespace {

// Owns an open directory stream; closedir on every path out.
struct DirCloser {
    void operator()(DIR* dir) const { ::closedir(dir); }
};

}  // namespace

std::string live_path(const LogFiles& files) { return files.dir + "/" + files.live_name; }

std::uint64_t allocated_bytes(const struct stat& st) { return static_cast<std::uint64_t>(st.st_blocks) * 512; }

std::uint64_t allocated_bytes(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? allocated_bytes(st) : 0;
}

RotatedScan scan_rotations(const LogFiles& files) {
    RotatedScan scan;
    std::unique_ptr<DIR, DirCloser> dir(::opendir(files.dir.c_str()));
    if (!dir) return scan;
    while (auto* entry = ::readdir(dir.get())) {
        if (!is_rotation(entry->d_name, files.live_name)) continue;
        struct stat st {};
        if (::fstatat(::dirfd(dir.get()), entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        // is_rotation() passed: the name is <live>.N or <live>.N.gz, N decimal without a
        // leading zero.
        const unsigned number = static_cast<unsigned>(std::strtoul(entry->d_name + files.live_name.size() + 1, nullptr, 10));
        scan.bytes += allocated_bytes(st);
        scan.files.push_back({entry->d_name, number, allocated_bytes(st)});
    }
    std::sort(scan.files.begin(), scan.files.end(),
              [](const Rotation& a, const Rotation& b) { return a.number < b.number; });
    return scan;
}

CutCalls system_cut_calls() {
    CutCalls calls;
    calls.punch_hole = [](int fd, std::uint64_t offset, std::uint64_t length) {
        return ::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                           static_cast<off_t>(length)) == 0
                   ? 0
                   : errno;
    };
    calls.truncate_to_zero = [](int fd) { return ::ftruncate(fd, 0) == 0 ? 0 : errno; };
    return calls;
}

bool punch_unsupported(int error) { return error == EOPNOTSUPP || error == ENOSYS || error == EINVAL; }

std::uint64_t max_file_bytes(int fd) {
    struct statfs fs {};
    struct stat st {};
    if (::fstatfs(fd, &fs) != 0 || ::fstat(fd, &st) != 0) return 0;
    switch (static_cast<unsigned long>(fs.f_type)) {
        case XFS_SUPER_MAGIC:
        case BTRFS_SUPER_MAGIC:
        case TMPFS_MAGIC: return static_cast<std::uint64_t>(std::numeric_limits<off_t>::max());
        default: return (std::uint64_t{1} << 32) * static_cast<std::uint64_t>(st.st_blksize);
    }
}

int LogFile::open_if_closed(const LogFiles& files, bool& identity_changed) {
    if (live_fd_) return 0;
    std::string path = live_path(files);
    reaper::detail::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY));
    const int open_errno = fd ? 0 : errno;
    struct stat st {};
    if (fd && (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode))) fd.reset();
    live_fd_ = std::move(fd);
    if (live_fd_) max_file_bytes_ = logcap::max_file_bytes(live_fd_.get());
    if (live_fd_ && (st.st_dev != dev_ || st.st_ino != ino_)) {
        dev_ = st.st_dev;
        ino_ = st.st_ino;
        identity_changed = true;
        punched_to_.reset();
    }
    return open_errno;
}

bool LogFile::is_at_path(const LogFiles& files) const {
    struct stat open_st {}, path_st {};
    return live_fd_ && ::fstat(live_fd_.get(), &open_st) == 0 && ::stat(live_path(files).c_str(), &path_st) == 0 &&
           open_st.st_ino == path_st.st_ino && open_st.st_dev == path_st.st_dev;
}

void LogFile::measure_live() {
    live_bytes_ = 0;
    apparent_bytes_ = 0;
    if (!live_fd_) return;
    struct stat st {};
    if (::fstat(live_fd_.get(), &st) == 0 && st.st_nlink > 0) {
        live_bytes_ = allocated_bytes(st);
        apparent_bytes_ = static_cast<std::uint64_t>(st.st_size);
    } else {
        close();
        rotated_dirty_ = true;
    }
}

void LogFile::measure_rotations(const LogFiles& files, bool always) {
    if (!always && !rotated_dirty_) return;
    rotated_bytes_ = scan_rotations(files).bytes;
    rotated_dirty_ = false;
}

CutOutcome LogFile::cut(const LogFiles& files, const CutPlan& plan, const CutCalls& calls) {
    CutOutcome out;
    struct stat st {};
    const bool live = live_fd_ && ::fstat(live_fd_.get(), &st) == 0;
    const std::uint64_t live_before = live ? allocated_bytes(st) : 0;
    const bool cut_live = live && (plan.method == CutMethod::truncate || live_before > plan.keep_bytes);
    // What stays of the live file, as planned: a punch keeps at least keep_bytes of it.
    std::uint64_t kept = cut_live ? (plan.method == CutMethod::truncate ? 0 : plan.keep_bytes) : live_before;
    auto rotations = scan_rotations(files);
    out.before_bytes = live_before + rotations.bytes;
    std::vector<const Rotation*> doomed;
    for (const auto& r : rotations.files) {  // newest first
        if (kept + r.bytes <= plan.keep_bytes)
            kept += r.bytes;
        else
            doomed.push_back(&r);
    }
    std::uint64_t rotations_kept = rotations.bytes;
    for (auto r = doomed.rbegin(); r != doomed.rend(); ++r) {  // oldest first
        std::string rotated = files.dir + "/" + (*r)->name;
        if (::unlink(rotated.c_str()) == 0) {
            out.dropped_bytes += (*r)->bytes;
            rotations_kept -= (*r)->bytes;
        } else if (errno != ENOENT) {
            out.error = errno;
        } else {
            rotations_kept -= (*r)->bytes;
        }
    }
    rotated_dirty_ = true;
    std::uint64_t live_after = live_before;
    if (cut_live) {
        int error = 0;
        CutMethod method = plan.method;
        if (method == CutMethod::punch_hole) {
            // From the first byte still on disk (past the holes of earlier cuts) up to a block
            // boundary that leaves at least keep_bytes of the newest log.
            const auto apparent = static_cast<std::uint64_t>(st.st_size);
            const auto block = static_cast<std::uint64_t>(st.st_blksize > 0 ? st.st_blksize : 4096);
            // A file truncated from outside since has data before that point again: it shrank,
            // or holds more on disk than the part after it (a file system that allocates past
            // the end, as xfs does, lands here too and asks the file as before).
            if (punched_to_ && (*punched_to_ > apparent || live_before > apparent - *punched_to_ + 16 * block))
                punched_to_.reset();
            std::uint64_t start = 0;
            if (punched_to_) {
                start = *punched_to_;
            } else {
                const off_t data = ::lseek(live_fd_.get(), 0, SEEK_DATA);
                start = data < 0 ? apparent : static_cast<std::uint64_t>(data) / block * block;
            }
            const std::uint64_t end = apparent > plan.keep_bytes ? (apparent - plan.keep_bytes) / block * block : 0;
            if (end > start) {
                error = calls.punch_hole(live_fd_.get(), start, end - start);
                if (error == 0) punched_to_ = end;
            }
            if (error != 0 && punch_unsupported(error)) {
                out.punch_refused = true;
                out.punch_error = error;
                method = CutMethod::truncate;
                error = 0;
            }
        }
        if (method == CutMethod::truncate) {
            error = calls.truncate_to_zero(live_fd_.get());
            punched_to_.reset();
        }
        if (error == 0) out.live_method = method;
        else out.error = error;
        struct stat after {};
        if (::fstat(live_fd_.get(), &after) == 0) live_after = allocated_bytes(after);
        if (live_after < live_before) out.dropped_bytes += live_before - live_after;
    }
    out.kept_bytes = live_after + rotations_kept;
    return out;
}

}  // namespace reaperd::logcap
