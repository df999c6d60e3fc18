#include "metrics_http.hpp"

#include <boost/test/unit_test.hpp>

#include <Poco/Net/HTTPClientSession.h>
#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/HTTPResponse.h>
#include <Poco/StreamCopier.h>

#include <atomic>
#include <sstream>
#include <stdexcept>
#include <string>

namespace {

struct Reply {
    int status = 0;
    std::string content_type;
    std::string body;
};

Reply request(std::uint16_t port, const std::string& method, const std::string& uri) {
    Poco::Net::HTTPClientSession session("127.0.0.1", port);
    session.setTimeout(Poco::Timespan(10, 0));
    Poco::Net::HTTPRequest req(method, uri, Poco::Net::HTTPMessage::HTTP_1_1);
    req.setContentLength(0);
    session.sendRequest(req);
    Poco::Net::HTTPResponse response;
    std::istream& in = session.receiveResponse(response);
    Reply reply;
    reply.status = response.getStatus();
    reply.content_type = response.getContentType();
    std::ostringstream body;
    Poco::StreamCopier::copyStream(in, body);
    reply.body = body.str();
    return reply;
}

const std::string exposition =
    "# HELP reaperd_reaps_done_total Containers reaped.\n"
    "# TYPE reaperd_reaps_done_total counter\n"
    "reaperd_reaps_done_total 3\n";

}  // namespace

BOOST_AUTO_TEST_CASE(get_metrics_answers_the_rendered_text_each_time) {
    std::atomic<int> renders{0};
    reaperd::MetricsHttpServer server("127.0.0.1:0", [&] {
        ++renders;
        return exposition;
    });
    server.start();
    BOOST_TEST(server.port() != 0);
    for (int i = 1; i <= 2; ++i) {
        auto reply = request(server.port(), "GET", "/metrics");
        BOOST_TEST(reply.status == 200);
        BOOST_TEST(reply.content_type == "text/plain; version=0.0.4; charset=utf-8");
        BOOST_TEST(reply.body == exposition);
        BOOST_TEST(renders.load() == i);
    }
}

struct PathCase {
    const char* method;
    const char* uri;
    int status;
};

BOOST_AUTO_TEST_CASE(other_paths_and_methods_are_refused) {
    reaperd::MetricsHttpServer server("127.0.0.1:0", [] { return exposition; });
    server.start();
    const PathCase cases[] = {
        {"GET", "/metrics?x=1", 200}, {"HEAD", "/metrics", 200}, {"GET", "/", 200},
        {"GET", "/other", 404},       {"POST", "/metrics", 405}, {"DELETE", "/metrics", 405},
    };
    for (const auto& c : cases) {
        BOOST_TEST_CONTEXT(c.method << " " << c.uri) {
            auto reply = request(server.port(), c.method, c.uri);
            BOOST_TEST(reply.status == c.status);
            if (std::string(c.method) == "HEAD") BOOST_TEST(reply.body.empty());
        }
    }
}

BOOST_AUTO_TEST_CASE(a_failing_render_is_a_500_not_a_crash) {
    reaperd::MetricsHttpServer server("127.0.0.1:0",
                                      []() -> std::string { throw std::runtime_error("boom"); });
    server.start();
    auto reply = request(server.port(), "GET", "/metrics");
    BOOST_TEST(reply.status == 500);
    BOOST_TEST(reply.body.find("boom") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(bad_or_busy_addresses_throw_naming_the_address) {
    for (const char* listen : {"not an address", "127.0.0.1:99999", "256.1.1.1:80"}) {
        BOOST_TEST_CONTEXT(listen) {
            try {
                reaperd::MetricsHttpServer server(listen, [] { return std::string(); });
                BOOST_ERROR("no exception");
            } catch (const std::runtime_error& e) {
                BOOST_TEST(std::string(e.what()).find(listen) != std::string::npos);
            }
        }
    }
    reaperd::MetricsHttpServer first("127.0.0.1:0", [] { return std::string(); });
    const std::string taken = "127.0.0.1:" + std::to_string(first.port());
    BOOST_CHECK_THROW(reaperd::MetricsHttpServer(taken, [] { return std::string(); }),
                      std::runtime_error);
}

BOOST_AUTO_TEST_CASE(stop_is_idempotent_and_closes_the_port) {
    reaperd::MetricsHttpServer server("127.0.0.1:0", [] { return exposition; });
    server.start();
    const auto port = server.port();
    BOOST_TEST(request(port, "GET", "/metrics").status == 200);
    server.stop();
    server.stop();
    BOOST_CHECK_THROW(request(port, "GET", "/metrics"), std::exception);
}
