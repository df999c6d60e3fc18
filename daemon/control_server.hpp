// The daemon's end of the control socket (protocol: lib/include/reaper/control.hpp,
// docs/control-protocol.md). One thread serves every connection with poll(), so thousands of
// idle leases cost one descriptor each and no thread; a second one builds status and metrics
// answers, and a third resolves orphan reports (an engine call).
#pragma once

#include "config.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace reaperd {

// Thrown by a handler call to refuse a valid request (an orphan report naming no container,
// or one reaperd does not own): the client gets what() as the error, as is; the connection
// stays open.
class Refused : public std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Called from the control server's threads: lease_opened, lease_closed and end_session from
// the one serving every connection (in order, one at a time; they should return quickly,
// since no other connection is served meanwhile); status_json and metrics_text from a second
// thread, and orphan_reported from a third (it may wait for the engine), so a slow answer
// delays only its asker (and, for orphans, the orphan reports queued behind it).
// Implementations must be thread-safe (the daemon posts each call to its main loop's queue).
// An exception thrown by a call becomes an error reply to that client.
class ControlHandler {
public:
    virtual ~ControlHandler() = default;
    virtual void lease_opened(const std::string& session, std::uint64_t connection_id) = 0;
    virtual void lease_closed(const std::string& session, std::uint64_t connection_id) = 0;
    virtual void end_session(const std::string& session) = 0;
    // `container` as the reporter gave it (an id, an id prefix or a name); `session` may be "".
    virtual void orphan_reported(const std::string& container, const std::string& session) = 0;
    virtual std::string status_json() = 0;   // the JSON object returned as "status"
    virtual std::string metrics_text() = 0;  // Prometheus text exposition
};

struct ControlServerLimits {
    // A connection that is not a lease and sends no complete request for this long is closed
    // (so half-sent lines cannot pin descriptors forever). Leases never time out.
    std::chrono::milliseconds idle_timeout{std::chrono::seconds{30}};
    // Connections beyond this get an error reply and are closed at once.
    std::size_t max_connections = 4096;
};

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
    // metrics or orphan call already running in the handler to return. Idempotent.
    void stop();

    const std::string& socket_path() const noexcept;
    // Connections open right now (leases included); for tests and status.
    std::size_t connection_count() const noexcept;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace reaperd
