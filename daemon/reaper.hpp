// The reaper: a pool of worker threads that each make one removal attempt per job and
// report the outcome. Retrying, backoff and bookkeeping stay with the main loop; a worker
// only ever touches the one container of its job, and only if it still carries an
// ownership label.
#pragma once

#include <reaper/engine.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace reaperd {

struct ReapJob {
    std::string container;
    std::vector<std::string> label_keys;  // sessions.labels when the job was made
};

enum class ReapOutcome {
    removed,      // force-removed (with anonymous volumes) by this attempt
    gone,         // 404 at inspect or remove: someone else removed it; done
    in_progress,  // the engine is already removing it: look again shortly
    not_owned,    // it carries no ownership label: left alone, never to be touched
    failed,       // anything else: retry with backoff
};
const char* to_string(ReapOutcome outcome);

struct ReapResult {
    std::string container;
    ReapOutcome outcome = ReapOutcome::failed;
    std::string error;  // for failed: the engine's error text
};

// One attempt, synchronously: inspect (re-checking the ownership label), then
// remove(force, volumes). Never throws.
ReapResult reap_once(reaper::Engine& engine, const ReapJob& job);

class ReaperPool {
public:
    using ResultSink = std::function<void(ReapResult)>;

    // Starts `workers` threads (at least 1); every finished attempt goes to `sink`, called
    // on a worker thread.
    ReaperPool(reaper::Engine& engine, unsigned workers, ResultSink sink);
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

    reaper::Engine& engine_;
    ResultSink sink_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::deque<ReapJob> queue_;
    bool stopping_ = false;
    std::vector<std::thread> threads_;
};

}  // namespace reaperd
