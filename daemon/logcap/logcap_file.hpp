// One capped log on disk, for the log capper's watcher thread (logcap.hpp): the live file
// held open for the cut, the identity (device, inode) of the file last opened, and the sizes
// of the live file and its rotations as last measured.
//
// Sizes are the bytes on disk (st_blocks * 512), not st_size: a cut that punches out the
// oldest part of the live file leaves its apparent size where it was, growing with every
// write, and only the allocated blocks say what the log holds.
//
// Contract: every call is made by one thread (the watcher); nothing here blocks but the
// file system calls themselves. A rotation replaces the live file by rename, so the open
// descriptor may point at a rotated file: is_at_path() is the one check of that (device and
// inode of the open file against the file at the path), and cut() never cuts through a
// descriptor that fails it. Failures are values (an errno), never exceptions.
#pragma once

#include "engine_port.hpp"
#include "logcap_policy.hpp"
#include "unique_fd.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <sys/stat.h>

namespace reaperd::logcap {

// The bytes a file holds on disk (st_blocks * 512): what the capper counts of a log. The
// path form is 0 when the file cannot be stat'ed (not there yet, or rotated away).
std::uint64_t allocated_bytes(const struct stat& st);
std::uint64_t allocated_bytes(const std::string& path);

// The rotations (<live>.N, <live>.N.gz) beside a live file, newest (.1) first, with the
// bytes each holds on disk.
struct Rotation {
    std::string name;
    unsigned number = 0;
    std::uint64_t bytes = 0;
};
struct RotatedScan {
    std::uint64_t bytes = 0;
    std::vector<Rotation> files;
};
RotatedScan scan_rotations(const LogFiles& files);

// The two calls a cut makes on the live file, so a test can have the file system refuse
// them. Each returns 0 or an errno.
struct CutCalls {
    // fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE) over [offset, offset + length).
    std::function<int(int fd, std::uint64_t offset, std::uint64_t length)> punch_hole;
    std::function<int(int fd)> truncate_to_zero;
};
// The real system calls.
CutCalls system_cut_calls();
// Whether a punch failed because the file system cannot punch holes in this file, for which a
// truncate is the fallback: EOPNOTSUPP (vfat, NFS < 4.2, ext4 on a file without extents...),
// ENOSYS (a FUSE file system without fallocate) and EINVAL (a file system that refuses the
// mode rather than the range; the range given is always valid). Any other errno is a failure
// of this cut, retried.
bool punch_unsupported(int error);

// The largest file the file system holding `fd` allows, as far as it is known: ext4's
// 2^32 blocks (16 TiB at 4 KiB) for ext2/3/4 and file systems not known here (the smallest
// of the common limits); 2^63 - 1 for xfs, btrfs and tmpfs. 0 if fstatfs fails.
std::uint64_t max_file_bytes(int fd);

// What one cut did: the bytes before it (live file and rotations), the bytes it dropped, the
// bytes kept, the method the live file was cut with (nullopt: it was not cut, only rotations
// were deleted), whether a punch was refused (then the live file was truncated), and the
// errno of the last step that failed (0: none did).
struct CutOutcome {
    std::uint64_t before_bytes = 0;
    std::uint64_t dropped_bytes = 0;
    std::uint64_t kept_bytes = 0;
    std::optional<CutMethod> live_method;
    bool punch_refused = false;
    int punch_error = 0;  // the errno of the refused punch
    int error = 0;
};

class LogFile {
public:
    bool is_open() const { return static_cast<bool>(live_fd_); }
    void close() { live_fd_.reset(); }

    // Opens the live file if it is not open (O_WRONLY, for fallocate and ftruncate; a
    // non-regular file is refused). Returns 0, or the errno of the open (ENOENT: no live file yet, or a rotation
    // is between its rename and the new file). Sets `identity_changed` when the file opened
    // is another than the one last opened (see dev()/ino()).
    int open_if_closed(const LogFiles& files, bool& identity_changed);

    // Whether the open file is still the one at the path (same device and inode). False when
    // nothing is open or either cannot be stat'ed.
    bool is_at_path(const LogFiles& files) const;
    // Closes the open file if it is no longer the one at the path (see is_at_path()).
    void close_if_replaced(const LogFiles& files) {
        if (is_open() && !is_at_path(files)) close();
    }

    // Re-reads the live file's sizes from the open descriptor (0 with none open). One that
    // was unlinked (no links left) is closed, and the rotations are marked to be rescanned.
    void measure_live();
    // Rescans the rotations if they were marked (or `always`), and clears the mark.
    void measure_rotations(const LogFiles& files, bool always);
    void mark_rotations() { rotated_dirty_ = true; }

    // Cuts the log down to the newest `plan.keep_bytes` on disk. Newest first, the live file
    // and then each rotation that fits whole in what is left of keep_bytes are kept; the
    // other rotations are deleted, oldest first; then, if the live file alone holds more than
    // keep_bytes, it is cut: with punch_hole, [the first data, E) is punched out, E rounded
    // down to the file system's block (st_blksize) so that at least keep_bytes of the newest
    // log stay; with truncate, or where a punch is refused (punch_unsupported), it is
    // truncated to 0. Marks the rotations to be rescanned. The caller opens (and checks
    // is_at_path()) first.
    CutOutcome cut(const LogFiles& files, const CutPlan& plan, const CutCalls& calls);

    std::uint64_t live_bytes() const { return live_bytes_; }
    // The live file's st_size, which a punched cut does not lower.
    std::uint64_t apparent_bytes() const { return apparent_bytes_; }
    // max_file_bytes() of the open file, read when it was opened.
    std::uint64_t max_file_bytes() const { return max_file_bytes_; }
    std::uint64_t rotated_bytes() const { return rotated_bytes_; }
    std::uint64_t log_bytes() const { return live_bytes_ + rotated_bytes_; }
    // The live file last opened, 0/0 before (what the persisted list records).
    std::uint64_t dev() const { return dev_; }
    std::uint64_t ino() const { return ino_; }
    void set_identity(std::uint64_t dev, std::uint64_t ino) {
        dev_ = dev;
        ino_ = ino;
    }

private:
    reaper::detail::UniqueFd live_fd_;
    std::uint64_t live_bytes_ = 0;
    std::uint64_t apparent_bytes_ = 0;
    std::uint64_t max_file_bytes_ = 0;
    std::uint64_t rotated_bytes_ = 0;
    bool rotated_dirty_ = true;
    std::uint64_t dev_ = 0;
    std::uint64_t ino_ = 0;
    // Where this capper's last punch into this file ended: the next one starts there. Asking
    // the file (lseek SEEK_DATA) instead waits for its inode behind a busy writer: 38-76 ms
    // under strace beside a 70 MB/s writer and one CPU-bound job.
    std::optional<std::uint64_t> punched_to_;
};

std::string live_path(const LogFiles& files);

}  // namespace reaperd::logcap
