#include "metrics_http.hpp"

#include "config.hpp"

#include <Poco/Exception.h>
#include <Poco/Net/HTTPRequestHandler.h>
#include <Poco/Net/HTTPRequestHandlerFactory.h>
#include <Poco/Net/HTTPServer.h>
#include <Poco/Net/HTTPServerParams.h>
#include <Poco/Net/HTTPServerRequest.h>
#include <Poco/Net/HTTPServerResponse.h>
#include <Poco/Net/ServerSocket.h>
#include <Poco/Net/SocketAddress.h>
#include <Poco/ThreadPool.h>

#include <exception>
#include <stdexcept>
#include <utility>

namespace reaperd {

namespace {

using Poco::Net::HTTPResponse;

void answer(Poco::Net::HTTPServerResponse& response, HTTPResponse::HTTPStatus status,
            const std::string& content_type, const std::string& body, bool with_body) {
    response.setStatus(status);
    response.setContentType(content_type);
    response.setContentLength(static_cast<std::streamsize>(body.size()));
    if (with_body) {
        response.send() << body;
    } else {
        response.send();
    }
}

class MetricsHandler : public Poco::Net::HTTPRequestHandler {
public:
    explicit MetricsHandler(const MetricsHttpServer::Render& render) : render_(render) {}

    void handleRequest(Poco::Net::HTTPServerRequest& request,
                       Poco::Net::HTTPServerResponse& response) override {
        const bool head = request.getMethod() == Poco::Net::HTTPRequest::HTTP_HEAD;
        if (!head && request.getMethod() != Poco::Net::HTTPRequest::HTTP_GET) {
            response.set("Allow", "GET, HEAD");
            answer(response, HTTPResponse::HTTP_METHOD_NOT_ALLOWED, "text/plain",
                   "only GET and HEAD\n", true);
            return;
        }
        const std::string path = request.getURI().substr(0, request.getURI().find('?'));
        if (path == "/metrics") {
            std::string text;
            try {
                text = render_();
            } catch (const std::exception& e) {
                answer(response, HTTPResponse::HTTP_INTERNAL_SERVER_ERROR, "text/plain",
                       std::string("rendering metrics failed: ") + e.what() + "\n", !head);
                return;
            }
            answer(response, HTTPResponse::HTTP_OK, "text/plain; version=0.0.4; charset=utf-8",
                   text, !head);
        } else if (path == "/") {
            answer(response, HTTPResponse::HTTP_OK, "text/plain",
                   "reaperd: metrics are at /metrics\n", !head);
        } else {
            answer(response, HTTPResponse::HTTP_NOT_FOUND, "text/plain", "not found\n", !head);
        }
    }

private:
    const MetricsHttpServer::Render& render_;
};

class HandlerFactory : public Poco::Net::HTTPRequestHandlerFactory {
public:
    explicit HandlerFactory(const MetricsHttpServer::Render& render) : render_(render) {}
    Poco::Net::HTTPRequestHandler* createRequestHandler(
        const Poco::Net::HTTPServerRequest&) override {
        return new MetricsHandler(render_);
    }

private:
    const MetricsHttpServer::Render& render_;
};

Poco::Net::ServerSocket bind_listener(const std::string& listen) {
    try {
        Poco::Net::SocketAddress address(listen);
        Poco::Net::ServerSocket socket;
        // SO_REUSEADDR for a quick restart, but not SO_REUSEPORT: a second daemon must fail
        // to bind rather than share the port.
        socket.bind(address, true, false);
        socket.listen(16);
        return socket;
    } catch (const Poco::Exception& e) {
        throw ConfigValueError("metrics.listen", "cannot listen on \"" + listen + "\": " + e.displayText());
    }
}

}  // namespace

struct MetricsHttpServer::Impl {
    Render render;
    Poco::Net::ServerSocket socket;
    // A pool of its own: a slow scraper never takes threads from anyone using Poco's default.
    Poco::ThreadPool threads{1, 2};
    std::unique_ptr<Poco::Net::HTTPServer> server;
    bool started = false;
};

MetricsHttpServer::MetricsHttpServer(const std::string& listen, Render render)
    : impl_(std::make_unique<Impl>()) {
    impl_->render = std::move(render);
    impl_->socket = bind_listener(listen);
    auto params = Poco::AutoPtr<Poco::Net::HTTPServerParams>(new Poco::Net::HTTPServerParams);
    params->setMaxThreads(2);
    params->setMaxQueued(16);
    params->setKeepAlive(false);
    params->setTimeout(Poco::Timespan(10, 0));
    impl_->server = std::make_unique<Poco::Net::HTTPServer>(
        new HandlerFactory(impl_->render), impl_->threads, impl_->socket, params);
}

MetricsHttpServer::~MetricsHttpServer() { stop(); }

void MetricsHttpServer::start() {
    if (impl_->started) return;
    impl_->server->start();
    impl_->started = true;
}

void MetricsHttpServer::stop() {
    if (!impl_->started) return;
    impl_->started = false;
    impl_->server->stopAll(false);
    impl_->threads.joinAll();
    impl_->socket.close();
}

std::uint16_t MetricsHttpServer::port() const { return impl_->socket.address().port(); }

}  // namespace reaperd
