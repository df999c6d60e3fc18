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

    std::unique_ptr<Lease> lease(const std::string& session);
    void end(const std::string& session);
    void report_orphan(const std::string& container_id, const std::string& session);
    std::string status_json();  // the "status" object, as JSON text
    std::string metrics_text();

private:
    std::string socket_path_;
    std::chrono::milliseconds timeout_;
};

}  // namespace reaper::control
