// Internal to libreaper and reaperd (not installed): the one owner type for a raw descriptor,
// so that no path (an early return, an exception) leaks one and none is closed twice.
#pragma once

#include <cerrno>
#include <utility>

#include <unistd.h>

namespace reaper::detail {

// Owns one descriptor, or none (-1). Move-only: a move leaves the source owning none.
// - The destructor, reset() and move-assignment close the owned descriptor once and leave
//   errno as it was, so a caller may close on its way out of a failed call and still report
//   that call's errno. They ignore close's own error: Linux releases the descriptor even when
//   close fails, so there is nothing to retry, and retrying could close a descriptor another
//   thread has just been given.
// - close_checked() is for the few descriptors whose close can report a lost write (a file
//   just written on NFS, say): it closes now and says whether close succeeded.
// - release() gives the descriptor up without closing it.
// Not thread-safe: one owner at a time, like the descriptor itself.
class UniqueFd {
public:
    UniqueFd() noexcept = default;
    explicit UniqueFd(int fd) noexcept : fd_(fd) {}
    ~UniqueFd() { reset(); }
    UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
    UniqueFd& operator=(UniqueFd&& other) noexcept {
        reset(other.release());
        return *this;
    }
    UniqueFd(const UniqueFd&) = delete;
    UniqueFd& operator=(const UniqueFd&) = delete;

    int get() const noexcept { return fd_; }
    explicit operator bool() const noexcept { return fd_ >= 0; }

    // The descriptor, now owned by the caller; this owns none.
    int release() noexcept { return std::exchange(fd_, -1); }

    // Closes the owned descriptor (errno kept) and owns `fd` instead.
    void reset(int fd = -1) noexcept {
        const int old = std::exchange(fd_, fd);
        if (old < 0) return;
        const int saved = errno;
        ::close(old);
        errno = saved;
    }

    // Closes the owned descriptor now. True if there was none or close succeeded; false with
    // close's errno otherwise. Either way this owns none afterwards.
    bool close_checked() noexcept {
        const int old = release();
        return old < 0 || ::close(old) == 0;
    }

private:
    int fd_ = -1;
};

}  // namespace reaper::detail
