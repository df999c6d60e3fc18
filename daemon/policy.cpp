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

    // Tombstones: the expired ones are the oldest (one TTL for all), so they and the next
    // expiry come from the front of the age order; the rest are never walked. Per turn this
    // costs O(expired + live sessions + containers), whatever the number held: at 127,000
    // tombstones the walk of every session made an `end` over the socket take 88 ms.
    const auto& by_age = registry.tombstones_by_age();
    auto kept_from = by_age.begin();  // the oldest tombstone not expired
    for (; kept_from != by_age.end(); ++kept_from) {
        const TimePoint expiry = deadline_of(*registry.tombstone(*kept_from->second), sc);
        if (expiry > now) {
            wake_at(d, expiry);
            break;
        }
        d.forget.push_back(*kept_from->second);
    }
    const std::size_t expired = d.forget.size();
    // Ended and not expired: a tombstone kept this turn, or a session that ends in it.
    std::set<std::string> ending;
    const auto ended = [&](const std::string& id) {
        if (const Tombstone* t = registry.tombstone(id)) return deadline_of(*t, sc) > now;
        return ending.count(id) > 0;
    };

    for (const auto& [id, s] : registry.sessions) {
        if (registry.tombstone(id)) continue;  // an ended session's record: its tombstone decides
        switch (s.record_state()) {
            case SessionState::grace: {
                const TimePoint deadline = *deadline_of(s, sc);
                if (deadline <= now) {
                    d.end.push_back({id, EndReason::lease_expired});
                    ending.insert(id);
                } else {
                    wake_at(d, deadline);
                }
                break;
            }
            case SessionState::leased:
            case SessionState::ended:
                break;
            case SessionState::unclaimed: {
                std::size_t owned = registry.containers_of(id) +
                                    registry.objects_of(id, ObjectKind::network) +
                                    registry.objects_of(id, ObjectKind::volume);
                if (owned == 0) {
                    d.forget.push_back(id);
                } else if (const auto deadline = deadline_of(s, sc)) {
                    if (*deadline <= now) {
                        d.end.push_back({id, EndReason::unclaimed});
                        ending.insert(id);
                    } else {
                        wake_at(d, *deadline);
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
        if (ended(*known.session)) {
            d.reap.push_back({id, known.info.name, *known.session, ReapReason::session_ended});
            continue;
        }
        Duration max_age = known.max_age.value_or(sc.max_age);
        if (max_age.count() > 0) {
            TimePoint deadline = known.created + max_age;
            if (deadline <= now)
                d.reap.push_back({id, known.info.name, *known.session, ReapReason::max_age});
            else
                wake_at(d, deadline);
        }
    }

    // Networks and volumes: once their ended session has no container left, known or
    // pending a reap (a reap restored at start-up counts before the first list). The watcher
    // reports a list's containers before its networks and volumes, so by the time an object
    // is known here its session's containers are too.
    std::set<std::string> with_containers;
    for (const auto& [id, known] : registry.containers)
        if (known.session && ended(*known.session)) with_containers.insert(*known.session);
    for (const auto& [id, reap] : registry.pending) with_containers.insert(reap.session);
    for (const auto& [ref, known] : registry.objects) {
        if (!known.session) continue;  // the ownership rule, for networks and volumes too
        if (!ended(*known.session) || with_containers.count(*known.session)) continue;
        if (registry.pending_objects.count(ref)) continue;
        if (config.reaper.dry_run && registry.would_remove_logged.count(ref)) continue;
        d.remove.push_back({ref, known.name, *known.session});
    }

    // Too many tombstones (any user of the control socket may end any id): forget the oldest.
    // One whose session still has something left is kept, over the limit, because it is what
    // reaps that: forgotten, its containers would belong to an unclaimed session and be
    // left alone. It becomes evictable once they are gone, and goes at the next decision.
    const std::size_t kept = registry.tombstones().size() - expired;
    if (kept > sc.max_tombstones) {
        std::size_t excess = kept - sc.max_tombstones;
        std::set<std::string> busy;
        for (const auto& [id, known] : registry.containers)
            if (known.session) busy.insert(*known.session);
        for (const auto& [id, reap] : registry.pending) busy.insert(reap.session);
        for (const auto& [ref, known] : registry.objects)
            if (known.session) busy.insert(*known.session);
        for (const auto& [ref, removal] : registry.pending_objects) busy.insert(removal.session);
        for (auto it = kept_from; it != by_age.end() && excess > 0; ++it) {
            if (busy.count(*it->second)) continue;
            d.evict.push_back(*it->second);
            --excess;
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
        for (const auto& [ref, removal] : registry.pending_objects) {
            if (removal.in_flight) continue;
            if (removal.next_attempt <= now)
                d.attempt_objects.push_back(ref);
            else
                wake_at(d, removal.next_attempt);
        }
    }
    return d;
}

std::optional<TimePoint> deadline_of(const Session& session, const SessionsConfig& config) {
    switch (session.record_state()) {
        case SessionState::grace: return session.grace_deadline;
        case SessionState::unclaimed:
            if (config.unclaimed_grace.count() > 0 && !session.ever_leased)
                return session.first_seen + config.unclaimed_grace;
            return std::nullopt;
        case SessionState::leased:
        case SessionState::ended: return std::nullopt;
    }
    return std::nullopt;
}

TimePoint deadline_of(const Tombstone& tombstone, const SessionsConfig& config) {
    return tombstone.ended_at + config.tombstone_ttl;
}

Expectation expectation_for(const PendingReap& reap, const Registry& registry) {
    Expectation expect;
    if (!reap.session.empty()) expect.session = reap.session;
    if (reap.reason == ReapReason::session_ended) {
        const SessionState state = registry.state_of(reap.session);
        expect.session_alive = state == SessionState::leased || state == SessionState::grace;
        expect.leases_opened = registry.leases_opened(reap.session);
    }
    return expect;
}

Expectation expectation_for(const PendingRemoval& removal, const Registry& registry) {
    Expectation expect;
    expect.session = removal.session;
    const SessionState state = registry.state_of(removal.session);
    expect.session_alive = state == SessionState::leased || state == SessionState::grace;
    expect.leases_opened = registry.leases_opened(removal.session);
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
