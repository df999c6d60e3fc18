// One capped log on disk, for the log capper's watcher thread (logcap.hpp): the live file
// held open for ftruncate, the identity (device, inode) of the file last opened, and the
// sizes of the live file and its rotations as last measured.
//
// Contract: every call is made by one thread (the watcher); nothing here blocks but the
// file system calls themselves. A rotation replaces the live file by rename, so the open
// descriptor may point at a rotated file: is_at_path() is the one check of that (device and
// inode of the open file against the file at the path), and cut() never truncates through a
// descriptor that fails it. Failures are values (an errno), never exceptions.
#pragma once

#include "engine_port.hpp"
#include "unique_fd.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace reaperd::logcap {

// The rotations (<live>.N, <live>.N.gz) beside a live file: their bytes and names.
struct RotatedScan {
    std::uint64_t bytes = 0;
    std::vector<std::string> names;
};
RotatedScan scan_rotations(const LogFiles& files);

// What one cut did: the bytes before it (live file and rotations), the bytes it dropped, and
// the errno of the last step that failed (0: none did).
struct CutOutcome {
    std::uint64_t before_bytes = 0;
    std::uint64_t dropped_bytes = 0;
    int error = 0;
};

class LogFile {
public:
    bool is_open() const { return static_cast<bool>(live_fd_); }
    void close() { live_fd_.reset(); }

    // Opens the live file if it is not open (O_WRONLY, for ftruncate; a non-regular file is
    // refused). Returns 0, or the errno of the open (ENOENT: no live file yet, or a rotation
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

    // Re-reads the live file's size from the open descriptor (0 with none open). One that
    // was unlinked (no links left) is closed, and the rotations are marked to be rescanned.
    void measure_live();
    // Rescans the rotations if they were marked (or `always`), and clears the mark.
    void measure_rotations(const LogFiles& files, bool always);
    void mark_rotations() { rotated_dirty_ = true; }

    // Truncates the open live file to 0 and unlinks every rotation; marks the rotations to
    // be rescanned. The caller opens (and checks is_at_path()) first.
    CutOutcome cut(const LogFiles& files);

    std::uint64_t live_bytes() const { return live_bytes_; }
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
    std::uint64_t rotated_bytes_ = 0;
    bool rotated_dirty_ = true;
    std::uint64_t dev_ = 0;
    std::uint64_t ino_ = 0;
};

std::string live_path(const LogFiles& files);

}  // namespace reaperd::logcap
