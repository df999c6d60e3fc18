// The daemon's persisted state (pending reaps, lease-grace deadlines, tombstones, sessions
// that held leases): a snapshot, <dir>/state.json, and beside it a journal of the changes
// since, <dir>/state.journal, so that a save costs what changed, not what is held.
//
// - state.json is written whole (temp file, fsync, rename, fsync of the dir), so a crash at
//   any instant leaves the old or the new one. It carries a random "generation".
// - state.journal starts with a header naming that generation, then one JSON line per change:
//   {"session":{...}} (a session's persisted form), {"forget":"<id>"}, {"pending":{...}},
//   {"done":"<container>"}. Each save appends its lines in one write and fdatasync()s them.
//   A crash mid-append leaves a torn last line: load() skips it and says so in
//   PersistedState::warnings. A journal whose header names another generation (a crash
//   between the two renames of a compaction) is stale: its changes are in the snapshot.
// - When the journal passes a quarter of the snapshot's size (at least 64 KiB), the next
//   save compacts: a new snapshot, then a fresh journal. With 100,000 tombstones (9.7 MB)
//   that is one save in ~23,000; the others cost one short write and one fdatasync.
// A state.json of the previous version (no generation, no journal) loads as it is.
#pragma once

#include "registry.hpp"
#include "unique_fd.hpp"

#include <cstdint>
#include <map>
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
    // Compact when the journal passes a quarter of the snapshot, and never below this. A
    // journal line costs more to load than a snapshot entry (each is parsed on its own): at
    // half, the 4.8 MB journal beside 100,000 tombstones took the load to 1.4 s
    // (bench/tombstone_bench).
    static constexpr std::uint64_t default_min_journal_bytes = 64 * 1024;

    // Uses <dir>/state.json and <dir>/state.journal; creates `dir` (and parents) if missing.
    // Throws std::runtime_error naming the directory when it cannot. `min_journal_bytes` is
    // the journal size below which it is never compacted (tests lower it to reach a compaction
    // in tens of appends rather than 800 fdatasyncs).
    explicit StateStore(std::string dir, std::uint64_t min_journal_bytes = default_min_journal_bytes);
    ~StateStore();
    StateStore(const StateStore&) = delete;
    StateStore& operator=(const StateStore&) = delete;

    const std::string& path() const noexcept { return path_; }
    const std::string& journal_path() const noexcept { return journal_path_; }

    // Reads the snapshot and replays the journal; missing files are an empty state. Throws
    // StateCorrupt for content that does not decode (a torn last journal line is not: it is
    // skipped with a warning), StateUnreadable when a file cannot be read.
    // Times come back on the loop's clock: the file's wall times less `wall_offset`, the
    // wall clock's lead over the loop's clock now (registry.hpp, steady_now()).
    PersistedState load(Clock::duration wall_offset = {}) const;
    // Moves a corrupt snapshot aside to <path>.corrupt-<UTC timestamp> (and the journal, if
    // any, to <journal_path>.corrupt-<stamp>) and returns the snapshot's new name.
    std::string set_aside(TimePoint wall_now) const;
    // Writes `state` as a new snapshot and starts an empty journal after it. Throws
    // std::runtime_error (with errno text) on failure; what was on disk then still loads.
    // Times are written as wall time: the loop's times plus `wall_offset`, as for load().
    void save(const PersistedState& state, Clock::duration wall_offset = {});
    // Persists what changed in `registry` since the last save: the sessions it noted in
    // changed_sessions (cleared on success) and the pending reaps that differ from the last
    // saved ones, appended to the journal; or a compaction (save(registry.persisted())) when
    // this store has not written a snapshot yet, the journal is due for one, or an append
    // failed before. Throws std::runtime_error on failure; nothing is lost from memory then,
    // and the next call writes it all.
    void save_changes(Registry& registry, Clock::duration wall_offset = {});

    struct Stats {
        std::uint64_t snapshot_bytes = 0;
        std::uint64_t journal_bytes = 0;   // header included
        std::uint64_t journal_records = 0;
        std::uint64_t compactions = 0;     // snapshots written by this store
    };
    const Stats& stats() const noexcept { return stats_; }

private:
    PersistedState read_files() const;  // load() with the file's times as they are
    [[noreturn]] void throw_unreadable(const std::string& path, int error) const;
    void close_journal() noexcept;

    std::string dir_;
    std::string path_;
    std::string journal_path_;
    std::uint64_t min_journal_bytes_;
    reaper::detail::UniqueFd journal_fd_;  // open for appends after this store's last snapshot
    bool needs_snapshot_ = true;   // no snapshot written yet, or an append failed
    std::map<std::string, PendingReap> saved_pending_;  // as the disk has them, by container
    Stats stats_;
};

std::string encode_state(const PersistedState& state);
PersistedState decode_state(const std::string& text);  // throws StateCorrupt

}  // namespace reaperd
