#include "reaper.hpp"

#include "registry.hpp"

#include <algorithm>
#include <cctype>

namespace reaperd {

namespace {
bool removal_in_progress(const reaper::EngineError& e) {
    std::string text = e.engine_message().empty() ? e.what() : e.engine_message();
    std::transform(text.begin(), text.end(), text.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return text.find("already in progress") != std::string::npos;
}

std::string describe(const reaper::EngineError& e) {
    std::string text = std::string(reaper::to_string(e.kind()));
    if (e.status()) text += " " + std::to_string(e.status());
    text += ": ";
    text += e.engine_message().empty() ? e.what() : e.engine_message();
    return text;
}
}  // namespace

const char* to_string(ReapOutcome outcome) {
    switch (outcome) {
        case ReapOutcome::removed: return "removed";
        case ReapOutcome::gone: return "gone";
        case ReapOutcome::in_progress: return "in_progress";
        case ReapOutcome::not_owned: return "not_owned";
        case ReapOutcome::failed: return "failed";
    }
    return "failed";
}

ReapResult reap_once(reaper::Engine& engine, const ReapJob& job) {
    ReapResult result;
    result.container = job.container;
    try {
        reaper::ContainerInfo info;
        try {
            info = engine.inspect(job.container);
        } catch (const reaper::NotFound&) {
            result.outcome = ReapOutcome::gone;
            return result;
        }
        if (!owning_session(info.labels, job.label_keys)) {
            result.outcome = ReapOutcome::not_owned;
            return result;
        }
        if (info.state.status == "removing") {
            result.outcome = ReapOutcome::in_progress;
            return result;
        }
        reaper::RemoveOptions options;
        options.force = true;
        options.volumes = true;
        // Remove by the full id from inspect: a name could have been reused meanwhile.
        engine.remove(info.id.empty() ? job.container : info.id, options);
        result.outcome = ReapOutcome::removed;
    } catch (const reaper::NotFound&) {
        result.outcome = ReapOutcome::gone;
    } catch (const reaper::EngineError& e) {
        if (e.kind() == reaper::EngineErrorKind::Conflict && removal_in_progress(e)) {
            result.outcome = ReapOutcome::in_progress;
        } else {
            result.outcome = ReapOutcome::failed;
            result.error = describe(e);
        }
    } catch (const std::exception& e) {
        result.outcome = ReapOutcome::failed;
        result.error = e.what();
    }
    return result;
}

ReaperPool::ReaperPool(reaper::Engine& engine, unsigned workers, ResultSink sink)
    : engine_(engine), sink_(std::move(sink)) {
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
        sink_(reap_once(engine_, job));
    }
}

}  // namespace reaperd
