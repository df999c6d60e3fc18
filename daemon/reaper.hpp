// The reaper: a pool of worker threads that each make one removal attempt per job, through
// the guarded door (guard.hpp), and report the outcome. Retrying, backoff and bookkeeping
// stay with the main loop; a worker only ever asks the door about the one container (or
// network, or volume) of its job, by the id the loop pinned.
#pragma once

#include "guard.hpp"

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace reaperd {

struct ReapJob {
    std::string container;  // the full id (unset when `object` is set)
    Expectation expect;     // what the loop knows: the session, and whether it is alive
    ReapReason reason = ReapReason::session_ended;
    std::optional<ObjectRef> object;  // set: remove this network or volume, not a container
};

struct ReapResult {
    std::string container;
    GuardResult result;
    std::optional<ObjectRef> object;  // as in the job
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
