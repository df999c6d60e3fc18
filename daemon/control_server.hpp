// The daemon's end of the control socket (protocol: lib/include/reaper/control.hpp,
// docs/control-protocol.md). One thread serves every connection with poll(), so thousands of
// idle leases cost one descriptor each and no thread; three more answer what waits for
// something: one builds status and metrics answers, one ends sessions and answers session
// queries (both wait for the daemon's main loop), and one resolves orphan reports (an engine
// call).
#pragma once

#include "config.hpp"

#include "reaper/control.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace reaperd {

// Thrown by a handler call to refuse a valid request (an orphan report naming no container,
// or one reaperd does not own): the client gets what() as the error, as is, with the fields
// of details() (the container the report resolved to, whether reaperd owns it); the
// connection stays open.
class Refused : public std::runtime_error {
public:
    explicit Refused(const std::string& what, reaper::control::Reply details = {})
        : std::runtime_error(what),
          details_(std::make_shared<const reaper::control::Reply>(std::move(details))) {}
    const reaper::control::Reply& details() const noexcept { return *details_; }

private:
    std::shared_ptr<const reaper::control::Reply> details_;
};

// What a lease taken with "proxy":true says about its labelling proxy.
struct ProxyReport {
    // Who holds it: the client process's pid (SO_PEERCRED), so a proxy that reconnects (after
    // a restart of reaperd, say) replaces its own counts; minus the connection id when the
    // pid is unknown.
    std::int64_t client = 0;
    reaper::control::LabelledCounts labelled;  // totals so far
};

// Called from the control server's threads:
// - lease_opened, lease_closed and proxy_reported from the one serving every connection (in
//   order, one at a time; they should return quickly, since no other connection is served
//   meanwhile);
// - status_json and metrics_text from a second thread; end_session and session_report from a
//   third (they may wait for the daemon's main loop); orphan_reported from a fourth (it may
//   wait for the engine). A slow answer delays only its asker, and what is queued behind it
//   on its thread.
// Implementations must be thread-safe (the daemon posts each call to its main loop's queue).
// An exception thrown by a call becomes an error reply to that client. The Reply a call
// returns is sent with "ok":true and the fields it sets (control.hpp says which op sets
// which).
class ControlHandler {
public:
    virtual ~ControlHandler() = default;
    virtual void lease_opened(const std::string& session, std::uint64_t connection_id) = 0;
    virtual void lease_closed(const std::string& session, std::uint64_t connection_id) = 0;
    // A lease taken with "proxy":true: called right after lease_opened with the counts its
    // request carried, then after each "update" on its connection. Ignored by default.
    virtual void proxy_reported(const std::string& session, std::uint64_t connection_id,
                                const ProxyReport& report);
    // The end reply: known, already_ended, dry_run, reaps_queued.
    virtual reaper::control::Reply end_session(const std::string& session) = 0;
    // The session reply: known, state, ready, dry_run, remaining. Refused by default.
    virtual reaper::control::Reply session_report(const std::string& session);
    // `container` as the reporter gave it (an id, an id prefix or a name); `session` may be "".
    // The orphan reply: the full id it was pinned to, name, session, owned, queued, dry_run.
    virtual reaper::control::Reply orphan_reported(const std::string& container,
                                                   const std::string& session) = 0;
    // The JSON object returned as "status", for what the request asked (control.hpp).
    virtual std::string status_json(const reaper::control::StatusQuery& query) = 0;
    virtual std::string metrics_text() = 0;  // Prometheus text exposition
    // A connection or lease refused by a limit, for a metric: `reason` is "connections"
    // (max_connections), "connections_per_uid", "leases_per_uid" or "uid" (peer_admitted). Called on the thread
    // serving every connection; must return at once. Ignored by default.
    virtual void request_refused(const std::string& reason);
};

struct ControlServerLimits {
    // A connection that is not a lease is closed when this long has passed since it was
    // accepted, since its last COMPLETE request, or since its last answer was queued, whichever
    // is latest (an answer being composed stops the clock). Bytes alone never reset it: a
    // half-sent line trickled a byte every 29 s, or a reply read a byte at a time, cannot pin a
    // descriptor. Leases never time out.
    std::chrono::milliseconds idle_timeout{std::chrono::seconds{30}};
    // Reading from a connection (and answering what it has already sent) pauses while more
    // than this much of its output is unsent: a client that pipelines requests and never reads
    // the replies costs at most this plus one reply, not memory without bound (measured before
    // this bound: RSS 9 -> 104 MB in 20 s with one such client).
    std::size_t output_pause_bytes = 256 * 1024;
    // A connection whose unsent output passes this is closed (logged once, with the peer's
    // pid and uid): only one reply can be queued past the pause bound, so this catches a
    // client that does not read a reply larger than this.
    std::size_t output_hard_bytes = 32 * 1024 * 1024;
    // Connections beyond this get an error reply and are closed at once. Kept below the
    // descriptor limit by fit_to_descriptors().
    std::size_t max_connections = 4096;
    // Connections one uid (SO_PEERCRED) may hold at once, leases included; 0 = no limit
    // beyond max_connections. One more gets an error reply naming the limit and is closed.
    std::size_t max_connections_per_uid = 0;
    // Leases the connections of one uid may hold at once; 0 = no limit. One more lease
    // request gets an error reply naming the limit and control.max_leases_per_uid, and its
    // connection is closed; the handler never sees it.
    std::size_t max_leases_per_uid = 0;
};

// Descriptors reaperd keeps for what is not a control connection: the listener and its
// eventfds, engine calls (reaper workers, the watcher's event stream, inspects), log files
// the log capper opens, the state journal, the metrics listener and its clients.
inline constexpr std::size_t reserved_descriptors = 256;

// What a start-up check makes of the descriptor limit (RLIMIT_NOFILE's soft value):
// `limits` with max_connections lowered, if need be, so that the connections and the
// reserve fit under it (at least 1 connection). Pure: the caller reads and logs the limit.
ControlServerLimits fit_to_descriptors(ControlServerLimits limits, std::uint64_t nofile_soft);

// What each lease's reply tells its holder of reaperd's log caps (control.hpp
// Reply::log_max_size, log_rotate_at_create): logs.max_size (0 when no log is capped) and
// logs.rotate_at_create.
struct LeaseTerms {
    std::uint64_t log_max_size_bytes = 0;
    bool log_rotate_at_create = false;
};

// Whether a peer of uid `peer_uid` (SO_PEERCRED; -1 when the kernel does not say) may use the
// control socket of a reaperd running as `daemon_uid`. root's reaperd admits whoever the
// socket's mode and group let connect. A user's reaperd acts on that user's engine only, so
// it admits that uid, and root only when control.allow_root says so; a user sharing the
// daemon's group cannot end its sessions. Pure.
bool peer_admitted(std::int64_t peer_uid, std::int64_t daemon_uid, bool allow_root) noexcept;

class ControlServer {
public:
    // Binds config.socket (creating its parent directory if missing; removing a stale socket
    // file first only if nothing listens on it), chmod 0660, chgrp config.group if set
    // (a group name, or a numeric gid). Throws std::runtime_error at start-up on failure,
    // naming the path or the group.
    ControlServer(const ControlConfig& config, ControlHandler& handler,
                  ControlServerLimits limits = {});
    ~ControlServer();  // stop()
    ControlServer(const ControlServer&) = delete;
    ControlServer& operator=(const ControlServer&) = delete;

    // Serves on its own thread until stop(). Call at most once.
    void start();
    // Closes the listener and every connection WITHOUT calling lease_closed: a daemon shutting
    // down must not end anyone's session (leases are restored after restart with a fresh grace).
    // Removes the socket file if it is still the one this server bound. Waits for a status,
    // metrics, end, session or orphan call already running in the handler to return.
    // Idempotent.
    void stop();

    // New per-uid limits (ControlServerLimits' fields of the same names), for a reload: they
    // apply to connections accepted and leases requested from now on; what is held stays.
    // Thread-safe.
    void set_uid_limits(std::size_t max_connections_per_uid, std::size_t max_leases_per_uid) noexcept;
    // The terms every lease's reply carries from now on (none before the first call: a plain
    // {"ok":true}). Thread-safe.
    void set_lease_terms(const LeaseTerms& terms) noexcept;

    const std::string& socket_path() const noexcept;
    // Connections open right now (leases included); for tests and status.
    std::size_t connection_count() const noexcept;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace reaperd
