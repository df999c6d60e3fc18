// The optional HTTP listener a Prometheus scraper reads: GET /metrics answers with the
// text exposition format. Off unless metrics.listen is set. The daemon owns what is served;
// this only speaks HTTP.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace reaperd {

class MetricsHttpServer {
public:
    // Returns the whole Prometheus text exposition. Called on the listener's own threads,
    // so it must be thread-safe (the daemon's ControlHandler::metrics_text is).
    using Render = std::function<std::string()>;

    // Binds `listen` ("127.0.0.1:9324", "[::1]:9324", "localhost:9324"; port 0 picks a free
    // one). Throws std::runtime_error naming the address when it cannot be parsed or bound.
    MetricsHttpServer(const std::string& listen, Render render);
    ~MetricsHttpServer();  // stop()
    MetricsHttpServer(const MetricsHttpServer&) = delete;
    MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

    void start();  // serves on its own threads
    // Stops accepting and waits for requests in flight to finish. Idempotent; a stopped
    // listener does not start again.
    void stop();

    std::uint16_t port() const;  // the bound port

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace reaperd
