// The control protocol between reaperd and its clients (the library's Session, reaperctl),
// implemented once here for both sides.
//
// Wire format: over a unix stream socket, each message is one JSON object on one line
// ('\n'-terminated, at most max_message_bytes). The client sends requests, the daemon answers
// each with one reply line: {"ok":true,...} or {"ok":false,"error":"<what was wrong>"}.
// A malformed or oversized request gets an error reply and the daemon closes the connection.
//
//   {"op":"lease","session":"S"}              -> {"ok":true[,"log_max_size":N,
//                                                 "log_rotate_at_create":B]}; the lease lasts
//                                                 while the connection stays open
//   {"op":"lease","session":"S","proxy":true,"containers_labelled":N,...}
//                                             -> {"ok":true}; a lease whose holder runs a
//                                                 labelling proxy, which may then send
//   {"op":"update","containers_labelled":N,"networks_labelled":N,"volumes_labelled":N}
//                                             -> {"ok":true}, on that lease's connection
//   {"op":"end","session":"S"}                -> {"ok":true,"session":"S","known":..,
//                                                 "already_ended":..,"reaps_queued":{..}}
//   {"op":"orphan","container":"C","session":"S"} -> {"ok":true,"container":"<full id>",
//                                                 "name":..,"session":..,"owned":..,"queued":..}
//   {"op":"session","session":"S"}            -> {"ok":true,"session":"S","known":..,
//                                                 "ready":..,"remaining":{"containers":N,..}}
//   {"op":"status"[,"ended":true][,"limit":N]} -> {"ok":true,"status":{...}}
//   {"op":"metrics"}                          -> {"ok":true,"metrics":"<prometheus text>"}
//
// Compatibility: a request field this side does not know is ignored (a newer client's new
// field reaches an older daemon harmlessly); a field it knows that the op does not take, or of
// the wrong type, is an error naming the field. Reply fields a client does not know are ignored.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace reaper::control {

inline constexpr std::size_t max_message_bytes = 64 * 1024;  // a request line, '\n' excluded
inline constexpr std::size_t max_reply_bytes = 16 * 1024 * 1024;  // status/metrics can be large
inline constexpr std::size_t max_session_id_bytes = 256;
inline constexpr std::size_t max_container_bytes = 256;  // an id or a name
inline constexpr const char* default_socket_path = "/run/reaperd/control.sock";

enum class Op { Lease, Update, End, Orphan, Session, Status, Metrics };
const char* to_string(Op op);

// What a labelling proxy (`reaperctl run --own`, reaper/proxy.hpp) labelled so far: totals.
struct LabelledCounts {
    std::uint64_t containers = 0;
    std::uint64_t networks = 0;
    std::uint64_t volumes = 0;
    bool operator==(const LabelledCounts&) const = default;
};

struct Request {
    Op op = Op::Status;
    std::string session;    // lease, end, session; optional for orphan
    std::string container;  // orphan
    bool proxy = false;     // lease: the holder runs a labelling proxy
    LabelledCounts labelled;  // lease with proxy (what it labelled before this connection), update
    // status: list the ended sessions (newest first) instead of the live ones.
    bool ended = false;
    // status: at most this many ended sessions listed; unset is the daemon's default (the
    // newest few in a plain status, status_default_ended_limit with "ended":true). With
    // "pending":true, at most this many of each pending list instead.
    std::optional<std::uint64_t> limit;
    // status: list the pending reaps (oldest first) and removals (next due first), at most
    // `limit` of each (status_default_pending_limit when unset), and no session. Excludes
    // `ended`.
    bool pending = false;
};

// A plain status lists every live session and only this many of the ended ones (the newest),
// with their total count: a status with 100,000 tombstones stays small and fast.
inline constexpr std::uint64_t status_default_newest_ended = 10;
// A status with "ended":true and no "limit" lists this many ended sessions, newest first.
inline constexpr std::uint64_t status_default_ended_limit = 1000;

// A plain status lists only this many of the pending reaps (the oldest), and of the pending
// network and volume removals (the next due), with their counts: a status stays small
// however many reaps a failing engine leaves queued.
inline constexpr std::uint64_t status_default_pending_listed = 20;
// A status with "pending":true and no "limit" lists this many of each.
inline constexpr std::uint64_t status_default_pending_limit = 1000;

// What a status request asks for (Request::ended, Request::limit, Request::pending).
struct StatusQuery {
    bool ended = false;
    std::optional<std::uint64_t> limit;
    bool pending = false;
};

// A message that breaks the protocol; what() names the problem.
class ProtocolViolation : public std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A failure to talk to the daemon (unreachable, timed out, error reply).
class ControlError : public std::runtime_error {
    using std::runtime_error::runtime_error;
};

// No daemon answered: the socket is missing, refused, or the exchange timed out or broke.
class DaemonUnreachable : public ControlError {
    using ControlError::ControlError;
};

struct Reply;

// The daemon answered {"ok":false,...}; what() is its message, reply() all of the reply (a
// refused orphan report names the container it resolved to).
class ErrorReply : public ControlError {
public:
    explicit ErrorReply(const std::string& what);
    ErrorReply(const std::string& what, Reply reply);
    const Reply& reply() const noexcept { return *reply_; }

private:
    std::shared_ptr<const Reply> reply_;
};

// Checks a session id: non-empty, at most max_session_id_bytes, printable ASCII without
// spaces. Throws ProtocolViolation naming the problem.
void validate_session_id(std::string_view session);
// The same rules for a container id or name, at most max_container_bytes.
void validate_container(std::string_view container);

// Parses one request line (without its '\n'; one trailing '\r' is tolerated). Strict: the
// line must be valid UTF-8 JSON, one object, with a known "op" and exactly the fields that op
// takes, each a string, each valid. Throws ProtocolViolation naming the problem.
Request parse_request(std::string_view line);
// Encodes a request as one line, '\n' included. Throws ProtocolViolation if a field is invalid.
std::string encode_request(const Request& request);

// Counts by kind of object ("containers"; more kinds as the daemon learns to track them).
using KindCounts = std::map<std::string, std::uint64_t>;

// A reply as it travels. Which fields are set depends on the op (absent = unset); a client
// ignores what it does not know, so the daemon may add fields.
struct Reply {
    bool ok = false;
    std::string error;        // when !ok
    std::string status_json;  // status: the "status" object as compact JSON text
    std::string metrics;      // metrics: the "metrics" text
    std::string json;         // parse_reply: the whole reply object as compact JSON text

    // orphan (also on a refusal, once the report was resolved to one container)
    std::string container;          // the full id the report was pinned to
    std::string name;               // the container's name, when inspected
    std::optional<bool> owned;      // it carries a session label under the config in force
                                    // (unset: queued by full id while the engine did not answer)
    std::optional<bool> queued;     // its reap is queued (false: refused, or a dry run)
    // orphan: the owning session; end, session: the session asked about
    std::string session;
    // end, session
    std::optional<bool> known;          // reaperd knew the session (containers, leases, tombstone)
    std::optional<bool> already_ended;  // end: it had ended before this request
    std::optional<bool> dry_run;        // reaperd removes nothing (reaper.dry_run)
    std::optional<KindCounts> reaps_queued;  // end: the session's reaps pending after the end
    // session
    std::string state;                    // "leased", "grace", "ended", "unclaimed"; "" unknown
    std::optional<bool> ready;            // reaperd has listed the engine: its counts are complete
    std::optional<KindCounts> remaining;  // what of the session reaperd still sees, by kind
    // lease: reaperd's log cap for the session's containers (logs.max_size in bytes; 0 = it caps
    // no log) and whether it wants a labelling proxy to set Docker's own rotation on the
    // containers it creates (logs.rotate_at_create). A daemon older than these sends neither.
    std::optional<std::uint64_t> log_max_size;
    std::optional<bool> log_rotate_at_create;

    // The sum over `remaining` (0 when unset).
    std::uint64_t remaining_total() const;
    // A session reply saying nothing of the session is left: ready, and every count in
    // "remaining" is 0. What `reaperctl end --wait` waits for.
    bool nothing_remains() const;
};

// Reply lines, '\n' included.
std::string encode_ok();
std::string encode_error(std::string_view message);
// {"ok":...,"error":... (when !ok), then every field of `reply` that is set}; the status and
// metrics replies have their own encoders below.
std::string encode_reply(const Reply& reply);
// {"ok":true,"status":<status_json>}; status_json must be a JSON object (it is re-encoded
// on one line). Throws ProtocolViolation otherwise.
std::string encode_status_reply(std::string_view status_json);
// {"ok":true,"metrics":"<text>"}
std::string encode_metrics_reply(std::string_view metrics_text);

// Parses one reply line (without its '\n'). Throws ProtocolViolation, naming a known field
// of the wrong type.
Reply parse_reply(std::string_view line);

// The socket path: $REAPERD_SOCKET if set and non-empty; else, for root, default_socket_path
// (the system daemon's); else, for any other user, their own daemon's
// $XDG_RUNTIME_DIR/reaperd/control.sock if that socket exists, then default_socket_path if
// that one does, else the user's own path (so a connection error names it).
std::string socket_path_from_environment();

// A lease held on one connection; released when destroyed or by release().
class Lease {
public:
    virtual ~Lease() = default;
    // Closes the connection, which ends the lease. Idempotent.
    virtual void release() noexcept = 0;
    // False once released or once the daemon closed the connection (checked without blocking).
    virtual bool alive() const = 0;
    // The connection's descriptor (readable/hung up when the daemon closes it), for callers
    // that wait in poll(); -1 once released.
    virtual int native_handle() const noexcept = 0;
    // A lease taken with proxy_lease(): sends the proxy's counts (totals) and waits for the
    // daemon's answer, at most `timeout`. Meanwhile alive() answers true without looking, so
    // it never takes the answer on its way for the daemon closing. Throws ErrorReply (the
    // daemon refused, and closed the lease), DaemonUnreachable (closed, timed out),
    // std::logic_error when released.
    virtual void update(const LabelledCounts& labelled, std::chrono::milliseconds timeout) = 0;
};

// The client side. Every call opens its own connection (a lease keeps its own); descriptors
// are close-on-exec, so a lease never leaks into a child process. Calls throw
// DaemonUnreachable when no daemon answers within the timeout, ErrorReply on
// {"ok":false}, ControlError for a garbled reply, and ProtocolViolation for an invalid
// argument (before connecting).
class ControlClient {
public:
    explicit ControlClient(std::string socket_path,
                           std::chrono::milliseconds timeout = std::chrono::milliseconds{2000});
    const std::string& socket_path() const noexcept { return socket_path_; }
    std::chrono::milliseconds timeout() const noexcept { return timeout_; }

    std::unique_ptr<Lease> lease(const std::string& session);
    // A lease whose holder runs a labelling proxy that labelled `labelled` so far; send later
    // counts with Lease::update(). An older daemon that does not know the field refuses it
    // (ErrorReply); LeaseKeeper then takes a plain lease.
    std::unique_ptr<Lease> proxy_lease(const std::string& session, const LabelledCounts& labelled);
    // The replies say what happened (see Reply); an older daemon answers just {"ok":true}.
    Reply end(const std::string& session);
    Reply report_orphan(const std::string& container_id, const std::string& session);
    // What reaperd still sees of one session (Reply::remaining); an older daemon refuses the
    // op (ErrorReply "unknown op").
    Reply session(const std::string& session);
    std::string status_json(const StatusQuery& query = {});  // the "status" object, as JSON text
    std::string metrics_text();

private:
    std::string socket_path_;
    std::chrono::milliseconds timeout_;
};

// ---- keeping a lease across daemon restarts ------------------------------------------------

// What a LeaseKeeper tells its observer.
enum class LeaseEvent {
    Lost,     // the daemon closed the lease's connection (it stopped, restarted or was killed)
    Failing,  // an attempt to take the lease failed; told once per run of failed attempts
    Taken,    // the keeper's thread took the lease (again)
};
const char* to_string(LeaseEvent event);

struct LeaseKeeperOptions {
    // The wait before the first retry after a lost lease or a failed attempt; each failure
    // doubles it, up to max_retry. With 100 ms .. 1 s a lease is back within about a second
    // of the daemon answering again, well inside any lease_grace of 3 s or more; a retry
    // against a missing socket is one failed connect() (25 us measured here).
    std::chrono::milliseconds first_retry{100};
    std::chrono::milliseconds max_retry{1000};
    // Called on the keeper's thread, one call at a time; `error` is the failed attempt's
    // exception for Failing, null otherwise. It must not call stop() or destroy the keeper;
    // what it throws is swallowed.
    std::function<void(LeaseEvent, const std::exception_ptr& error)> observer;
    // The holder runs a labelling proxy (`reaperctl run --own`): the lease says so and carries
    // the counts given to report_labelled(), and the keeper sends changed counts on the lease's
    // connection, at most once per update_interval, and once more when it stops. A daemon too
    // old to know proxies gets a plain lease and no counts.
    bool proxy = false;
    std::chrono::milliseconds update_interval{1000};
    // The keeper's only source of `now`: the waits between attempts and the update interval
    // are decided against it. A test passes a clock it moves forward itself, then calls
    // LeaseKeeper::settle(), instead of sleeping through a wait. The wait for a daemon's reply
    // (ControlClient's timeout) and stop()'s grace stay on real time. Called in start() and
    // on the keeper's thread.
    std::function<std::chrono::steady_clock::time_point()> clock = &std::chrono::steady_clock::now;
};

// Keeps a lease on one session for as long as the keeper lives: reaperd closes every lease
// when it stops or restarts (SIGTERM, SIGKILL, an upgrade) and gives the sessions that held
// one a fresh lease_grace to come back, so a holder that does not reconnect loses its
// containers. The library's Session and `reaperctl hold`/`run` use this one implementation.
//
// Who calls what: the owner calls start() once, then stop() or the destructor, from one
// thread; holds() may also be called from other threads between start() and the destructor.
//
// Guarantees:
// - After start(), one background thread keeps the lease: when its connection closes, it
//   reconnects after first_retry and then with doubling waits capped at max_retry, forever,
//   whatever the failure (unreachable, timed out, refused); it never gives up on its own.
// - holds() is checked at the moment of the call (the connection is polled, not a flag the
//   thread updates later): false before start(), while the daemon is away, after stop().
// - stop() returns within milliseconds whatever the thread is doing; while it waits for a
//   daemon's reply, within 50 ms (a reply on its way is still read, so a lease the daemon
//   granted is reported as Taken). Afterwards no thread runs and every descriptor is closed.
//   The descriptors are close-on-exec.
// - The thread blocks all signals, so process-directed signals reach the application's own
//   threads (reaperctl waits for them with a signalfd).
// - With options.proxy, counts reported before stop() reach the daemon before the lease is
//   released (stop() waits 50 ms at most for the daemon's answer): a session's end in
//   the journal names what its proxy labelled. Each (re)connection's lease request carries the
//   latest counts, so a restarted daemon learns them again.
class LeaseKeeper {
public:
    // Connects nowhere yet. Throws ProtocolViolation for an invalid session id (and
    // std::system_error when the process is out of descriptors).
    LeaseKeeper(ControlClient client, std::string session, LeaseKeeperOptions options = {});
    ~LeaseKeeper();  // stop()
    LeaseKeeper(const LeaseKeeper&) = delete;
    LeaseKeeper& operator=(const LeaseKeeper&) = delete;

    // Makes the first attempt on the calling thread (a caller that needs the lease before it
    // goes on has it on return), then starts the thread that keeps it. Returns that attempt's
    // failure (what ControlClient::lease throws; null when the lease is held); the thread
    // keeps trying either way, so a keeper started while the daemon is down takes the lease
    // when the daemon appears. Throws std::logic_error when called twice and std::system_error
    // when no thread can be started.
    std::exception_ptr start();
    // True while the lease is held and its connection is open.
    bool holds() const;
    // With options.proxy: the proxy's counts now (totals). Any thread, any time; cheap (the
    // keeper's thread sends them). Ignored without options.proxy.
    void report_labelled(const LabelledCounts& labelled);
    // Stops the thread and releases the lease. Idempotent, never throws.
    void stop() noexcept;
    // For tests that drive options.clock: wakes the keeper's thread and waits until it has
    // done what is due at the clock's time (an attempt, counts to send) and noticed a close
    // of the lease's connection that came before this call, and is waiting again. Returns
    // false if that did not happen within `limit` (real time), e.g. before start() or after
    // stop(). Thread-safe; changes nothing the thread would not have done on its own wake-up.
    bool settle(std::chrono::milliseconds limit = std::chrono::seconds{30});
    // The daemon's reply to the lease request of the lease held now, or of the last one held
    // (what it said of its log cap: Reply::log_max_size); nullopt before any lease was taken.
    // Any thread, any time.
    std::optional<Reply> lease_reply() const;

    const std::string& session() const noexcept { return session_; }

private:
    class Worker;
    ControlClient client_;
    std::string session_;
    LeaseKeeperOptions options_;
    std::unique_ptr<Worker> worker_;
};

}  // namespace reaper::control
