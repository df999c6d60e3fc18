#include "logcap_file.hpp"

#include <cerrno>
#include <memory>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace reaperd::logcap {

namespace {

// Owns an open directory stream; closedir on every path out.
struct DirCloser {
    void operator()(DIR* dir) const { ::closedir(dir); }
};

}  // namespace

std::string live_path(const LogFiles& files) { return files.dir + "/" + files.live_name; }

RotatedScan scan_rotations(const LogFiles& files) {
    RotatedScan scan;
    std::unique_ptr<DIR, DirCloser> dir(::opendir(files.dir.c_str()));
    if (!dir) return scan;
    while (auto* entry = ::readdir(dir.get())) {
        if (!is_rotation(entry->d_name, files.live_name)) continue;
        struct stat st {};
        if (::fstatat(::dirfd(dir.get()), entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        scan.bytes += static_cast<std::uint64_t>(st.st_size);
        scan.names.emplace_back(entry->d_name);
    }
    return scan;
}

int LogFile::open_if_closed(const LogFiles& files, bool& identity_changed) {
    if (live_fd_) return 0;
    std::string path = live_path(files);
    reaper::detail::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY));
    const int open_errno = fd ? 0 : errno;
    struct stat st {};
    if (fd && (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode))) fd.reset();
    live_fd_ = std::move(fd);
    if (live_fd_ && (st.st_dev != dev_ || st.st_ino != ino_)) {
        dev_ = st.st_dev;
        ino_ = st.st_ino;
        identity_changed = true;
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
    if (!live_fd_) return;
    struct stat st {};
    if (::fstat(live_fd_.get(), &st) == 0 && st.st_nlink > 0) {
        live_bytes_ = static_cast<std::uint64_t>(st.st_size);
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

CutOutcome LogFile::cut(const LogFiles& files) {
    CutOutcome out;
    if (live_fd_) {
        struct stat st {};
        if (::fstat(live_fd_.get(), &st) == 0) out.before_bytes = static_cast<std::uint64_t>(st.st_size);
        if (::ftruncate(live_fd_.get(), 0) == 0)
            out.dropped_bytes += out.before_bytes;
        else
            out.error = errno;
    }
    auto rotations = scan_rotations(files);
    out.before_bytes += rotations.bytes;
    for (const auto& name : rotations.names) {
        std::string rotated = files.dir + "/" + name;
        struct stat st {};
        if (::stat(rotated.c_str(), &st) != 0) continue;
        if (::unlink(rotated.c_str()) == 0)
            out.dropped_bytes += static_cast<std::uint64_t>(st.st_size);
        else if (errno != ENOENT)
            out.error = errno;
    }
    rotated_dirty_ = true;
    return out;
}

}  // namespace reaperd::logcap
