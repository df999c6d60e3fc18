// What the daemon knows: every container the engine has (with its inspect info), every
// network and volume (with its labels), the sessions that own some of them, and the reaps
// and removals still to be done. Owned by the main loop's
// thread only; nothing here reads the clock or does I/O (times come in as arguments).
#pragma once

#include "config.hpp"
#include "guard.hpp"  // owning_session(): the ownership rule, in one place

#include <reaper/control.hpp>
#include <reaper/engine.hpp>
#include <reaper/units.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace reaperd {

// The loop's time. Its clock in production is steady_now(): the steady clock, read as the
// wall clock read at start-up. Every deadline held in memory (lease graces, retries,
// tombstone expiry, max ages) is on it, so a step of the wall clock (NTP's first sync at boot,
// an admin's `date -s`) moves none of them; had they been on the wall clock, a step forward of
// a lease_grace would end every session in grace at once. Wall time is met only at the
// edges, each converted with the wall clock's lead over the loop's clock then (`wall_offset`):
// the engine's timestamps, the state file, and the times status shows.
using Clock = std::chrono::system_clock;
using TimePoint = Clock::time_point;
TimePoint steady_now();

// The label that overrides sessions.max_age for one container.
inline constexpr const char* max_age_label = "reaperd.max-age";

// A container as the engine last described it, plus what the daemon derived from that.
struct KnownContainer {
    reaper::ContainerInfo info;
    TimePoint created;                  // from info.created; the time it was seen if unparsable
    std::optional<std::string> session; // set iff session-owned under the current config
    std::optional<Duration> max_age;    // from the reaperd.max-age label, when it parses
};

// A network or volume as the engine last listed it (labels never change after creation).
struct KnownObject {
    ObjectRef ref;
    std::string name;
    reaper::Labels labels;
    std::optional<std::string> session;  // set iff session-owned under the current config
};

enum class SessionState { leased, grace, ended, unclaimed };
const char* to_string(SessionState state);

// The record of a session that is not ended, or of an ended one while it still holds
// something (open leases, proxy reports); whether it ended is its tombstone's to say
// (Registry::state_of).
struct Session {
    std::string id;
    std::set<std::uint64_t> leases;           // open control connections naming it
    bool ever_leased = false;                 // claimed: liveness follows its leases
    // Leases opened on it as this loop has seen them; the door compares it with its own
    // count, taken before the loop hears of a lease (guard.hpp, Expectation::leases_opened).
    std::uint64_t leases_opened = 0;
    std::optional<TimePoint> grace_deadline;  // set while its last lease is closed
    TimePoint first_seen;
    // Labelling proxies that held leases on it (`reaperctl run --own`) and what each labelled,
    // by ProxyReport::client (control_server.hpp): totals, kept after their leases close.
    // Memory only: after a restart they come back as the proxies lease again.
    std::map<std::int64_t, reaper::control::LabelledCounts> proxies;

    // Its state as the record says: leased, grace or unclaimed (never ended).
    SessionState record_state() const;
    reaper::control::LabelledCounts labelled() const;  // summed over its proxies
};

// An ended session: all that is kept of one that holds nothing, so that the
// sessions.max_tombstones any socket user can fill cost little: with 126,808 of them reaperd
// held 34.8 MB (~185 bytes each; bench/tombstone_bench), against 154 MB as Session records.
struct Tombstone {
    TimePoint ended_at;
    std::optional<EndReason> reason;  // none only from a state file that lacks it
    // Session::leases_opened when its record went, for the door (guard.hpp); memory only, as
    // the door's own count is.
    std::uint64_t leases_opened = 0;
};

struct PendingReap {
    std::string container;
    std::string name;
    std::string session;
    ReapReason reason = ReapReason::session_ended;
    unsigned failures = 0;  // failed attempts so far (an in-progress removal is not one)
    TimePoint next_attempt;
    bool in_flight = false;
    // When it was queued, the moment its reason arose (the loop queues in the turn that ends
    // a session, takes a report, or passes a max_age): where the reap latency metric starts.
    // Not persisted: a reap restored at start-up is due from then.
    TimePoint due;
};

// The removal of a network or volume of an ended session, once its containers are gone.
// Not persisted: after a restart the next list finds the object again, and its session's
// tombstone (persisted) queues it again.
struct PendingRemoval {
    ObjectRef ref;
    std::string name;
    std::string session;
    unsigned failures = 0;
    TimePoint next_attempt;
    bool in_flight = false;
};

// The part of the registry that survives a restart (see state.hpp).
struct PersistedSession {
    std::string id;
    bool held_lease = false;                  // leased when saved: gets a fresh lease_grace
    std::optional<TimePoint> grace_deadline;  // in grace when saved: kept as is
    std::optional<TimePoint> ended_at;        // a tombstone
    std::optional<EndReason> end_reason;
};
struct PersistedState {
    std::vector<PersistedSession> sessions;
    std::vector<PendingReap> pending;  // in_flight, next_attempt and due are not persisted
    // Not persisted: what StateStore::load() skipped and said why (a torn last journal record).
    std::vector<std::string> warnings;
};

class Registry {
public:
    Registry() = default;
    // Moves only: the tombstone order points into the tombstone map's nodes.
    Registry(Registry&&) = default;
    Registry& operator=(Registry&&) = default;
    Registry(const Registry&) = delete;
    Registry& operator=(const Registry&) = delete;

    std::map<std::string, KnownContainer> containers;  // every container, by id
    // Session records (see Session): every known session that is not ended, and the ended
    // ones that still hold leases or proxy reports. The other ended ones are tombstones only.
    std::map<std::string, Session> sessions;
    std::map<std::string, PendingReap> pending;        // by container id
    std::set<std::string> would_reap_logged;           // dry run: logged once each
    std::map<ObjectRef, KnownObject> objects;          // every network and volume
    std::map<ObjectRef, PendingRemoval> pending_objects;
    std::set<ObjectRef> would_remove_logged;           // dry run: logged once each
    // Sessions whose persisted form may have changed since the last save: the methods below
    // note them, and StateStore::save_changes() journals just those, then clears it.
    std::set<std::string> changed_sessions;

    // Records (or refreshes) a container, deriving its session under `config`. Returns
    // a warning text when its max-age label does not parse (the default applies then),
    // only the first time the container is recorded. Its creation time (the engine's wall
    // time) goes on the loop's clock less `wall_offset` (see Clock).
    std::optional<std::string> upsert_container(const reaper::ContainerInfo& info,
                                                const SessionsConfig& config, TimePoint now,
                                                Clock::duration wall_offset = {});
    // Forgets a container the engine no longer has (and any pending reap of it).
    void erase_container(const std::string& id);
    // Re-derives every container's (network's, volume's) session after sessions.labels
    // changed.
    void rederive_sessions(const SessionsConfig& config, TimePoint now);

    // Records (or refreshes) a network or volume, deriving its session under `config`.
    void upsert_object(const ObjectRef& ref, const std::string& name, const reaper::Labels& labels,
                       const SessionsConfig& config, TimePoint now);
    // Forgets a network or volume the engine no longer has. Its pending removal goes too,
    // unless an attempt is in flight (its result settles it).
    void erase_object(const ObjectRef& ref);
    // Queues a removal unless one is pending. Returns true if it was new.
    bool add_pending_object(const ObjectRef& ref, const std::string& name, const std::string& session,
                            TimePoint now);

    Session& session(const std::string& id, TimePoint now);  // found or created

    // Ended sessions, by id, and the same ordered by (ended_at, id), oldest first: expiry and
    // eviction take from its front, so a decision costs O(live sessions + containers), not
    // O(tombstones). Changed only by the methods below.
    // Entries point at the keys of tombstones() (stable: map nodes do not move).
    using AgedTombstone = std::pair<TimePoint, const std::string*>;
    struct Older {
        bool operator()(const AgedTombstone& a, const AgedTombstone& b) const {
            return a.first != b.first ? a.first < b.first : *a.second < *b.second;
        }
    };
    using TombstoneOrder = std::set<AgedTombstone, Older>;
    const std::map<std::string, Tombstone>& tombstones() const noexcept { return tombstones_; }
    const TombstoneOrder& tombstones_by_age() const noexcept { return by_age_; }
    const Tombstone* tombstone(const std::string& id) const;  // nullptr unless ended
    // Whether the session is known at all (a record or a tombstone), and its state: ended if
    // it has a tombstone, else its record's; unclaimed when unknown.
    bool known(const std::string& id) const;
    SessionState state_of(const std::string& id) const;
    std::size_t session_count() const;  // known sessions, each once
    // Leases opened on it as this loop has seen them (Session::leases_opened), its record's or,
    // once that went, its tombstone's; 0 when unknown.
    std::uint64_t leases_opened(const std::string& id) const;

    void lease_opened(const std::string& session, std::uint64_t connection, TimePoint now);
    void lease_closed(const std::string& session, std::uint64_t connection, Duration lease_grace,
                      TimePoint now);
    // Ends a session now (a tombstone): its containers, present and future, get reaped.
    // Returns false if it had already ended.
    bool end_session(const std::string& session, EndReason reason, TimePoint now);
    // Drops a session (an expired or evicted tombstone, an idle record); one still leased
    // only loses its tombstone. Returns true if it was a tombstone (a persisted change).
    bool forget_session(const std::string& session);

    // Queues a reap unless one is pending. Returns true if it was new.
    bool add_pending(const std::string& container, const std::string& name,
                     const std::string& session, ReapReason reason, TimePoint now);

    std::size_t tracked_count() const;  // session-owned containers
    std::size_t containers_of(const std::string& session) const;
    // Session-owned networks or volumes: all, or one session's.
    std::size_t tracked_objects(ObjectKind kind) const;
    std::size_t objects_of(const std::string& session, ObjectKind kind) const;
    std::size_t pending_objects_of(ObjectKind kind) const;

    PersistedState persisted() const;
    // One session's part of persisted(); nullopt when nothing of it is persisted.
    std::optional<PersistedSession> persisted_session(const std::string& id) const;
    // Merges state loaded at start-up: sessions that held a lease get a fresh `lease_grace`;
    // grace deadlines and tombstones are kept; pending reaps are due now.
    void restore(const PersistedState& state, Duration lease_grace, TimePoint now);

private:
    void add_tombstone(const std::string& id, TimePoint ended_at, std::optional<EndReason> reason);
    // Drops `id`'s tombstone; returns false if it had none.
    bool erase_tombstone(const std::string& id);

    std::map<std::string, Tombstone> tombstones_;
    TombstoneOrder by_age_;
};

// Parses RFC 3339 ("2026-11-30T13:26:20.123456789Z", offsets too): reaper/units.hpp.
using reaper::parse_rfc3339;
std::string format_rfc3339(TimePoint t);

}  // namespace reaperd
