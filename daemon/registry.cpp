#include "registry.hpp"

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

SessionState Session::state() const {
    if (ended_at) return SessionState::ended;
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
                                                      TimePoint now) {
    auto existing = containers.find(info.id);
    KnownContainer known;
    known.info = info;
    if (existing != containers.end()) {
        known.created = existing->second.created;
    } else {
        known.created = parse_rfc3339(info.created).value_or(now);
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

void Registry::lease_opened(const std::string& id, std::uint64_t connection, TimePoint now) {
    Session& s = session(id, now);
    s.leases.insert(connection);
    s.ever_leased = true;
    ++s.leases_opened;
    s.grace_deadline.reset();
    // Leasing an ended session id again revives it: its owner is back. Reaps already
    // queued for it are refused by the door while it is alive (policy.hpp expectation_for)
    // and queued again when it ends again.
    s.ended_at.reset();
    s.end_reason.clear();
    changed_sessions.insert(id);
}

void Registry::lease_closed(const std::string& id, std::uint64_t connection, Duration lease_grace,
                            TimePoint now) {
    auto it = sessions.find(id);
    if (it == sessions.end()) return;
    Session& s = it->second;
    if (s.leases.erase(connection) == 0) return;
    if (s.leases.empty() && !s.ended_at) s.grace_deadline = now + lease_grace;
    changed_sessions.insert(id);
}

bool Registry::end_session(const std::string& id, const std::string& reason, TimePoint now) {
    Session& s = session(id, now);
    if (s.ended_at) return false;
    s.ended_at = now;
    s.end_reason = reason;
    s.grace_deadline.reset();
    changed_sessions.insert(id);
    return true;
}

bool Registry::forget_session(const std::string& id) {
    auto it = sessions.find(id);
    if (it == sessions.end()) return false;
    const bool tombstone = it->second.ended_at.has_value();
    if (it->second.leases.empty())
        sessions.erase(it);
    else
        it->second.ended_at.reset();
    if (tombstone) changed_sessions.insert(id);
    return tombstone;
}

bool Registry::add_pending(const std::string& container, const std::string& name,
                           const std::string& session_id, const std::string& reason,
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
    for (const auto& [id, s] : sessions)
        if (auto p = persisted_session(s)) state.sessions.push_back(std::move(*p));
    for (const auto& [id, reap] : pending) {
        PendingReap p = reap;
        p.in_flight = false;
        state.pending.push_back(std::move(p));
    }
    return state;
}

std::optional<PersistedSession> Registry::persisted_session(const Session& s) {
    PersistedSession p;
    p.id = s.id;
    p.held_lease = !s.leases.empty() && !s.ended_at;
    p.grace_deadline = s.ended_at ? std::nullopt : s.grace_deadline;
    p.ended_at = s.ended_at;
    p.end_reason = s.end_reason;
    if (p.held_lease || p.grace_deadline || p.ended_at) return p;
    return std::nullopt;
}

void Registry::restore(const PersistedState& state, Duration lease_grace, TimePoint now) {
    for (const auto& p : state.sessions) {
        Session& s = session(p.id, now);
        if (p.ended_at) {
            s.ended_at = p.ended_at;
            s.end_reason = p.end_reason;
        } else if (p.held_lease) {
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

std::optional<TimePoint> parse_rfc3339(const std::string& text) {
    int year, month, day, hour, minute, second, consumed = 0;
    if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &year, &month, &day, &hour, &minute,
                    &second, &consumed) != 6)
        return std::nullopt;
    std::tm tm{};
    tm.tm_year = year - 1900;
    tm.tm_mon = month - 1;
    tm.tm_mday = day;
    tm.tm_hour = hour;
    tm.tm_min = minute;
    tm.tm_sec = second;
    time_t seconds = timegm(&tm);
    std::size_t pos = static_cast<std::size_t>(consumed);
    std::int64_t nanos = 0;
    if (pos < text.size() && text[pos] == '.') {
        std::int64_t scale = 100000000;
        for (++pos; pos < text.size() && text[pos] >= '0' && text[pos] <= '9'; ++pos) {
            nanos += (text[pos] - '0') * scale;
            scale /= 10;
        }
    }
    if (pos >= text.size()) return std::nullopt;
    if (text[pos] == '+' || text[pos] == '-') {
        int oh = 0, om = 0;
        if (std::sscanf(text.c_str() + pos + 1, "%2d:%2d", &oh, &om) != 2) return std::nullopt;
        long offset = (oh * 3600L + om * 60L) * (text[pos] == '+' ? 1 : -1);
        seconds -= offset;
    } else if (text[pos] != 'Z' && text[pos] != 'z') {
        return std::nullopt;
    }
    // The clock counts nanoseconds in 64 bits (years 1678 to 2262); the engine's zero time
    // (0001-01-01T00:00:00Z) and the like are outside it, so they are not times we can use.
    constexpr auto clock_seconds =
        std::chrono::duration_cast<std::chrono::seconds>(Clock::duration::max()).count() - 1;
    if (seconds > clock_seconds || seconds < -clock_seconds) return std::nullopt;
    return TimePoint{std::chrono::duration_cast<Clock::duration>(std::chrono::seconds{seconds} +
                                                                 std::chrono::nanoseconds{nanos})};
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
