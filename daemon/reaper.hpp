// The reaper: a pool of worker threads that each make one removal attempt per job, through
// the guarded door (guard.hpp), and report the outcome; and the pace (RemovalPace) that says
// how many attempts the loop may keep in flight. Retrying, backoff and bookkeeping stay with
// the main loop; a worker only ever asks the door about the one container (or network, or
// volume) of its job, by the id the loop pinned.
#pragma once

#include "guard.hpp"
#include "registry.hpp"  // Duration, TimePoint

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace reaperd {

struct ReapJob {
    std::string container;  // the full id (unset when `object` is set)
    Expectation expect;     // what the loop knows: the session, and whether it is alive
    ReapReason reason = ReapReason::session_ended;
    std::optional<ObjectRef> object;  // set: remove this network or volume, not a container
    TimePoint sent{};       // when the loop submitted it (its clock), handed back in the result
};

struct ReapResult {
    std::string container;
    GuardResult result;
    std::optional<ObjectRef> object;  // as in the job
    TimePoint sent{};                 // as in the job
};

// ---- the pace of removals ------------------------------------------------------------------
// How many removal attempts the loop keeps in flight, fitted to what the engine delivers, as
// TCP fits its window (AIMD): one more per answer up to half the limit that last worked
// (slow start), then one more per `limit` answers; halved on an answer slower than
// slow_answer (not for an attempt sent before the engine came back from a silence, which
// measures the silence); down to a single probe at the first attempt the engine did not
// answer within its request timeout, until an answer comes. So a stalled engine holds at
// most the attempts that were in flight when it stalled, never a pile of new ones (issue 23:
// with 16 fixed, 168 reaps each waited out the 30 s timeout on a stalling engine while the
// backlog grew to 956). Pure: events and the loop's `now` in, the limit and the figures out;
// no clock, no I/O.
struct PaceConfig {
    unsigned max_limit = 16;  // reaper.concurrency
    // An answer slower than this is congestion. A force-remove takes 20-200 ms here, and
    // 0.8 s at its p99 under scripts/load.sh at 94% of the engine's measured rate.
    Duration slow_answer{std::chrono::seconds{2}};
    // The engine is "slow" while a timeout or a slow answer is this recent, or an attempt has
    // been in flight longer than slow_answer.
    Duration window{std::chrono::seconds{10}};

    // From the config: reaper.concurrency, and slow_answer at most half engine.request_timeout.
    static PaceConfig from(const Config& config);
};

enum class EnginePace { normal, slow };

class RemovalPace {
public:
    explicit RemovalPace(PaceConfig config = {});

    unsigned limit() const;  // attempts allowed in flight now (at least 1)
    std::size_t in_flight() const { return sent_.size(); }
    bool may_send() const { return in_flight() < limit(); }
    void sent(TimePoint now);
    // The attempt sent at `sent` ended with an answer from the engine (any answer: removed,
    // gone, refused, an error status). True when it is the first answer after the engine
    // answered nothing: the engine is back, and the caller catches up (relist, retries due).
    bool answered(TimePoint sent, TimePoint now);
    // The attempt sent at `sent` got no answer within the engine's request timeout.
    void timed_out(TimePoint sent, TimePoint now);
    // The attempt sent at `sent` ended without reaching the engine's pace (the daemon stops,
    // the queue was dropped): it only leaves the in-flight count.
    void abandoned(TimePoint sent);

    EnginePace pace(TimePoint now) const;
    // When pace(now) changes by time alone (a window passes, an attempt in flight becomes
    // slow), if it will: for the loop's wake-up.
    std::optional<TimePoint> next_change(TimePoint now) const;

    struct Figures {
        unsigned limit = 0;
        std::size_t in_flight = 0;
        std::uint64_t timeouts_total = 0;
        std::size_t timeouts_recent = 0;  // within the window
        Duration latency{0};              // smoothed over answers (1/8 per answer, as TCP's SRTT)
        Duration latency_max_recent{0};   // the slowest answer within the window
        Duration oldest_in_flight{0};     // how long the longest-waiting attempt has waited
    };
    Figures figures(TimePoint now) const;

private:
    void forget_sent(TimePoint sent);
    void trim(TimePoint now);  // drops what is older than the window

    PaceConfig config_;
    double window_;    // the congestion window: limit() is its whole part
    double threshold_; // slow start below it, one per window above
    bool silent_ = false;  // the last attempt to end was not answered: one probe at a time
    std::optional<TimePoint> last_decrease_;
    std::optional<TimePoint> back_since_;  // when the last silence ended
    std::multiset<TimePoint> sent_;            // attempts in flight, by when they were sent
    std::deque<TimePoint> timeouts_;           // within the window
    std::deque<std::pair<TimePoint, Duration>> answers_;  // when, and how long: within the window
    std::uint64_t timeouts_total_ = 0;
    std::optional<Duration> smoothed_;
};

// One attempt, synchronously: the door's force-remove (with anonymous volumes) of the
// container, or its remove of the network or volume. Never throws.
ReapResult reap_once(Guard& guard, const ReapJob& job);

class ReaperPool {
public:
    using ResultSink = std::function<void(ReapResult)>;

    // Starts `workers` threads (at least 1); every finished attempt goes to `sink`, called
    // on a worker thread.
    ReaperPool(Guard& guard, unsigned workers, ResultSink sink);
    ~ReaperPool();  // stop()
    ReaperPool(const ReaperPool&) = delete;
    ReaperPool& operator=(const ReaperPool&) = delete;

    void submit(ReapJob job);
    // Jobs queued but not started: dropped and returned (they stay pending in the loop).
    std::vector<ReapJob> drain_queue();
    // Finishes the attempts in progress, drops the queue, joins the workers. Idempotent.
    void stop();

private:
    void work();

    Guard& guard_;
    ResultSink sink_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::deque<ReapJob> queue_;
    bool stopping_ = false;
    std::vector<std::thread> threads_;
};

}  // namespace reaperd
