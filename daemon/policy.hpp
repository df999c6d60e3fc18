// The daemon's decisions, as a pure function of what it knows, its config and the time:
// which sessions end now, which containers to reap, which networks and volumes to remove,
// which tombstones to forget, which pending reaps and removals to attempt, and when to look
// again. No I/O, no clock.
#pragma once

#include "config.hpp"
#include "registry.hpp"

#include <optional>
#include <string>
#include <vector>

namespace reaperd {

struct EndSession {
    std::string session;
    EndReason reason = EndReason::lease_expired;
};

struct ReapContainer {  // queue a reap (or, in a dry run, log that it would)
    std::string container;
    std::string name;
    std::string session;
    ReapReason reason = ReapReason::session_ended;  // session_ended or max_age
};

struct RemoveObject {  // queue the removal of a network or volume (dry run: log that it would)
    ObjectRef object;
    std::string name;
    std::string session;
};

struct Decision {
    std::vector<EndSession> end;
    std::vector<ReapContainer> reap;
    // Networks and volumes of ended sessions none of whose containers is left (known or
    // pending a reap): containers go first.
    std::vector<RemoveObject> remove;
    std::vector<std::string> forget;   // sessions to drop: expired tombstones, idle records
    // Tombstones to drop because more than sessions.max_tombstones are held: the oldest
    // (ended_at) first, only as many as bring the count down to the limit, and never one
    // whose session still has containers, networks, volumes, or reaps or removals pending.
    std::vector<std::string> evict;
    std::vector<std::string> attempt;  // pending reaps due now (never in a dry run)
    std::vector<ObjectRef> attempt_objects;  // pending removals due now (never in a dry run)
    std::optional<TimePoint> next_wake;  // the earliest future deadline, if any
};

// Only session-owned containers ever appear in `reap` or `attempt`, and only session-owned
// networks and volumes in `remove`: those without a session (under config.sessions.labels)
// are never considered. A network or volume is removed only because its session ended (no
// max_age, no orphan reports).
Decision decide(const Registry& registry, const Config& config, TimePoint now);

// A session's deadline, the one fact decide() acts on and status shows (`deadline`): the end
// of its lease grace (it ends: lease_expired), or, when it never took a lease and
// sessions.unclaimed_grace is on, first seen + that grace (it ends: unclaimed, if it owns
// something then). nullopt for a leased session, or one that no time ends.
std::optional<TimePoint> deadline_of(const Session& session, const SessionsConfig& config);
// A tombstone's: ended_at + sessions.tombstone_ttl, when it is forgotten.
TimePoint deadline_of(const Tombstone& tombstone, const SessionsConfig& config);

// What the loop tells the door (guard.hpp) with each attempt of a pending reap: the session
// it was queued for, and, for a reap because that session ended, whether the session is
// alive again (leased, or in its lease grace); the door then refuses and the reap is
// dropped, to be queued again when the session ends again. A max_age reap or an orphan
// report acts whatever the session's liveness: the container's age, or its owner's own
// report, is the reason.
Expectation expectation_for(const PendingReap& reap, const Registry& registry);
// For a network or volume: its session, and whether that session is alive again.
Expectation expectation_for(const PendingRemoval& removal, const Registry& registry);

// The delay before retry number `failures` (1 = after the first failure): doubling from
// `initial`, capped at `max`, then scaled into [50%, 100%] by `jitter` in [0, 1].
Duration retry_delay(unsigned failures, Duration initial, Duration max, double jitter);

}  // namespace reaperd
