#include "registry.hpp"

#include <algorithm>
#include <cstdio>
#include <ctime>

namespace reaperd {

const char* to_string(SessionState state) {
    switch (state) {
        case SessionState::leased: return "leased";
        case SessionState::grace: return "grace";
        case SessionState::ended: return "ended";
        case SessionState::unclaimed: return "unclaimed";
    }
    return "unclaimed";
}

SessionState Session::record_state() const {
    if (!leases.empty()) return SessionState::leased;
    if (grace_deadline) return SessionState::grace;
    return SessionState::unclaimed;
}

reaper::control::LabelledCounts Session::labelled() const {
    reaper::control::LabelledCounts total;
    for (const auto& [client, counts] : proxies) {
        total.containers += counts.containers;
        total.networks += counts.networks;
        total.volumes += counts.volumes;
    }
    return total;
}

std::optional<std::string> Registry::upsert_container(const reaper::ContainerInfo& info,
                                                      const SessionsConfig& config,
                                                      TimePoint now, Clock::duration wall_offset) {
    auto existing = containers.find(info.id);
    KnownContainer known;
    known.info = info;
    if (existing != containers.end()) {
        known.created = existing->second.created;
    } else {
        auto created = parse_rfc3339(info.created);
        known.created = created ? *created - wall_offset : now;
    }
    known.session = owning_session(info.labels, config.labels);
    std::optional<std::string> warning;
    if (auto label = info.labels.find(max_age_label); label != info.labels.end()) {
        try {
            known.max_age = parse_duration(label->second);
        } catch (const std::exception& e) {
            if (existing == containers.end())
                warning = "container " + info.name + " (" + info.id + "): label " + max_age_label +
                          "=\"" + label->second + "\" is not a duration (" + e.what() +
                          "); sessions.max_age applies";
        }
    }
    if (known.session) session(*known.session, now);
    containers[info.id] = std::move(known);
    return warning;
}

void Registry::erase_container(const std::string& id) {
    containers.erase(id);
    pending.erase(id);
    would_reap_logged.erase(id);
}

void Registry::rederive_sessions(const SessionsConfig& config, TimePoint now) {
    for (auto& [id, known] : containers) {
        known.session = owning_session(known.info.labels, config.labels);
        if (known.session) session(*known.session, now);
    }
    for (auto& [ref, known] : objects) {
        known.session = owning_session(known.labels, config.labels);
        if (known.session) session(*known.session, now);
    }
}

void Registry::upsert_object(const ObjectRef& ref, const std::string& name, const reaper::Labels& labels,
                             const SessionsConfig& config, TimePoint now) {
    KnownObject& known = objects[ref];
    known.ref = ref;
    known.name = name;
    known.labels = labels;
    known.session = owning_session(labels, config.labels);
    if (known.session) session(*known.session, now);
}

void Registry::erase_object(const ObjectRef& ref) {
    objects.erase(ref);
    would_remove_logged.erase(ref);
    auto it = pending_objects.find(ref);
    if (it != pending_objects.end() && !it->second.in_flight) pending_objects.erase(it);
}

bool Registry::add_pending_object(const ObjectRef& ref, const std::string& name,
                                  const std::string& session_id, TimePoint now) {
    if (pending_objects.count(ref)) return false;
    PendingRemoval removal;
    removal.ref = ref;
    removal.name = name;
    removal.session = session_id;
    removal.next_attempt = now;
    pending_objects.emplace(ref, std::move(removal));
    return true;
}

Session& Registry::session(const std::string& id, TimePoint now) {
    auto [it, inserted] = sessions.try_emplace(id);
    if (inserted) {
        it->second.id = id;
        it->second.first_seen = now;
    }
    return it->second;
}

void Registry::add_tombstone(const std::string& id, TimePoint ended_at, std::optional<EndReason> reason) {
    erase_tombstone(id);
    auto it = tombstones_.emplace(id, Tombstone{ended_at, reason}).first;
    by_age_.emplace(ended_at, &it->first);
}

bool Registry::erase_tombstone(const std::string& id) {
    auto it = tombstones_.find(id);
    if (it == tombstones_.end()) return false;
    by_age_.erase({it->second.ended_at, &it->first});
    tombstones_.erase(it);
    return true;
}

const Tombstone* Registry::tombstone(const std::string& id) const {
    auto it = tombstones_.find(id);
    return it == tombstones_.end() ? nullptr : &it->second;
}

bool Registry::known(const std::string& id) const {
    return sessions.count(id) > 0 || tombstones_.count(id) > 0;
}

SessionState Registry::state_of(const std::string& id) const {
    if (tombstones_.count(id)) return SessionState::ended;
    auto it = sessions.find(id);
    return it == sessions.end() ? SessionState::unclaimed : it->second.record_state();
}

std::uint64_t Registry::leases_opened(const std::string& id) const {
    std::uint64_t n = 0;
    if (auto it = sessions.find(id); it != sessions.end()) n = it->second.leases_opened;
    if (const Tombstone* t = tombstone(id)) n = std::max(n, t->leases_opened);
    return n;
}

std::size_t Registry::session_count() const {
    std::size_t both = 0;  // ended sessions with a record too: few (leases or proxies held)
    for (const auto& [id, s] : sessions) both += tombstones_.count(id);
    return sessions.size() + tombstones_.size() - both;
}

void Registry::lease_opened(const std::string& id, std::uint64_t connection, TimePoint now) {
    Session& s = session(id, now);
    s.leases_opened = leases_opened(id) + 1;  // counted on from its tombstone's, if revived
    s.leases.insert(connection);
    s.ever_leased = true;
    s.grace_deadline.reset();
    // Leasing an ended session id again revives it: its owner is back. Reaps already
    // queued for it are refused by the door while it is alive (policy.hpp expectation_for)
    // and queued again when it ends again.
    erase_tombstone(id);
    changed_sessions.insert(id);
}

void Registry::lease_closed(const std::string& id, std::uint64_t connection, Duration lease_grace,
                            TimePoint now) {
    auto it = sessions.find(id);
    if (it == sessions.end()) return;
    Session& s = it->second;
    if (s.leases.erase(connection) == 0) return;
    const bool ended = tombstones_.count(id) > 0;
    if (s.leases.empty() && !ended) s.grace_deadline = now + lease_grace;
    // An ended session that held a lease keeps its record only while it holds something.
    if (ended && s.leases.empty() && s.proxies.empty()) sessions.erase(it);
    changed_sessions.insert(id);
}

bool Registry::end_session(const std::string& id, EndReason reason, TimePoint now) {
    if (tombstones_.count(id)) return false;
    add_tombstone(id, now, reason);
    if (auto it = sessions.find(id); it != sessions.end()) {
        tombstones_.at(id).leases_opened = it->second.leases_opened;
        it->second.grace_deadline.reset();
        if (it->second.leases.empty() && it->second.proxies.empty()) sessions.erase(it);
    }
    changed_sessions.insert(id);
    return true;
}

bool Registry::forget_session(const std::string& id) {
    const bool tombstone = erase_tombstone(id);
    auto it = sessions.find(id);
    if (it != sessions.end() && it->second.leases.empty()) sessions.erase(it);
    if (tombstone) changed_sessions.insert(id);
    return tombstone;
}

bool Registry::add_pending(const std::string& container, const std::string& name,
                           const std::string& session_id, ReapReason reason,
                           TimePoint now) {
    if (pending.count(container)) return false;
    PendingReap reap;
    reap.container = container;
    reap.name = name;
    reap.session = session_id;
    reap.reason = reason;
    reap.next_attempt = now;
    reap.due = now;
    pending.emplace(container, std::move(reap));
    return true;
}

std::size_t Registry::tracked_count() const {
    std::size_t n = 0;
    for (const auto& [id, known] : containers)
        if (known.session) ++n;
    return n;
}

std::size_t Registry::containers_of(const std::string& session_id) const {
    std::size_t n = 0;
    for (const auto& [id, known] : containers)
        if (known.session && *known.session == session_id) ++n;
    return n;
}

std::size_t Registry::tracked_objects(ObjectKind kind) const {
    std::size_t n = 0;
    for (const auto& [ref, known] : objects)
        if (ref.kind == kind && known.session) ++n;
    return n;
}

std::size_t Registry::objects_of(const std::string& session_id, ObjectKind kind) const {
    std::size_t n = 0;
    for (const auto& [ref, known] : objects)
        if (ref.kind == kind && known.session && *known.session == session_id) ++n;
    return n;
}

std::size_t Registry::pending_objects_of(ObjectKind kind) const {
    std::size_t n = 0;
    for (const auto& [ref, removal] : pending_objects)
        if (ref.kind == kind) ++n;
    return n;
}

PersistedState Registry::persisted() const {
    PersistedState state;
    state.sessions.reserve(tombstones_.size() + sessions.size());
    for (const auto& [id, s] : sessions)
        if (!tombstones_.count(id))
            if (auto p = persisted_session(id)) state.sessions.push_back(std::move(*p));
    for (const auto& [id, t] : tombstones_) state.sessions.push_back({id, false, std::nullopt, t.ended_at, t.reason});
    for (const auto& [id, reap] : pending) {
        PendingReap p = reap;
        p.in_flight = false;
        state.pending.push_back(std::move(p));
    }
    return state;
}

std::optional<PersistedSession> Registry::persisted_session(const std::string& id) const {
    if (const Tombstone* t = tombstone(id)) return PersistedSession{id, false, std::nullopt, t->ended_at, t->reason};
    auto it = sessions.find(id);
    if (it == sessions.end()) return std::nullopt;
    const Session& s = it->second;
    PersistedSession p;
    p.id = id;
    p.held_lease = !s.leases.empty();
    p.grace_deadline = s.grace_deadline;
    if (p.held_lease || p.grace_deadline) return p;
    return std::nullopt;
}

void Registry::restore(const PersistedState& state, Duration lease_grace, TimePoint now) {
    for (const auto& p : state.sessions) {
        if (p.ended_at) {
            add_tombstone(p.id, *p.ended_at, p.end_reason);
            continue;
        }
        Session& s = session(p.id, now);
        if (p.held_lease) {
            s.ever_leased = true;
            s.grace_deadline = now + lease_grace;
        } else if (p.grace_deadline) {
            s.ever_leased = true;
            s.grace_deadline = p.grace_deadline;
        }
    }
    for (const auto& p : state.pending) {
        PendingReap reap = p;
        reap.in_flight = false;
        reap.next_attempt = now;
        reap.due = now;
        pending[reap.container] = std::move(reap);
    }
}

TimePoint steady_now() {
    static const auto wall_at_start = Clock::now();
    static const auto steady_at_start = std::chrono::steady_clock::now();
    return wall_at_start +
           std::chrono::duration_cast<Clock::duration>(std::chrono::steady_clock::now() - steady_at_start);
}

std::string format_rfc3339(TimePoint t) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
    time_t seconds = static_cast<time_t>(ms / 1000);
    if (ms < 0 && ms % 1000) --seconds;
    std::tm tm{};
    gmtime_r(&seconds, &tm);
    char buf[80];
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<int>(((ms % 1000) + 1000) % 1000));
    return buf;
}

}  // namespace reaperd
