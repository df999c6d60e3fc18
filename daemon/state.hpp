// The daemon's persisted state (pending reaps, lease-grace deadlines, tombstones, sessions
// that held leases) in one JSON file, written atomically so a crash at any instant leaves
// either the old or the new file.
#pragma once

#include "registry.hpp"

#include <stdexcept>
#include <string>

namespace reaperd {

// A state file that exists but cannot be understood; what() names the file and the problem.
class StateCorrupt : public std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A state file that exists but could not be read (EACCES, EIO, a directory in its place):
// its content may be fine, so it is never set aside or rebuilt over; what() names the file
// and the error.
class StateUnreadable : public std::runtime_error {
    using std::runtime_error::runtime_error;
};

class StateStore {
public:
    // Uses <dir>/state.json; creates `dir` (and parents) if missing. Throws
    // std::runtime_error naming the directory when it cannot.
    explicit StateStore(std::string dir);
    const std::string& path() const noexcept { return path_; }

    // Reads the file; a missing file is an empty state. Throws StateCorrupt for content that
    // does not decode, StateUnreadable when the file cannot be read.
    PersistedState load() const;
    // Moves a corrupt file aside to <path>.corrupt-<UTC timestamp> and returns the new name.
    std::string set_aside(TimePoint now) const;
    // Writes temp file, fsync, rename over the old file, fsync the directory. Throws
    // std::runtime_error (with errno text) on failure; the old file is then untouched.
    void save(const PersistedState& state) const;

private:
    [[noreturn]] void throw_unreadable(int error) const;

    std::string dir_;
    std::string path_;
};

std::string encode_state(const PersistedState& state);
PersistedState decode_state(const std::string& text);  // throws StateCorrupt

}  // namespace reaperd
