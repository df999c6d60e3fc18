#include "fault_front.hpp"

#include "engine.hpp"
#include "http_forward.hpp"

#include <Poco/Net/HTTPRequestHandler.h>
#include <Poco/Net/HTTPRequestHandlerFactory.h>
#include <Poco/Net/HTTPServer.h>
#include <Poco/Net/HTTPServerParams.h>
#include <Poco/Net/HTTPServerRequestImpl.h>
#include <Poco/Net/ServerSocket.h>
#include <Poco/ThreadPool.h>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <stdexcept>

namespace reaper::test {

using std::chrono::milliseconds;

bool StallWindow::holds(const std::string& request_method, milliseconds at) const {
    if (at < begin || at >= begin + length) return false;
    return kind == Kind::silent || method.empty() || method == request_method;
}

std::optional<StallWindow> stall_of(const std::vector<StallWindow>& schedule, const std::string& method,
                                    milliseconds at) {
    for (const auto& window : schedule)
        if (window.holds(method, at)) return window;
    return std::nullopt;
}

namespace {

// The path a request names, as the engine routes it: without its /vX.Y prefix and query.
std::string route_of(const std::string& uri) {
    return http_forward::split_version(uri.substr(0, uri.find('?'))).rest;
}

// Ends the client's connection without an answer; Poco's server sends none when the handler
// sent none.
void hang_up(Poco::Net::HTTPServerResponse& response, Poco::Net::StreamSocket& client) {
    response.setKeepAlive(false);
    try {
        client.shutdown();
    } catch (const Poco::Exception&) {
        // The client left first.
    }
}

}  // namespace

struct FaultFront::Impl {
    std::string upstream;
    std::string dir;
    mutable std::mutex mutex;
    std::optional<std::pair<std::string, std::string>> drop_next;  // method, route
    std::optional<DroppedAnswer> dropped;
    // Room for every request a stalled reaperd and its tests keep waiting, and the streams.
    Poco::ThreadPool pool{2, 128};
    std::unique_ptr<Poco::Net::HTTPServer> server;
    // The stall schedule, guarded by `mutex`; `changed` wakes held requests at heal().
    std::condition_variable changed;
    std::vector<StallWindow> schedule;
    std::chrono::steady_clock::time_point stall_start = std::chrono::steady_clock::now();
    StallCounts counts;

    milliseconds since_stall() const {
        return std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - stall_start);
    }

    // Holds a request as the schedule says; false when its client hung up meanwhile (then it
    // is dropped, as the engine never saw it).
    bool hold(Poco::Net::StreamSocket& client, const std::string& method) {
        std::unique_lock lock(mutex);
        const auto window = stall_of(schedule, method, since_stall());
        if (!window) return true;
        const bool slow = window->kind == StallWindow::Kind::slow;
        ++(slow ? counts.slowed : counts.held);
        ++counts.waiting;
        bool gone = false;
        lock.unlock();
        {
            http_forward::HangupWatch watch(client, [&] {
                {
                    std::lock_guard guard(mutex);
                    gone = true;
                }
                changed.notify_all();
            });
            lock.lock();
            if (slow) {
                changed.wait_for(lock, window->delay, [&] { return gone; });
            } else {
                // Until no window holds it any more (its end, or heal()), or its client leaves.
                while (!gone) {
                    const auto now = since_stall();
                    const auto holding = stall_of(schedule, method, now);
                    if (!holding || holding->kind == StallWindow::Kind::slow) break;
                    changed.wait_for(lock, holding->begin + holding->length - now);
                }
            }
            --counts.waiting;
            if (gone) ++counts.dropped;
            lock.unlock();  // the watch's thread may want the lock before it ends
        }
        return !gone;
    }

    // While a silent window lasts, an open event stream relays nothing.
    void wait_while_silent() {
        std::unique_lock lock(mutex);
        for (;;) {
            const auto now = since_stall();
            const auto holding = stall_of(schedule, "GET", now);
            if (!holding || holding->kind != StallWindow::Kind::silent) return;
            changed.wait_for(lock, holding->begin + holding->length - now);
        }
    }

    // GET /events: relayed line by line, each flushed (the engine sends one event per line);
    // a watch ends it when the client goes away, which a blocked read would not notice.
    void relay_events(Poco::Net::HTTPServerRequest& request, Poco::Net::HTTPServerResponse& response,
                      Poco::Net::StreamSocket& client) {
        try {
            http_forward::Exchange exchange(upstream);
            http_forward::HangupWatch watch(client, [&] {
                try {
                    exchange.socket().shutdown();
                } catch (const Poco::Exception&) {
                    // The engine closed it already.
                }
            });
            std::istream& from = exchange.send(request, request.getURI(), "");
            exchange.copy_head(response);
            response.setChunkedTransferEncoding(true);
            response.setKeepAlive(false);
            std::ostream& to = response.send();
            to.flush();
            std::string line;
            while (to && std::getline(from, line)) {
                wait_while_silent();
                to << line << '\n' << std::flush;
            }
        } catch (const Poco::Exception&) {
            // Either side went away: the stream is over.
        }
    }

    // True (once) when this request's answer is the one to lose.
    bool take_drop(const std::string& method, const std::string& route) {
        std::lock_guard lock(mutex);
        if (!drop_next || drop_next->first != method || drop_next->second != route) return false;
        drop_next.reset();
        return true;
    }

    void handle(Poco::Net::HTTPServerRequest& request, Poco::Net::HTTPServerResponse& response) {
        auto& client = static_cast<Poco::Net::HTTPServerRequestImpl&>(request).socket();
        const std::string body = http_forward::read_body(request);
        if (!hold(client, request.getMethod())) return hang_up(response, client);
        const std::string route = route_of(request.getURI());
        if (request.getMethod() == "GET" && route == "/events") return relay_events(request, response, client);
        const bool drop = take_drop(request.getMethod(), route);
        const int connections = server->totalConnections();
        std::string reply;
        try {
            http_forward::Exchange exchange(upstream);
            exchange.socket().setReceiveTimeout(Poco::Timespan(300, 0));
            std::istream& from = exchange.send(request, request.getURI(), body);
            Poco::StreamCopier::copyToString(from, reply);
            if (drop) {
                std::lock_guard lock(mutex);
                dropped = DroppedAnswer{request.getMethod() + " " + request.getURI(),
                                        static_cast<int>(exchange.response().getStatus()), reply,
                                        connections};
                return hang_up(response, client);
            }
            exchange.copy_head(response);
        } catch (const Poco::Exception&) {
            // The engine is down or broke the connection: so does the front.
            return hang_up(response, client);
        }
        response.setContentLength(static_cast<std::streamsize>(reply.size()));
        response.send() << reply;
    }

    struct Handler : Poco::Net::HTTPRequestHandler {
        explicit Handler(Impl& front) : front(front) {}
        void handleRequest(Poco::Net::HTTPServerRequest& request,
                           Poco::Net::HTTPServerResponse& response) override {
            front.handle(request, response);
        }
        Impl& front;
    };

    struct Factory : Poco::Net::HTTPRequestHandlerFactory {
        explicit Factory(Impl& front) : front(front) {}
        Poco::Net::HTTPRequestHandler* createRequestHandler(const Poco::Net::HTTPServerRequest&) override {
            return new Handler(front);
        }
        Impl& front;
    };
};

FaultFront::FaultFront(const std::string& upstream_socket) : impl_(std::make_unique<Impl>()) {
    // A write to a client that left is an error to handle, not a signal that ends the test.
    std::signal(SIGPIPE, SIG_IGN);
    impl_->upstream = upstream_socket;
    char pattern[] = "/tmp/reaper-fault-front.XXXXXX";
    if (!::mkdtemp(pattern)) throw std::runtime_error("mkdtemp failed for the fault front");
    impl_->dir = pattern;
    Poco::Net::ServerSocket listener;
    try {
        listener.bind(Poco::Net::SocketAddress(socket_path()));
        listener.listen(16);
    } catch (const Poco::Exception& e) {
        std::filesystem::remove_all(impl_->dir);
        throw std::runtime_error("fault front cannot listen on " + socket_path() + ": " + e.displayText());
    }
    auto params = Poco::AutoPtr<Poco::Net::HTTPServerParams>(new Poco::Net::HTTPServerParams);
    params->setKeepAlive(true);
    params->setMaxKeepAliveRequests(0);
    params->setKeepAliveTimeout(Poco::Timespan(300, 0));
    params->setTimeout(Poco::Timespan(300, 0));
    impl_->server = std::make_unique<Poco::Net::HTTPServer>(new Impl::Factory(*impl_), impl_->pool, listener, params);
    impl_->server->start();
}

FaultFront::~FaultFront() {
    heal();
    impl_->server->stopAll(true);
    impl_->pool.joinAll();
    std::error_code ec;
    std::filesystem::remove_all(impl_->dir, ec);
}

std::string FaultFront::socket_path() const { return impl_->dir + "/docker.sock"; }

ClientOptions FaultFront::client_options() const {
    ClientOptions options = engine().client_options();
    options.address = EngineAddress::parse("unix://" + socket_path());
    return options;
}

void FaultFront::drop_answer_of_next(const std::string& method, const std::string& path) {
    std::lock_guard lock(impl_->mutex);
    impl_->drop_next.emplace(method, path);
}

std::optional<FaultFront::DroppedAnswer> FaultFront::dropped() const {
    std::lock_guard lock(impl_->mutex);
    return impl_->dropped;
}

int FaultFront::connections_accepted() const { return impl_->server->totalConnections(); }

void FaultFront::stall(std::vector<StallWindow> schedule) {
    {
        std::lock_guard lock(impl_->mutex);
        impl_->schedule = std::move(schedule);
        impl_->stall_start = std::chrono::steady_clock::now();
    }
    impl_->changed.notify_all();
}

void FaultFront::heal() {
    {
        std::lock_guard lock(impl_->mutex);
        impl_->schedule.clear();
    }
    impl_->changed.notify_all();
}

FaultFront::StallCounts FaultFront::stall_counts() const {
    std::lock_guard lock(impl_->mutex);
    return impl_->counts;
}

}  // namespace reaper::test
