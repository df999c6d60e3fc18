#include "policy.hpp"

#include <algorithm>
#include <set>

namespace reaperd {

namespace {
void wake_at(Decision& d, TimePoint t) {
    if (!d.next_wake || t < *d.next_wake) d.next_wake = t;
}
}  // namespace

Decision decide(const Registry& registry, const Config& config, TimePoint now) {
    Decision d;
    const SessionsConfig& sc = config.sessions;

    std::set<std::string> ended;
    for (const auto& [id, s] : registry.sessions) {
        switch (s.state()) {
            case SessionState::ended: {
                TimePoint expiry = *s.ended_at + sc.tombstone_ttl;
                if (expiry <= now) {
                    d.forget.push_back(id);
                } else {
                    ended.insert(id);
                    wake_at(d, expiry);
                }
                break;
            }
            case SessionState::grace:
                if (*s.grace_deadline <= now) {
                    d.end.push_back({id, "lease_expired"});
                    ended.insert(id);
                } else {
                    wake_at(d, *s.grace_deadline);
                }
                break;
            case SessionState::leased:
                break;
            case SessionState::unclaimed: {
                std::size_t owned = registry.containers_of(id);
                if (owned == 0) {
                    d.forget.push_back(id);
                } else if (sc.unclaimed_grace.count() > 0 && !s.ever_leased) {
                    TimePoint deadline = s.first_seen + sc.unclaimed_grace;
                    if (deadline <= now) {
                        d.end.push_back({id, "unclaimed"});
                        ended.insert(id);
                    } else {
                        wake_at(d, deadline);
                    }
                }
                break;
            }
        }
    }

    for (const auto& [id, known] : registry.containers) {
        if (!known.session) continue;  // the ownership rule: never anything unlabeled
        if (registry.pending.count(id)) continue;
        if (config.reaper.dry_run && registry.would_reap_logged.count(id)) continue;
        if (ended.count(*known.session)) {
            d.reap.push_back({id, known.info.name, *known.session, "session_ended"});
            continue;
        }
        Duration max_age = known.max_age.value_or(sc.max_age);
        if (max_age.count() > 0) {
            TimePoint deadline = known.created + max_age;
            if (deadline <= now)
                d.reap.push_back({id, known.info.name, *known.session, "max_age"});
            else
                wake_at(d, deadline);
        }
    }

    if (!config.reaper.dry_run) {
        for (const auto& [id, reap] : registry.pending) {
            if (reap.in_flight) continue;
            if (reap.next_attempt <= now)
                d.attempt.push_back(id);
            else
                wake_at(d, reap.next_attempt);
        }
    }
    return d;
}

Expectation expectation_for(const PendingReap& reap, const Registry& registry) {
    Expectation expect;
    if (!reap.session.empty()) expect.session = reap.session;
    if (reap.reason == "session_ended") {
        auto it = registry.sessions.find(reap.session);
        if (it != registry.sessions.end()) {
            SessionState state = it->second.state();
            expect.session_alive = state == SessionState::leased || state == SessionState::grace;
        }
    }
    return expect;
}

Duration retry_delay(unsigned failures, Duration initial, Duration max, double jitter) {
    if (failures == 0) return Duration{0};
    Duration delay = initial;
    for (unsigned i = 1; i < failures && delay < max; ++i) delay *= 2;
    delay = std::min(delay, max);
    jitter = std::clamp(jitter, 0.0, 1.0);
    return Duration{static_cast<Duration::rep>(delay.count() * (0.5 + 0.5 * jitter))};
}

}  // namespace reaperd
