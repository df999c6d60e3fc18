// The forwarding core of the test proxies that sit in front of a private engine
// (tests/chaos/fault_proxy.cpp, tests/harness/engine_front.cpp): a request read off the
// proxy's HTTPServer is sent to the engine's unix socket on a connection of its own, and the
// response head is copied back. What the proxy does with the body is its own business. Both
// sides are framed by Poco; nothing here writes HTTP by hand.
#pragma once

#include <Poco/Net/HTTPClientSession.h>
#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/HTTPResponse.h>
#include <Poco/Net/HTTPServerRequest.h>
#include <Poco/Net/HTTPServerResponse.h>
#include <Poco/Net/SocketAddress.h>
#include <Poco/Net/StreamSocket.h>
#include <Poco/StreamCopier.h>
#include <Poco/String.h>

#include "unique_fd.hpp"

#include <cerrno>
#include <cstdint>
#include <functional>
#include <istream>
#include <memory>
#include <string>
#include <system_error>
#include <thread>

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

namespace reaper::test::http_forward {

// Headers about one hop's connection or framing: each side of the proxy sets its own.
inline bool is_hop_by_hop(const std::string& name) {
    for (const char* h : {"Connection", "Keep-Alive", "Transfer-Encoding", "Content-Length",
                          "Host", "Proxy-Connection", "TE", "Trailer", "Upgrade"})
        if (Poco::icompare(name, h) == 0) return true;
    return false;
}

// A request target as the engine's router splits it: the version of its optional /vX.Y
// prefix ("" when it has none) and the rest, from the slash after the prefix.
struct VersionedTarget {
    std::string version;
    std::string rest;
};
inline VersionedTarget split_version(const std::string& target) {
    const auto slash = target.find('/', 1);
    if (target.size() > 2 && target[0] == '/' && target[1] == 'v' && target[2] >= '0' && target[2] <= '9' &&
        slash != std::string::npos && target.find_first_not_of("0123456789.", 2) == slash)
        return {target.substr(2, slash - 2), target.substr(slash)};
    return {"", target};
}

// The request's body, whole (Content-Length or chunked). A request with neither has none, as
// the engine's Go server reads it; Poco would read such a POST until the client hangs up.
inline std::string read_body(Poco::Net::HTTPServerRequest& request) {
    std::string body;
    if (request.hasContentLength() || request.getChunkedTransferEncoding())
        Poco::StreamCopier::copyToString(request.stream(), body);
    return body;
}

// One request to the engine, on a connection that carries only it (so a proxied stream or a
// blocked wait holds no one else's connection, and ending it is a shutdown of this socket).
class Exchange {
public:
    // Connects; throws Poco::Exception when the engine's socket does not answer.
    explicit Exchange(const std::string& upstream_path)
        : session_(connect(upstream_path)) {
        session_.setKeepAlive(false);
    }

    // The upstream socket: for a receive timeout before send(), or a shutdown from another
    // thread to end a blocked read.
    Poco::Net::StreamSocket& socket() { return socket_; }

    // Sends `request`'s method and end-to-end headers to `uri` with `body` (re-framed with a
    // Content-Length), reads the response head and returns the response body's stream.
    // Throws Poco::Exception when the engine fails before answering.
    std::istream& send(const Poco::Net::HTTPServerRequest& request, const std::string& uri,
                       const std::string& body) {
        Poco::Net::HTTPRequest out(request.getMethod(), uri, Poco::Net::HTTPMessage::HTTP_1_1);
        for (const auto& [name, value] : request)
            if (!is_hop_by_hop(name)) out.set(name, value);
        out.setHost("engine");  // the engine's Go server requires one
        out.setContentLength(static_cast<std::streamsize>(body.size()));
        session_.sendRequest(out) << body;
        return session_.receiveResponse(response_);
    }

    const Poco::Net::HTTPResponse& response() const { return response_; }

    // The response's status, reason and end-to-end headers onto `to`; its framing is left
    // to the caller, who knows whether it relays the body as it is.
    void copy_head(Poco::Net::HTTPServerResponse& to) const {
        to.setStatus(response_.getStatus());
        to.setReason(response_.getReason());
        for (const auto& [name, value] : response_)
            if (!is_hop_by_hop(name)) to.set(name, value);
    }

private:
    // Poco's HTTPClientSession cannot connect a unix address itself (RECIPES.md section 2):
    // the socket is connected first and the session built on it.
    Poco::Net::StreamSocket& connect(const std::string& path) {
        socket_.connect(Poco::Net::SocketAddress(path), Poco::Timespan(5, 0));
        return socket_;
    }

    Poco::Net::StreamSocket socket_;
    Poco::Net::HTTPClientSession session_;
    Poco::Net::HTTPResponse response_;
};

// Calls `on_hangup` (on a thread of its own) if the peer of `socket` hangs up before this
// watch is destroyed. A relay blocked reading the engine (an events stream, a wait) learns
// that its client left only this way; the usual `on_hangup` shuts the upstream socket down
// so that read ends. Destroying the watch wakes its thread at once.
class HangupWatch {
public:
    HangupWatch(Poco::Net::StreamSocket& socket, std::function<void()> on_hangup)
        : wake_fd_(::eventfd(0, EFD_CLOEXEC)) {
        if (!wake_fd_) throw std::system_error(errno, std::generic_category(), "eventfd");
        int peer_fd = socket.impl()->sockfd();
        thread_ = std::thread([this, peer_fd, on_hangup = std::move(on_hangup)] {
            // POLLRDHUP without POLLIN: a pipelined request waiting for its turn is not a
            // hang-up, and must not make this loop spin.
            pollfd fds[2] = {{peer_fd, POLLRDHUP, 0}, {wake_fd_.get(), POLLIN, 0}};
            while (::poll(fds, 2, -1) < 0) {
            }
            if (fds[1].revents == 0) on_hangup();
        });
    }
    ~HangupWatch() {
        std::uint64_t one = 1;
        [[maybe_unused]] auto n = ::write(wake_fd_.get(), &one, sizeof one);
        thread_.join();
    }
    HangupWatch(const HangupWatch&) = delete;
    HangupWatch& operator=(const HangupWatch&) = delete;

private:
    reaper::detail::UniqueFd wake_fd_;
    std::thread thread_;
};

}  // namespace reaper::test::http_forward
