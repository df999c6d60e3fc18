// engine_front: makes the tests' private dockerd (Debian's 20.10, API 1.12-1.41) present itself
// as another Docker release, so the client and reaperd can be run against the version ranges
// of engines we do not have (issue 15: Docker 29.0 raised its minimum API version to 1.44).
//
//   engine_front --listen PATH --upstream PATH --min-api 1.44 --max-api 1.52
//                --engine-version 29.0.0
//
// It answers on --listen as an engine of that profile would, per moby's version middleware
// (api/server/middleware/version.go):
// - a request under /vX.Y/ with X.Y below --min-api or above --max-api is answered 400 with
//   the engine's own message; any other is forwarded without its version prefix, since the
//   upstream would refuse versions above its own (unversioned means "the engine's own");
// - unversioned requests are forwarded as they are;
// - every answer carries API-Version: --max-api and Server: Docker/--engine-version, and
//   GET /version reports the profile's Version, ApiVersion and MinAPIVersion (also in the
//   Engine entry of Components).
// Bodies are relayed as they arrive (an events stream line by line, a blocked wait until it
// returns); client connections are kept alive. Hijacked connections (attach, exec start with
// a TTY) are not supported. Ends on SIGTERM or SIGINT, and when its parent dies.
#include "http_forward.hpp"
#include "relay_frame.hpp"

#include <Poco/JSON/Array.h>
#include <Poco/JSON/Object.h>
#include <Poco/JSON/Parser.h>
#include <Poco/Net/HTTPRequestHandler.h>
#include <Poco/Net/HTTPRequestHandlerFactory.h>
#include <Poco/Net/HTTPServerRequestImpl.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>


namespace {

namespace http_forward = reaper::test::http_forward;
namespace relay = reaper::test::relay;
using Poco::Net::HTTPResponse;

struct Profile {
    std::string min_api;
    std::string max_api;
    std::string engine_version;
};

// Compares dotted versions numerically (as moby's api/types/versions does): <0, 0, >0.
int compare_versions(const std::string& a, const std::string& b) {
    std::istringstream left(a), right(b);
    for (;;) {
        long x = 0, y = 0;
        bool more_left = static_cast<bool>(left >> x);
        bool more_right = static_cast<bool>(right >> y);
        if (!more_left && !more_right) return 0;
        if (x != y) return x < y ? -1 : 1;
        left.ignore(1);  // the dot
        right.ignore(1);
    }
}

class FrontHandler : public Poco::Net::HTTPRequestHandler {
public:
    FrontHandler(const std::string& upstream, const Profile& profile)
        : upstream_(upstream), profile_(profile) {}

    void handleRequest(Poco::Net::HTTPServerRequest& request,
                       Poco::Net::HTTPServerResponse& response) override {
        auto& client = static_cast<Poco::Net::HTTPServerRequestImpl&>(request).socket();
        const std::string body = http_forward::read_body(request);
        std::string uri = request.getURI();
        present_headers(response);

        if (auto [version, rest] = http_forward::split_version(uri); !version.empty()) {
            if (compare_versions(version, profile_.min_api) < 0)
                return refuse(response, "client version " + version +
                                            " is too old. Minimum supported API version is " +
                                            profile_.min_api +
                                            ", please upgrade your client to a newer version");
            if (compare_versions(version, profile_.max_api) > 0)
                return refuse(response, "client version " + version +
                                            " is too new. Maximum supported API version is " +
                                            profile_.max_api);
            uri = std::move(rest);
        }
        const std::string path = uri.substr(0, uri.find('?'));

        std::optional<http_forward::Exchange> exchange;
        try {
            exchange.emplace(upstream_);
        } catch (const Poco::Exception&) {
            // The engine is down: the client sees its connection break, as with no front.
            return hang_up(response, client);
        }
        http_forward::HangupWatch watch(client, [&] {
            try {
                exchange->socket().shutdown();
            } catch (const Poco::Exception&) {
                // The engine closed it already.
            }
        });
        try {
            std::istream& from = exchange->send(request, uri, body);
            const HTTPResponse& in = exchange->response();
            exchange->copy_head(response);
            present_headers(response);
            if (request.getMethod() == Poco::Net::HTTPRequest::HTTP_GET && path == "/version" &&
                in.getStatus() == HTTPResponse::HTTP_OK) {
                std::string text;
                Poco::StreamCopier::copyToString(from, text);
                text = present_version(text);
                response.setContentLength(static_cast<std::streamsize>(text.size()));
                response.send() << text;
                return;
            }
            // Cut short on either side: a client must not wait for bytes that will not come.
            if (!relay(from, in, request, response)) hang_up(response, client);
        } catch (const Poco::Exception&) {
            // The engine broke the connection (or sent a /version that is not JSON): so does
            // the front.
            hang_up(response, client);
        }
    }

private:
    // The version middleware's headers, which come on every answer, refusals included.
    void present_headers(Poco::Net::HTTPServerResponse& response) const {
        response.set("API-Version", profile_.max_api);
        response.set("Server", "Docker/" + profile_.engine_version + " (linux)");
    }

    static void hang_up(Poco::Net::HTTPServerResponse& response,
                        Poco::Net::StreamSocket& client) {
        response.setKeepAlive(false);
        try {
            client.shutdown();
        } catch (const Poco::Exception&) {
            // The client left first.
        }
    }

    static void refuse(Poco::Net::HTTPServerResponse& response, const std::string& message) {
        Poco::JSON::Object object;
        object.set("message", message);
        std::ostringstream text;
        object.stringify(text);
        response.setStatus(HTTPResponse::HTTP_BAD_REQUEST);
        response.setContentType("application/json");
        response.setContentLength(static_cast<std::streamsize>(text.str().size()));
        response.send() << text.str();
    }

    // The upstream's GET /version answer with the profile's versions in it.
    std::string present_version(const std::string& text) const {
        Poco::JSON::Parser parser;
        auto object = parser.parse(text).extract<Poco::JSON::Object::Ptr>();
        object->set("Version", profile_.engine_version);
        object->set("ApiVersion", profile_.max_api);
        object->set("MinAPIVersion", profile_.min_api);
        if (auto components = object->getArray("Components")) {
            for (std::size_t i = 0; i < components->size(); ++i) {
                auto component = components->getObject(static_cast<unsigned>(i));
                if (!component || component->optValue<std::string>("Name", "") != "Engine")
                    continue;
                component->set("Version", profile_.engine_version);
                if (auto details = component->getObject("Details")) {
                    details->set("ApiVersion", profile_.max_api);
                    details->set("MinAPIVersion", profile_.min_api);
                }
            }
        }
        std::ostringstream out;
        object->stringify(out);
        return out.str();
    }

    // Relays the body framed as the engine framed it (its Content-Length, none where the
    // answer has no body, else chunked), each read passed on and flushed at once: a read
    // returns what one socket read gave, so an event line or a wait's answer is not held back
    // waiting for more. False when it ended short.
    static bool relay(std::istream& from, const HTTPResponse& in,
                      const Poco::Net::HTTPServerRequest& request,
                      Poco::Net::HTTPServerResponse& response) {
        const auto status = in.getStatus();
        const bool bodiless = request.getMethod() == Poco::Net::HTTPRequest::HTTP_HEAD ||
                              status < 200 || status == HTTPResponse::HTTP_NO_CONTENT ||
                              status == HTTPResponse::HTTP_NOT_MODIFIED;
        if (in.hasContentLength())
            response.setContentLength64(in.getContentLength64());
        else if (!bodiless)
            response.setChunkedTransferEncoding(true);
        std::ostream& to = response.send();
        to.flush();  // the head now: a stream's client waits for it before any event
        if (bodiless) return true;
        char buffer[16 * 1024];
        std::streamsize relayed_bytes = 0;
        for (int first = from.get(); first != std::char_traits<char>::eof(); first = from.get()) {
            buffer[0] = static_cast<char>(first);
            std::streamsize n = 1 + from.readsome(buffer + 1, sizeof buffer - 1);
            if (!to.write(buffer, n).flush()) return false;
            relayed_bytes += n;
        }
        if (from.bad()) return false;
        return !in.hasContentLength() || relayed_bytes == in.getContentLength64();
    }

    const std::string& upstream_;
    const Profile& profile_;
};

class Factory : public Poco::Net::HTTPRequestHandlerFactory {
public:
    Factory(std::string upstream, Profile profile)
        : upstream_(std::move(upstream)), profile_(std::move(profile)) {}
    Poco::Net::HTTPRequestHandler* createRequestHandler(
        const Poco::Net::HTTPServerRequest&) override {
        return new FrontHandler(upstream_, profile_);
    }

private:
    std::string upstream_;
    Profile profile_;
};

int usage() {
    std::cerr << "usage: engine_front --listen PATH --upstream PATH --min-api X.Y --max-api X.Y"
                 " --engine-version VERSION\n";
    return 64;
}

}  // namespace

int main(int argc, char** argv) {
    const auto flags = relay::parse_flags(argc, argv,
                                          {"--listen", "--upstream", "--min-api", "--max-api", "--engine-version"});
    if (!flags) return usage();
    auto args = *flags;
    const sigset_t stop = relay::block_stop_signals();

    const std::string listen = args["--listen"];
    relay::UnixHttpServer server(
        listen, new Factory(args["--upstream"], Profile{args["--min-api"], args["--max-api"], args["--engine-version"]}));
    std::cout << "listening on " << listen << " as Docker " << args["--engine-version"]
              << " (API " << args["--min-api"] << "-" << args["--max-api"] << ")" << std::endl;

    relay::wait_for_stop(stop);
    relay::end_now(listen);
}
