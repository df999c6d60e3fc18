#include "reaper.hpp"

#include <algorithm>

namespace reaperd {

PaceConfig PaceConfig::from(const Config& config) {
    PaceConfig pace;
    pace.max_limit = std::max(1u, config.reaper.concurrency);
    pace.slow_answer = std::min(pace.slow_answer, config.engine.request_timeout / 2);
    return pace;
}

RemovalPace::RemovalPace(PaceConfig config)
    : config_(config),
      window_(static_cast<double>(std::max(1u, config.max_limit))),
      threshold_(window_) {}

unsigned RemovalPace::limit() const {
    if (silent_) return 1;
    return std::clamp(static_cast<unsigned>(window_), 1u, std::max(1u, config_.max_limit));
}

void RemovalPace::sent(TimePoint now) { sent_.insert(now); }

void RemovalPace::forget_sent(TimePoint sent) {
    if (auto it = sent_.find(sent); it != sent_.end()) sent_.erase(it);
}

void RemovalPace::trim(TimePoint now) {
    const TimePoint horizon = now - config_.window;
    while (!timeouts_.empty() && timeouts_.front() < horizon) timeouts_.pop_front();
    while (!answers_.empty() && answers_.front().first < horizon) answers_.pop_front();
}

bool RemovalPace::answered(TimePoint sent, TimePoint now) {
    forget_sent(sent);
    trim(now);
    const Duration latency = std::max(Duration{0}, std::chrono::duration_cast<Duration>(now - sent));
    answers_.emplace_back(now, latency);
    smoothed_ = smoothed_ ? *smoothed_ + (latency - *smoothed_) / 8 : latency;
    const bool recovered = silent_;
    silent_ = false;
    if (recovered) back_since_ = now;
    const double max = static_cast<double>(std::max(1u, config_.max_limit));
    // An attempt sent before the engine came back waited out the silence: its latency says
    // how long the stall lasted, not how fast the engine is now (counted as slow, the probe
    // that ends a 60 s stall would halve the limit it is to slow-start from).
    const bool measures_now = !back_since_ || sent >= *back_since_;
    if (latency > config_.slow_answer && measures_now) {
        // Once per slow_answer at most: the answers of one congested round all come slow,
        // and each halving would otherwise count the same congestion again.
        if (!last_decrease_ || now - *last_decrease_ >= config_.slow_answer) {
            threshold_ = std::max(1.0, window_ / 2);
            window_ = threshold_;
            last_decrease_ = now;
        }
    } else if (window_ < threshold_) {
        window_ = std::min(window_ + 1, max);
    } else {
        window_ = std::min(window_ + 1 / window_, max);
    }
    return recovered;
}

void RemovalPace::timed_out(TimePoint sent, TimePoint now) {
    forget_sent(sent);
    trim(now);
    timeouts_.push_back(now);
    ++timeouts_total_;
    if (silent_) return;
    // Half of what worked is where slow start stops once the engine answers again; the
    // timeouts that follow in the same silence say nothing new about that.
    threshold_ = std::max(2.0, window_ / 2);
    window_ = 1;
    silent_ = true;
    last_decrease_ = now;
}

void RemovalPace::abandoned(TimePoint sent) { forget_sent(sent); }

EnginePace RemovalPace::pace(TimePoint now) const {
    if (silent_) return EnginePace::slow;
    const TimePoint horizon = now - config_.window;
    for (auto it = timeouts_.rbegin(); it != timeouts_.rend(); ++it)
        if (*it >= horizon) return EnginePace::slow;
    for (auto it = answers_.rbegin(); it != answers_.rend() && it->first >= horizon; ++it)
        if (it->second > config_.slow_answer) return EnginePace::slow;
    if (!sent_.empty() && now - *sent_.begin() > config_.slow_answer) return EnginePace::slow;
    return EnginePace::normal;
}

std::optional<TimePoint> RemovalPace::next_change(TimePoint now) const {
    std::optional<TimePoint> next;
    const auto consider = [&](TimePoint t) {
        if (t > now && (!next || t < *next)) next = t;
    };
    if (!timeouts_.empty()) consider(timeouts_.back() + config_.window);
    for (const auto& [at, latency] : answers_)
        if (latency > config_.slow_answer) consider(at + config_.window);
    if (!sent_.empty()) consider(*sent_.begin() + config_.slow_answer + Duration{1});
    return next;
}

RemovalPace::Figures RemovalPace::figures(TimePoint now) const {
    Figures f;
    f.limit = limit();
    f.in_flight = in_flight();
    f.timeouts_total = timeouts_total_;
    const TimePoint horizon = now - config_.window;
    f.timeouts_recent = static_cast<std::size_t>(
        std::count_if(timeouts_.begin(), timeouts_.end(), [&](TimePoint t) { return t >= horizon; }));
    f.latency = smoothed_.value_or(Duration{0});
    for (const auto& [at, latency] : answers_)
        if (at >= horizon) f.latency_max_recent = std::max(f.latency_max_recent, latency);
    if (!sent_.empty()) f.oldest_in_flight = std::chrono::duration_cast<Duration>(now - *sent_.begin());
    return f;
}

ReapResult reap_once(Guard& guard, const ReapJob& job) {
    if (job.object)
        return {job.container, guard.act(ObjectRequest{*job.object, job.expect, job.reason}), job.object, job.sent};
    GuardRequest request;
    request.container = job.container;
    request.act = ContainerAct::remove;
    request.expect = job.expect;
    request.reason = job.reason;
    return {job.container, guard.act(request), std::nullopt, job.sent};
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
