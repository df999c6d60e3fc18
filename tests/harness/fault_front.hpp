// A front in the test process, on a unix socket, in front of a real engine, that can lose the
// engine's answer to one request after the engine acted on it: the fault behind a request
// sent twice (a POST /containers/create whose answer was lost must not become two
// containers). Every request is forwarded on a connection of its own to the engine (framed
// by Poco: tests/support/http_forward.hpp) and its answer relayed whole, with a
// Content-Length; client connections are kept alive, so a client reuses them as it would the
// engine's. GET /events is relayed line by line as the engine sends it, so reaperd can run
// behind the front. Not for hijacked connections (attach, exec with a TTY).
//
// It can also make the engine stall on a schedule (issue 23): windows, in real time from the
// call to stall(), in which requests are held before they are forwarded (StallWindow).
#pragma once

#include <reaper/client.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace reaper::test {

// One window of a stall schedule.
struct StallWindow {
    enum class Kind {
        // Each request that matches `method` is held, not forwarded, until the window ends;
        // one whose client hangs up meanwhile (its request_timeout passed) is dropped,
        // never reaching the engine. One still waiting at the end is forwarded then.
        hang,
        // Each request that matches `method` is forwarded `delay` after it came.
        slow,
        // The engine accepts connections and says nothing: every request is held as in
        // `hang`, and open event streams relay nothing until the window ends.
        silent,
    };
    Kind kind = Kind::hang;
    std::chrono::milliseconds begin{0};   // after stall() was called
    std::chrono::milliseconds length{0};
    std::string method = "DELETE";        // hang and slow: "" = every request
    std::chrono::milliseconds delay{0};   // slow only

    // Whether this window holds a request of `method` `at` (time since stall()).
    bool holds(const std::string& request_method, std::chrono::milliseconds at) const;
};

// What a schedule does to one request `at` (time since stall()), pure: the window that
// applies (the first in the schedule that holds it), or nullopt: forward at once.
std::optional<StallWindow> stall_of(const std::vector<StallWindow>& schedule,
                                    const std::string& method, std::chrono::milliseconds at);

class FaultFront {
public:
    // Listens on <a temp dir>/docker.sock, forwarding to the engine's unix socket
    // `upstream_socket`; serves from return on. The destructor stops it (connections still
    // open are cut) and removes the dir.
    explicit FaultFront(const std::string& upstream_socket);
    ~FaultFront();
    FaultFront(const FaultFront&) = delete;
    FaultFront& operator=(const FaultFront&) = delete;

    std::string socket_path() const;
    // The harness engine's client options with the front's address.
    ClientOptions client_options() const;

    // The next request with `method` on `path` (without the /vX.Y prefix and the query, e.g.
    // "/containers/create") is forwarded, the engine's whole answer read, and then the
    // client's connection closed without a byte of it: the client sees the connection drop
    // with its request sent, while the engine has acted. Once; later ones pass.
    void drop_answer_of_next(const std::string& method, const std::string& path);

    struct DroppedAnswer {
        std::string request;       // "POST /v1.41/containers/create?..."
        int status = 0;            // the engine's answer the client never saw
        std::string body;
        int connections_accepted = 0;  // connections_accepted() when it came
    };
    // The answer dropped, once one was.
    std::optional<DroppedAnswer> dropped() const;

    // Client connections accepted so far. A request that comes while this is still what it
    // was after an earlier request went on a connection that carried one before it.
    int connections_accepted() const;

    // Starts `schedule` now, replacing any earlier one. Thread-safe.
    void stall(std::vector<StallWindow> schedule);
    // Ends every window now: held requests are forwarded (or dropped, if their client left).
    void heal();
    struct StallCounts {
        int held = 0;     // requests a hang or silent window held
        int dropped = 0;  // of those, the ones whose client hung up before the window ended
        int slowed = 0;   // requests a slow window delayed
        int waiting = 0;  // held or slowed right now
    };
    StallCounts stall_counts() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace reaper::test
