// The control protocol between reaperd and its clients (the library's Session, reaperctl),
// implemented once here for both sides.
//
// Wire format: over a unix stream socket, each message is one JSON object on one line
// ('\n'-terminated, at most max_message_bytes). The client sends requests, the daemon answers
// each with one reply line: {"ok":true,...} or {"ok":false,"error":"<what was wrong>"}.
// A malformed or oversized request gets an error reply and the daemon closes the connection.
//
//   {"op":"lease","session":"S"}              -> {"ok":true}; the lease lasts while the
//                                                 connection stays open
//   {"op":"end","session":"S"}                -> {"ok":true}; reap S's containers now
//   {"op":"orphan","container":"ID","session":"S"} -> {"ok":true}; reap that container now
//   {"op":"status"}                           -> {"ok":true,"status":{...}}
//   {"op":"metrics"}                          -> {"ok":true,"metrics":"<prometheus text>"}
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

namespace reaper::control {

inline constexpr std::size_t max_message_bytes = 64 * 1024;  // a request line, '\n' excluded
inline constexpr std::size_t max_reply_bytes = 16 * 1024 * 1024;  // status/metrics can be large
inline constexpr std::size_t max_session_id_bytes = 256;
inline constexpr std::size_t max_container_bytes = 256;  // an id or a name
inline constexpr const char* default_socket_path = "/run/reaperd/control.sock";

enum class Op { Lease, End, Orphan, Status, Metrics };
const char* to_string(Op op);

struct Request {
    Op op = Op::Status;
    std::string session;    // lease, end; optional for orphan
    std::string container;  // orphan
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

// The daemon answered {"ok":false,...}; what() is its message.
class ErrorReply : public ControlError {
    using ControlError::ControlError;
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

// Reply lines, '\n' included.
std::string encode_ok();
std::string encode_error(std::string_view message);
// {"ok":true,"status":<status_json>}; status_json must be a JSON object (it is re-encoded
// on one line). Throws ProtocolViolation otherwise.
std::string encode_status_reply(std::string_view status_json);
// {"ok":true,"metrics":"<text>"}
std::string encode_metrics_reply(std::string_view metrics_text);

struct Reply {
    bool ok = false;
    std::string error;        // when !ok
    std::string status_json;  // the "status" object as compact JSON text, when present
    std::string metrics;      // the "metrics" text, when present
};
// Parses one reply line (without its '\n'). Throws ProtocolViolation.
Reply parse_reply(std::string_view line);

// The socket path: $REAPERD_SOCKET if set and non-empty, else default_socket_path.
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
    void end(const std::string& session);
    void report_orphan(const std::string& container_id, const std::string& session);
    std::string status_json();  // the "status" object, as JSON text
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
class LeaseKeeper {
public:
    // Connects nowhere yet. Throws ProtocolViolation for an invalid session id.
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
    // Stops the thread and releases the lease. Idempotent, never throws.
    void stop() noexcept;

    const std::string& session() const noexcept { return session_; }

private:
    class Worker;
    ControlClient client_;
    std::string session_;
    LeaseKeeperOptions options_;
    std::unique_ptr<Worker> worker_;
};

}  // namespace reaper::control
