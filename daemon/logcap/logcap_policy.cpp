#include "logcap_policy.hpp"

#include <reaper/units.hpp>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace reaperd::logcap {

CapSetting resolve_cap(const reaper::Labels& labels, std::uint64_t default_cap_bytes) {
    CapSetting setting;
    setting.cap_bytes = default_cap_bytes;
    auto label = labels.find(max_size_label);
    if (label == labels.end()) return setting;
    try {
        setting.cap_bytes = reaper::parse_docker_size(label->second);
        setting.exempt = setting.cap_bytes == 0;
    } catch (const std::exception&) {
        setting.bad_label = label->second;
    }
    return setting;
}

void GrowthEstimator::observe(std::uint64_t bytes, Clock::time_point now) {
    if (!started_ || bytes < window_bytes_) {
        started_ = true;
        window_bytes_ = bytes;
        window_start_ = now;
        return;
    }
    auto elapsed = now - window_start_;
    if (elapsed < min_window) return;
    double seconds = std::chrono::duration<double>(elapsed).count();
    double measured = static_cast<double>(bytes - window_bytes_) / seconds;
    double sustained = std::min(measured, last_window_rate_);
    last_window_rate_ = measured;
    // Up at once; down with a half-life of half a second, so a runaway whose writes come
    // in scheduler-sized bursts on a busy machine keeps its rate between bursts.
    double keep = std::pow(0.5, seconds / 0.5);
    rate_ = sustained >= rate_ ? sustained : sustained + keep * (rate_ - sustained);
    window_bytes_ = bytes;
    window_start_ = now;
}

std::uint64_t headroom_for(double bytes_per_second) {
    return static_cast<std::uint64_t>(bytes_per_second *
                                      std::chrono::duration<double>(reaction_budget).count());
}

std::uint64_t mark_for(std::uint64_t cap_bytes, std::uint64_t headroom_bytes) {
    return cap_bytes - std::min(cap_bytes / 16 * 7, headroom_bytes);
}

std::uint64_t keep_for(std::uint64_t cap_bytes) { return cap_bytes / 2; }

CutPlan plan_cut(const CapTarget& target, std::uint64_t keep_bytes) {
    CutPlan plan;
    plan.keep_bytes = keep_bytes;
    plan.at_size_limit = target.apparent_limit > 0 && target.apparent_bytes >= target.apparent_limit;
    if (target.punch_refused || plan.at_size_limit) plan.method = CutMethod::truncate;
    return plan;
}

std::uint64_t apparent_limit_for(std::uint64_t max_file_bytes) { return max_file_bytes / 4 * 3; }

std::vector<CapDecision> decide(const std::vector<CapTarget>& targets, const LogsConfig& config) {
    std::vector<CapDecision> decisions;
    std::vector<bool> acted(targets.size(), false);
    auto in_scope = [&](const CapTarget& t) {
        return (t.owned || config.scope == LogScope::all) && !t.cap.exempt;
    };
    // The one place the action is chosen: unowned containers, and those the engine has not
    // described yet, are only ever truncated.
    auto action_for = [&](const CapTarget& t) {
        return t.owned && !t.local_only ? config.action : LogAction::truncate;
    };

    for (std::size_t i = 0; i < targets.size(); ++i) {
        const auto& t = targets[i];
        if (!in_scope(t) || t.halted || t.busy || t.cap.cap_bytes == 0 || t.cap.engine_rotates) continue;
        if (t.log_bytes >= mark_for(t.cap.cap_bytes, t.headroom_bytes)) {
            decisions.push_back({i, action_for(t), CapReason::own_cap, plan_cut(t, keep_for(t.cap.cap_bytes))});
            acted[i] = true;
        }
    }

    if (config.total_max_size_bytes == 0) return decisions;
    // What the logs will hold within the reaction budget: every growing log (acted-on ones
    // keep what their cut keeps), plus their headroom, which like a single cap's is at most
    // half the budget.
    std::uint64_t projected = 0;
    std::uint64_t headroom = 0;
    std::uint64_t in_budget = 0;
    std::vector<std::size_t> candidates;
    for (std::size_t i = 0; i < targets.size(); ++i) {
        const auto& t = targets[i];
        if (!in_scope(t) || t.halted) continue;
        ++in_budget;
        headroom += t.headroom_bytes;
        if (acted[i]) {
            projected += std::min(t.log_bytes, keep_for(t.cap.cap_bytes));
            continue;
        }
        projected += t.log_bytes;
        if (!t.busy) candidates.push_back(i);
    }
    projected += std::min(config.total_max_size_bytes / 2, headroom);
    if (projected < config.total_max_size_bytes) return decisions;
    std::stable_sort(candidates.begin(), candidates.end(), [&](std::size_t a, std::size_t b) {
        return targets[a].log_bytes > targets[b].log_bytes;
    });
    const std::uint64_t share = config.total_max_size_bytes / 2 / in_budget;
    for (auto i : candidates) {
        if (projected < config.total_max_size_bytes) break;
        const auto& t = targets[i];
        const std::uint64_t keep = t.cap.cap_bytes > 0 ? std::min(share, keep_for(t.cap.cap_bytes)) : share;
        const auto action = action_for(t);
        decisions.push_back({i, action, CapReason::total_budget, plan_cut(t, keep)});
        // A stop, kill or remove halts the container, which then leaves the budget.
        projected -= action == LogAction::truncate ? t.log_bytes - std::min(t.log_bytes, keep) : t.log_bytes;
    }
    return decisions;
}

}  // namespace reaperd::logcap
