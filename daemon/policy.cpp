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
    std::vector<std::pair<TimePoint, const std::string*>> tombstones;  // kept ones, for evict
    for (const auto& [id, s] : registry.sessions) {
        switch (s.state()) {
            case SessionState::ended: {
                TimePoint expiry = *s.ended_at + sc.tombstone_ttl;
                if (expiry <= now) {
                    d.forget.push_back(id);
                } else {
                    ended.insert(id);
                    tombstones.emplace_back(*s.ended_at, &id);
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
                std::size_t owned = registry.containers_of(id) +
                                    registry.objects_of(id, ObjectKind::network) +
                                    registry.objects_of(id, ObjectKind::volume);
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

    // Networks and volumes: once their ended session has no container left, known or
    // pending a reap (a reap restored at start-up counts before the first list). The watcher
    // reports a list's containers before its networks and volumes, so by the time an object
    // is known here its session's containers are too.
    std::set<std::string> with_containers;
    for (const auto& [id, known] : registry.containers)
        if (known.session && ended.count(*known.session)) with_containers.insert(*known.session);
    for (const auto& [id, reap] : registry.pending) with_containers.insert(reap.session);
    for (const auto& [ref, known] : registry.objects) {
        if (!known.session) continue;  // the ownership rule, for networks and volumes too
        if (!ended.count(*known.session) || with_containers.count(*known.session)) continue;
        if (registry.pending_objects.count(ref)) continue;
        if (config.reaper.dry_run && registry.would_remove_logged.count(ref)) continue;
        d.remove.push_back({ref, known.name, *known.session});
    }

    // Too many tombstones (any user of the control socket may end any id): forget the oldest.
    // One whose session still has something left is kept, over the limit, because it is what
    // reaps that: forgotten, its containers would belong to an unclaimed session and be
    // left alone. It becomes evictable once they are gone, and goes at the next decision.
    if (tombstones.size() > sc.max_tombstones) {
        const std::size_t excess = tombstones.size() - sc.max_tombstones;
        std::set<std::string> busy;
        for (const auto& [id, known] : registry.containers)
            if (known.session) busy.insert(*known.session);
        for (const auto& [id, reap] : registry.pending) busy.insert(reap.session);
        for (const auto& [ref, known] : registry.objects)
            if (known.session) busy.insert(*known.session);
        for (const auto& [ref, removal] : registry.pending_objects) busy.insert(removal.session);
        std::erase_if(tombstones, [&](const auto& t) { return busy.count(*t.second) > 0; });
        const auto older = [](const auto& a, const auto& b) {
            return a.first != b.first ? a.first < b.first : *a.second < *b.second;
        };
        if (excess < tombstones.size()) {
            std::nth_element(tombstones.begin(), tombstones.begin() + static_cast<std::ptrdiff_t>(excess),
                             tombstones.end(), older);
            tombstones.resize(excess);
        }
        std::sort(tombstones.begin(), tombstones.end(), older);
        for (const auto& t : tombstones) {
            d.evict.push_back(*t.second);
            ended.erase(*t.second);
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

Expectation expectation_for(const PendingReap& reap, const Registry& registry) {
    Expectation expect;
    if (!reap.session.empty()) expect.session = reap.session;
    if (reap.reason == "session_ended") {
        expect.leases_opened = 0;
        auto it = registry.sessions.find(reap.session);
        if (it != registry.sessions.end()) {
            SessionState state = it->second.state();
            expect.session_alive = state == SessionState::leased || state == SessionState::grace;
            expect.leases_opened = it->second.leases_opened;
        }
    }
    return expect;
}

Expectation expectation_for(const PendingRemoval& removal, const Registry& registry) {
    Expectation expect;
    expect.session = removal.session;
    expect.leases_opened = 0;
    auto it = registry.sessions.find(removal.session);
    if (it != registry.sessions.end()) {
        SessionState state = it->second.state();
        expect.session_alive = state == SessionState::leased || state == SessionState::grace;
        expect.leases_opened = it->second.leases_opened;
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
