// A front in the test process, on a unix socket, in front of a real engine, that can lose the
// engine's answer to one request after the engine acted on it: the fault behind a request
// sent twice (a POST /containers/create whose answer was lost must not become two
// containers). Every request is forwarded on a connection of its own to the engine (framed
// by Poco: tests/support/http_forward.hpp) and its answer relayed whole, with a
// Content-Length; client connections are kept alive, so a client reuses them as it would the
// engine's. Not for event streams or hijacked connections (attach, exec with a TTY).
#pragma once

#include <reaper/client.hpp>

#include <memory>
#include <optional>
#include <string>

namespace reaper::test {

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

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace reaper::test
