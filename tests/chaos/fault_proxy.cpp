// fault_proxy: an HTTP proxy between reaperd and the engine, on unix sockets, that injects
// faults for the chaos run (scripts/chaos.sh).
//
//   fault_proxy --listen PATH --upstream PATH --mode-file PATH --stats FILE --seed N
//
// Requests and responses are framed by Poco (HTTPServer on the listening side, one
// HTTPClientSession per request to the engine: tests/support/http_forward.hpp). Which faults
// apply, and how often, is read from the mode file whenever it changes: lines
// "KEY PROBABILITY" (0..1), missing keys 0:
//   delete_409   a DELETE answered 409 {"message":...} without reaching the engine
//   delete_500   a DELETE answered 500
//   error_500    any other request (not /events) answered 500
//   slow         the request is held for up to slow_ms (a number, default 2000) first
//   hang         never answered; the connection stays open until the client gives up
//   delete_hang  the same, for a DELETE only (the stall window: 1 holds every DELETE past
//                reaperd's request timeout, as a crawling remove on a busy disk does)
//   halfclose    the proxy shuts down its sending side without answering, or (for a
//                non-stream request) sends the headers and half the body, then shuts down
//   garble       per /events line: truncated, replaced by garbage, or the stream cut mid-line
// Every fault injected is logged to stderr and counted in the stats file ("KEY COUNT" lines,
// rewritten each second). Draws come from one generator seeded by --seed, so a run's fault
// pattern follows from its seed and its request order.
#include "http_forward.hpp"
#include "relay_frame.hpp"

#include <Poco/JSON/Object.h>
#include <Poco/Net/HTTPRequestHandler.h>
#include <Poco/Net/HTTPRequestHandlerFactory.h>
#include <Poco/Net/HTTPResponse.h>
#include <Poco/Net/HTTPServerRequest.h>
#include <Poco/Net/HTTPServerRequestImpl.h>
#include <Poco/Net/HTTPServerResponse.h>
#include <Poco/Net/StreamSocket.h>
#include <Poco/StreamCopier.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using Poco::Net::HTTPResponse;
namespace http_forward = reaper::test::http_forward;
namespace relay = reaper::test::relay;

std::atomic<bool> stopping{false};

std::string timestamp() {
    auto now = std::chrono::system_clock::now().time_since_epoch();
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now).count();
    char text[32];
    std::snprintf(text, sizeof text, "%lld.%03lld", static_cast<long long>(ms / 1000),
                  static_cast<long long>(ms % 1000));
    return text;
}

class Mode {
public:
    explicit Mode(std::string path) : path_(std::move(path)) {}

    // The probabilities in force now (re-read when the file's mtime or size changed).
    std::map<std::string, double> current() {
        std::lock_guard lock(mutex_);
        std::error_code ec;
        auto mtime = fs::last_write_time(path_, ec);
        auto size = ec ? 0 : fs::file_size(path_, ec);
        if (ec) {
            values_.clear();
            return values_;
        }
        if (mtime != mtime_ || size != size_) {
            mtime_ = mtime;
            size_ = size;
            values_.clear();
            std::ifstream in(path_);
            std::string key;
            double value;
            while (in >> key >> value) values_[key] = value;
            std::ostringstream text;
            for (auto& [k, v] : values_) text << ' ' << k << '=' << v;
            std::cerr << timestamp() << " mode:" << (values_.empty() ? " none" : text.str())
                      << std::endl;
        }
        return values_;
    }

private:
    std::string path_;
    std::mutex mutex_;
    fs::file_time_type mtime_{};
    std::uintmax_t size_ = 0;
    std::map<std::string, double> values_;
};

class Dice {
public:
    explicit Dice(unsigned seed) : engine_(seed) {}
    double unit() {
        std::lock_guard lock(mutex_);
        return std::uniform_real_distribution<double>(0, 1)(engine_);
    }
    unsigned below(unsigned n) {
        std::lock_guard lock(mutex_);
        return std::uniform_int_distribution<unsigned>(0, n - 1)(engine_);
    }

private:
    std::mutex mutex_;
    std::mt19937 engine_;
};

class Stats {
public:
    void count(const std::string& fault) {
        std::lock_guard lock(mutex_);
        ++counts_[fault];
    }
    void write(const std::string& path) {
        std::ostringstream text;
        {
            std::lock_guard lock(mutex_);
            for (auto& [k, v] : counts_) text << k << ' ' << v << '\n';
        }
        std::string temp = path + ".tmp";
        std::ofstream(temp) << text.str();
        std::rename(temp.c_str(), path.c_str());
    }

private:
    std::mutex mutex_;
    std::map<std::string, unsigned long> counts_;
};

// True once the peer closed its side (or the socket failed); false after `limit`, or when
// the proxy is stopping.
bool wait_peer_gone(Poco::Net::StreamSocket& socket, std::chrono::milliseconds limit) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline && !stopping) {
        pollfd p{socket.impl()->sockfd(), POLLIN | POLLRDHUP, 0};
        int n = ::poll(&p, 1, 100);
        if (n < 0) continue;
        if (n == 0) continue;
        if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
        char byte;
        if (::recv(p.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0) return true;
        // A pipelined request waits for our answer: nothing to do until the peer goes.
        std::this_thread::sleep_for(100ms);
    }
    return false;
}

struct Shared {
    std::string upstream;
    Mode mode;
    Dice dice;
    Stats stats;
};

class ProxyHandler : public Poco::Net::HTTPRequestHandler {
public:
    explicit ProxyHandler(Shared& shared) : s_(shared) {}

    void handleRequest(Poco::Net::HTTPServerRequest& request,
                       Poco::Net::HTTPServerResponse& response) override {
        auto& client = static_cast<Poco::Net::HTTPServerRequestImpl&>(request).socket();
        std::string body = http_forward::read_body(request);
        const std::string what = request.getMethod() + " " + request.getURI();
        const bool events = request.getURI().find("/events") != std::string::npos;
        const bool remove = request.getMethod() == Poco::Net::HTTPRequest::HTTP_DELETE;
        auto p = s_.mode.current();
        auto chance = [&](const char* key) { return p.count(key) && s_.dice.unit() < p[key]; };

        if (chance("hang") || (remove && chance("delete_hang"))) {
            fault(remove && p.count("delete_hang") ? "delete_hang" : "hang", what);
            response.setKeepAlive(false);
            wait_peer_gone(client, 300s);
            client.shutdown();
            return;
        }
        if (chance("halfclose") && (events || s_.dice.below(2) == 0)) {
            fault("halfclose", what + " (no answer)");
            response.setKeepAlive(false);
            client.shutdownSend();
            wait_peer_gone(client, 300s);
            return;
        }
        bool cut_body = chance("halfclose");
        if (remove && chance("delete_409")) {
            fault("delete_409", what);
            auto id = request.getURI().substr(request.getURI().rfind('/') + 1);
            id = id.substr(0, id.find('?'));
            answer(response, HTTPResponse::HTTP_CONFLICT,
                   s_.dice.below(2) ? "chaos proxy: You cannot remove a running container " + id +
                                          ". Stop the container before attempting removal or "
                                          "force remove"
                                    : "chaos proxy: removal of container " + id +
                                          " is already in progress");
            return;
        }
        if ((remove && chance("delete_500")) || (!remove && !events && chance("error_500"))) {
            fault(remove ? "delete_500" : "error_500", what);
            answer(response, HTTPResponse::HTTP_INTERNAL_SERVER_ERROR,
                   "chaos proxy: injected server error");
            return;
        }
        if (chance("slow")) {
            double slow_ms = p.count("slow_ms") ? p["slow_ms"] : 2000;
            auto delay = std::chrono::milliseconds(static_cast<long>(s_.dice.unit() * slow_ms));
            fault("slow", what + " +" + std::to_string(delay.count()) + "ms");
            if (wait_peer_gone(client, delay)) return;
        }
        forward(request, response, client, body, events, cut_body, what);
    }

private:
    void fault(const std::string& kind, const std::string& what) {
        s_.stats.count(kind);
        std::cerr << timestamp() << " fault " << kind << ": " << what << std::endl;
    }

    static void answer(Poco::Net::HTTPServerResponse& response, HTTPResponse::HTTPStatus status,
                       const std::string& message) {
        Poco::JSON::Object object;
        object.set("message", message);
        std::ostringstream text;
        object.stringify(text);
        response.setStatus(status);
        response.setContentType("application/json");
        response.setContentLength(static_cast<std::streamsize>(text.str().size()));
        response.send() << text.str();
    }

    void forward(Poco::Net::HTTPServerRequest& request, Poco::Net::HTTPServerResponse& response,
                 Poco::Net::StreamSocket& client, const std::string& body, bool events,
                 bool cut_body, const std::string& what) {
        std::optional<http_forward::Exchange> exchange;
        try {
            exchange.emplace(s_.upstream);
        } catch (const Poco::Exception& e) {
            // The engine is down: the client sees its connection break, as with no proxy.
            std::cerr << timestamp() << " upstream unreachable (" << e.displayText()
                      << "): " << what << std::endl;
            response.setKeepAlive(false);
            client.shutdown();
            return;
        }
        if (!events) exchange->socket().setReceiveTimeout(Poco::Timespan(300, 0));
        std::istream* from = nullptr;
        try {
            from = &exchange->send(request, request.getURI(), body);
        } catch (const Poco::Exception& e) {
            std::cerr << timestamp() << " upstream failed (" << e.displayText() << "): " << what
                      << std::endl;
            response.setKeepAlive(false);
            client.shutdown();
            return;
        }
        exchange->copy_head(response);

        if (events && exchange->response().getStatus() == HTTPResponse::HTTP_OK) {
            relay_events(*from, response, client, exchange->socket(), what);
            return;
        }
        std::string reply;
        try {
            Poco::StreamCopier::copyToString(*from, reply);
        } catch (const Poco::Exception& e) {
            std::cerr << timestamp() << " upstream body failed (" << e.displayText()
                      << "): " << what << std::endl;
            response.setKeepAlive(false);
            client.shutdown();
            return;
        }
        response.setContentLength(static_cast<std::streamsize>(reply.size()));
        if (cut_body && reply.size() > 1) {
            fault("halfclose", what + " (half the body)");
            response.setKeepAlive(false);
            response.send() << reply.substr(0, reply.size() / 2) << std::flush;
            client.shutdownSend();
            wait_peer_gone(client, 300s);
            return;
        }
        response.send() << reply;
    }

    // Copies the stream line by line, flushing each (the engine sends one event per line);
    // a watch ends it when the client goes away, which a blocked read would not notice.
    void relay_events(std::istream& from, Poco::Net::HTTPServerResponse& response,
                      Poco::Net::StreamSocket& client, Poco::Net::StreamSocket& upstream,
                      const std::string& what) {
        http_forward::HangupWatch watch(client, [&] {
            try {
                upstream.shutdown();
            } catch (const Poco::Exception&) {
                // Already closed by the engine.
            }
        });
        response.setChunkedTransferEncoding(true);
        response.setKeepAlive(false);
        std::ostream& to = response.send();
        to.flush();
        std::string line;
        try {
            while (to && std::getline(from, line)) {
                auto p = s_.mode.current();
                if (p.count("garble") && s_.dice.unit() < p["garble"]) {
                    auto kind = s_.dice.below(3);
                    if (kind == 2) {
                        fault("garble_cut", what);
                        to << line.substr(0, line.size() / 2) << std::flush;
                        break;
                    }
                    if (kind == 1) {
                        fault("garble_garbage", what);
                        line = "\x01{\"Type\":\"container\",\"Action\":\xff\xfe}garbage";
                    } else {
                        fault("garble_truncated", what);
                        line.resize(s_.dice.below(static_cast<unsigned>(line.size())));
                    }
                }
                to << line << '\n' << std::flush;
            }
        } catch (const Poco::Exception&) {
            // Either side went away: the stream is over.
        }
        try {
            client.shutdown();
        } catch (const Poco::Exception&) {
            // The client closed first.
        }
    }

    Shared& s_;
};

class Factory : public Poco::Net::HTTPRequestHandlerFactory {
public:
    explicit Factory(Shared& shared) : s_(shared) {}
    Poco::Net::HTTPRequestHandler* createRequestHandler(
        const Poco::Net::HTTPServerRequest&) override {
        return new ProxyHandler(s_);
    }

private:
    Shared& s_;
};

int usage() {
    std::cerr << "usage: fault_proxy --listen PATH --upstream PATH --mode-file PATH --stats FILE"
                 " --seed N\n";
    return 64;
}

}  // namespace

int main(int argc, char** argv) {
    const auto flags =
        relay::parse_flags(argc, argv, {"--listen", "--upstream", "--mode-file", "--stats", "--seed"});
    if (!flags) return usage();
    auto args = *flags;
    const sigset_t stop = relay::block_stop_signals();

    Shared shared{args["--upstream"], Mode(args["--mode-file"]),
                  Dice(static_cast<unsigned>(std::stoul(args["--seed"]))), Stats{}};
    relay::UnixHttpServer server(args["--listen"], new Factory(shared));
    ::chmod(args["--listen"].c_str(), 0660);
    std::cerr << timestamp() << " fault_proxy listening on " << args["--listen"] << " -> "
              << args["--upstream"] << ", seed " << args["--seed"] << std::endl;

    std::thread stats_writer([&] {
        while (!stopping) {
            shared.stats.write(args["--stats"]);
            std::this_thread::sleep_for(1s);
        }
    });
    const int signal_number = relay::wait_for_stop(stop);
    stopping = true;
    stats_writer.join();
    shared.stats.write(args["--stats"]);
    std::cerr << timestamp() << " fault_proxy stopping (signal " << signal_number << ")"
              << std::endl;
    relay::end_now(args["--listen"]);
}
