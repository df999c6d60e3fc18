#include "reaper.hpp"

#include <algorithm>

namespace reaperd {

ReapResult reap_once(Guard& guard, const ReapJob& job) {
    if (job.object) return {job.container, guard.act(ObjectRequest{*job.object, job.expect, job.reason}), job.object};
    GuardRequest request;
    request.container = job.container;
    request.act = ContainerAct::remove;
    request.expect = job.expect;
    request.reason = job.reason;
    return {job.container, guard.act(request), std::nullopt};
}

ReaperPool::ReaperPool(Guard& guard, unsigned workers, ResultSink sink)
    : guard_(guard), sink_(std::move(sink)) {
    workers = std::max(1u, workers);
    for (unsigned i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
}

ReaperPool::~ReaperPool() { stop(); }

void ReaperPool::submit(ReapJob job) {
    {
        std::lock_guard lock(mutex_);
        if (stopping_) return;
        queue_.push_back(std::move(job));
    }
    wake_.notify_one();
}

std::vector<ReapJob> ReaperPool::drain_queue() {
    std::lock_guard lock(mutex_);
    std::vector<ReapJob> jobs(std::make_move_iterator(queue_.begin()),
                              std::make_move_iterator(queue_.end()));
    queue_.clear();
    return jobs;
}

void ReaperPool::stop() {
    {
        std::lock_guard lock(mutex_);
        stopping_ = true;
        queue_.clear();
    }
    wake_.notify_all();
    for (auto& t : threads_)
        if (t.joinable()) t.join();
    threads_.clear();
}

void ReaperPool::work() {
    for (;;) {
        ReapJob job;
        {
            std::unique_lock lock(mutex_);
            wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
            if (stopping_) return;
            job = std::move(queue_.front());
            queue_.pop_front();
        }
        sink_(reap_once(guard_, job));
    }
}

}  // namespace reaperd
