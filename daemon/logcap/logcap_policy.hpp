// The pure half of the log caps: which containers' logs to act on and how, given their sizes,
// the config and who owns them; plus the small helpers the watcher uses (cap labels, how fast
// a log grows). No I/O and no clock here: the watcher (logcap.hpp) measures and passes
// everything in. Where the engine keeps a log is the engine's to say (engine_port.hpp).
#pragma once

#include "config.hpp"

#include <reaper/engine.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace reaperd::logcap {

// The label that overrides logs.max_size for one container ("0" exempts it from capping).
inline constexpr const char* max_size_label = "reaperd.log-max-size";

// ---- per-container cap ---------------------------------------------------------------------
struct CapSetting {
    std::uint64_t cap_bytes = 0;  // 0 = no cap of its own
    // The label said "0": this container is neither capped nor counted in the total budget.
    bool exempt = false;
    // The engine's own rotation keeps the log within cap_bytes (max-size x max-file, as the
    // proxy and the Session set at creation): no cut of its own, which would only break its
    // readers (a follower of a rotated json-file stalled after such a cut on 20.10 and 28.5);
    // it still counts in the total budget.
    bool engine_rotates = false;
    // The label's value when it did not parse (the default applies then); nullopt otherwise.
    std::optional<std::string> bad_label;
};

// The label wins over `default_cap_bytes` when it parses as a size as Docker reads its own
// log option `max-size` (reaper/units.hpp parse_docker_size: decimal, "10m" = 10,000,000
// bytes), since the label stands in for that option on containers created without it.
CapSetting resolve_cap(const reaper::Labels& labels, std::uint64_t default_cap_bytes);

// ---- growth rate and the mark --------------------------------------------------------------
// Estimates how fast a log keeps growing from the sizes seen at each check. A rate counts
// once two windows in a row show it (the lower of the two), so a single burst (a stack
// trace dumped at once) is not taken for a runaway and cut at a lowered mark. The estimate
// then follows a rise at once and decays with a half-life of 0.5 s, because
// underestimating a runaway is what makes a cap overshoot. A cut (the size going down)
// starts a new window and keeps the rate: the writer goes on.
class GrowthEstimator {
public:
    using Clock = std::chrono::steady_clock;
    void observe(std::uint64_t bytes, Clock::time_point now);
    double bytes_per_second() const { return rate_; }

private:
    // Sizes a few ms apart are too noisy (the writer runs in bursts of its scheduler slices);
    // measuring over at least this long keeps one burst from reading as a huge rate.
    static constexpr std::chrono::milliseconds min_window{20};
    bool started_ = false;
    std::uint64_t window_bytes_ = 0;
    Clock::time_point window_start_{};
    double last_window_rate_ = 0;
    double rate_ = 0;
};

// How long the capper allows between a log reaching its mark and being cut: its own check
// gap (at most 10 ms), plus the scheduler delay its thread sees on a busy machine (the
// writer, the shim and dockerd keep both cores busy while a runaway writes). On the 2-core
// test machine at a load average of 13, cuts came up to ~60 ms after the mark; 200 ms
// leaves a wide margin. For a writer at 70 MB/s this puts the mark at half the cap.
inline constexpr std::chrono::milliseconds reaction_budget{200};

// What a log growing at `bytes_per_second` adds during reaction_budget.
std::uint64_t headroom_for(double bytes_per_second);
// The size at which to act so that a log is cut before it passes `cap_bytes`: the cap minus
// its headroom, but never less than 9/16 of the cap. A cut keeps the newest half (keep_for),
// so the mark must stay above it, never cutting in a loop over what a cut just kept; 1/16 of
// the cap above it leaves the rest (7/16) as the margin a runaway may write between the mark
// and the cut. A mark at 3/4 left a quarter: a 2 MiB cap at 70-100 MB/s was passed by 56%
// on Docker 26.1 when the cut came 20 ms late. A runaway is then cut at about every check
// (2 MiB cap at 70 MB/s: every 2 ms, one fallocate each). A slow writer is cut at its cap.
std::uint64_t mark_for(std::uint64_t cap_bytes, std::uint64_t headroom_bytes);
// What a cut for the container's own cap keeps of the newest log: half the cap.
std::uint64_t keep_for(std::uint64_t cap_bytes);

// ---- the decision --------------------------------------------------------------------------
struct CapTarget {  // one watched container, as the decision sees it
    std::string id;
    bool owned = false;  // carries a session label
    CapSetting cap;
    std::uint64_t log_bytes = 0;       // live file plus its rotations, bytes on disk
    std::uint64_t headroom_bytes = 0;  // headroom_for(its growth rate)
    // Stopped or killed by the capper and not written since: it cannot grow, so it neither
    // needs acting on again nor counts toward the budget (its file stays, as the user chose
    // stop over truncate).
    bool halted = false;
    // A stop/kill/remove is in flight or was just tried: wait for its result.
    bool busy = false;
    // Known only from the capper's persisted list, not yet from the engine: a stop, kill or
    // remove needs the engine (the door inspects first), so it is truncated instead.
    bool local_only = false;
    // The live file's apparent size (st_size), which a punched cut leaves growing, and the
    // size past which it must not grow (apparent_limit_for); 0 = no limit known.
    std::uint64_t apparent_bytes = 0;
    std::uint64_t apparent_limit = 0;
    // The file system refused to punch this log's file once: it is cut by truncating.
    bool punch_refused = false;
};

// ---- how a cut is made ----------------------------------------------------------------------
// The default cut punches out the oldest part of the live file (fallocate PUNCH_HOLE |
// KEEP_SIZE): the blocks are freed while the apparent size and every offset stay, which is
// what keeps Docker 23+'s json-file readers working (they take the bytes written, not the
// file's size, as its end: a truncate leaves a follower waiting for good and `--tail`
// spinning a core). Truncating to 0 is the fallback where the file system refuses a punch,
// and the one cut made as the apparent size nears the file system's largest file.
struct CutPlan {
    CutMethod method = CutMethod::punch_hole;
    // The newest bytes to keep (the live file's newest part, then the newest rotations that
    // fit); older rotations are deleted, oldest first, before the live file is cut.
    std::uint64_t keep_bytes = 0;
    // The truncate is made because the apparent size reached target.apparent_limit.
    bool at_size_limit = false;
};
CutPlan plan_cut(const CapTarget& target, std::uint64_t keep_bytes);

// The apparent size past which a punched log is cut by truncating, for a file system whose
// largest file is `max_file_bytes`: three quarters of it. The apparent size of a log punched
// again and again grows with every byte written; ext4's largest file (2^32 blocks: 16 TiB at
// 4 KiB) is reached after ~2.6 days of `yes` at 70 MB/s, and past it the engine's writes fail
// (EFBIG) and the container's log is lost. At 3/4 one truncate (breaking Docker 23+'s
// followers of that container once, with a warning) comes ~16 h of `yes` before the limit,
// and still ~70 min before it at 1 GB/s. 0 = no limit known.
std::uint64_t apparent_limit_for(std::uint64_t max_file_bytes);

// CapReason, why it acts, is a vocabulary: vocabulary.hpp.

struct CapDecision {
    std::size_t target = 0;  // index into the targets given
    LogAction action = LogAction::truncate;
    CapReason reason = CapReason::own_cap;
    CutPlan cut;  // for LogAction::truncate: how
};

// What to do now. A target over its mark gets the configured action; when the total budget
// (logs.total_max_size) would be passed, the largest remaining logs are acted on until the
// rest fits. An unowned or local_only target is only ever truncated, whatever logs.action
// says, and an unowned one with scope `sessions` is not acted on at all: reaperd never
// stops, kills or removes a container it does not own by label. A cut for its own cap keeps
// keep_for(cap); one for the budget keeps the smaller of that and an even share of half the
// budget, and the budget counts what each cut keeps as still there.
std::vector<CapDecision> decide(const std::vector<CapTarget>& targets, const LogsConfig& config);

}  // namespace reaperd::logcap
