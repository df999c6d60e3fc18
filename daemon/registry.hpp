// What the daemon knows: every container the engine has (with its inspect info), the
// sessions that own some of them, and the reaps still to be done. Owned by the main loop's
// thread only; nothing here reads the clock or does I/O (times come in as arguments).
#pragma once

#include "config.hpp"
#include "guard.hpp"  // owning_session(): the ownership rule, in one place

#include <reaper/engine.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace reaperd {

using Clock = std::chrono::system_clock;
using TimePoint = Clock::time_point;

// The label that overrides sessions.max_age for one container.
inline constexpr const char* max_age_label = "reaperd.max-age";

// A container as the engine last described it, plus what the daemon derived from that.
struct KnownContainer {
    reaper::ContainerInfo info;
    TimePoint created;                  // from info.created; the time it was seen if unparsable
    std::optional<std::string> session; // set iff session-owned under the current config
    std::optional<Duration> max_age;    // from the reaperd.max-age label, when it parses
};

enum class SessionState { leased, grace, ended, unclaimed };
const char* to_string(SessionState state);

struct Session {
    std::string id;
    std::set<std::uint64_t> leases;           // open control connections naming it
    bool ever_leased = false;                 // claimed: liveness follows its leases
    std::optional<TimePoint> grace_deadline;  // set while its last lease is closed
    std::optional<TimePoint> ended_at;        // set for a tombstone
    std::string end_reason;                   // "end", "lease_expired", "unclaimed"
    TimePoint first_seen;

    SessionState state() const;
};

struct PendingReap {
    std::string container;
    std::string name;
    std::string session;
    std::string reason;  // "session_ended", "max_age", "orphan"
    unsigned failures = 0;  // failed attempts so far (an in-progress removal is not one)
    TimePoint next_attempt;
    bool in_flight = false;
};

// The part of the registry that survives a restart (see state.hpp).
struct PersistedSession {
    std::string id;
    bool held_lease = false;                  // leased when saved: gets a fresh lease_grace
    std::optional<TimePoint> grace_deadline;  // in grace when saved: kept as is
    std::optional<TimePoint> ended_at;        // a tombstone
    std::string end_reason;
};
struct PersistedState {
    std::vector<PersistedSession> sessions;
    std::vector<PendingReap> pending;  // in_flight and next_attempt are not persisted
};

class Registry {
public:
    std::map<std::string, KnownContainer> containers;  // every container, by id
    std::map<std::string, Session> sessions;
    std::map<std::string, PendingReap> pending;        // by container id
    std::set<std::string> would_reap_logged;           // dry run: logged once each

    // Records (or refreshes) a container, deriving its session under `config`. Returns
    // a warning text when its max-age label does not parse (the default applies then),
    // only the first time the container is recorded.
    std::optional<std::string> upsert_container(const reaper::ContainerInfo& info,
                                                const SessionsConfig& config, TimePoint now);
    // Forgets a container the engine no longer has (and any pending reap of it).
    void erase_container(const std::string& id);
    // Re-derives every container's session after sessions.labels changed.
    void rederive_sessions(const SessionsConfig& config, TimePoint now);

    Session& session(const std::string& id, TimePoint now);  // found or created

    void lease_opened(const std::string& session, std::uint64_t connection, TimePoint now);
    void lease_closed(const std::string& session, std::uint64_t connection, Duration lease_grace,
                      TimePoint now);
    // Ends a session now (a tombstone): its containers, present and future, get reaped.
    // Returns false if it had already ended.
    bool end_session(const std::string& session, const std::string& reason, TimePoint now);

    // Queues a reap unless one is pending. Returns true if it was new.
    bool add_pending(const std::string& container, const std::string& name,
                     const std::string& session, const std::string& reason, TimePoint now);

    std::size_t tracked_count() const;  // session-owned containers
    std::size_t containers_of(const std::string& session) const;

    PersistedState persisted() const;
    // Merges state loaded at start-up: sessions that held a lease get a fresh `lease_grace`;
    // grace deadlines and tombstones are kept; pending reaps are due now.
    void restore(const PersistedState& state, Duration lease_grace, TimePoint now);
};

// Parses RFC 3339 ("2026-11-30T13:26:20.123456789Z", offsets too); nullopt if it does not.
std::optional<TimePoint> parse_rfc3339(const std::string& text);
std::string format_rfc3339(TimePoint t);

}  // namespace reaperd
