// A real Prometheus (Debian's, scripts/deps.sh) scrapes a real reaperd on the private engine
// every second: what it stores is what the daemon did, and `promtool check metrics` finds
// nothing wrong with the exposition.
#include "daemon_fixture.hpp"

#include <Poco/JSON/Array.h>
#include <Poco/Net/HTTPClientSession.h>
#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/HTTPResponse.h>
#include <Poco/Net/ServerSocket.h>
#include <Poco/Net/SocketAddress.h>
#include <Poco/StreamCopier.h>
#include <Poco/URI.h>

#include <cstdio>
#include <limits>

using namespace reaperd::itest;

namespace {

constexpr const char* prometheus_path = "/usr/bin/prometheus";
constexpr const char* promtool_path = "/usr/bin/promtool";

// A loopback port free a moment ago (the kernel's pick; taken by the caller right after).
std::uint16_t free_port() {
    Poco::Net::ServerSocket socket(Poco::Net::SocketAddress("127.0.0.1", 0));
    return socket.address().port();
}

struct HttpReply {
    int status = 0;
    std::string body;
};

HttpReply http_get(std::uint16_t port, const std::string& path_and_query) {
    Poco::Net::HTTPClientSession session("127.0.0.1", port);
    session.setTimeout(Poco::Timespan(10, 0));
    Poco::Net::HTTPRequest request(Poco::Net::HTTPRequest::HTTP_GET, path_and_query,
                                   Poco::Net::HTTPMessage::HTTP_1_1);
    session.sendRequest(request);
    Poco::Net::HTTPResponse response;
    std::istream& in = session.receiveResponse(response);
    std::ostringstream body;
    Poco::StreamCopier::copyStream(in, body);
    return {response.getStatus(), body.str()};
}

struct Sample {
    Poco::JSON::Object::Ptr labels;
    double value = 0;
};

// Prometheus' own process, with its config and TSDB in a temp dir of its own, scraping one
// target every second. Stopped by its pid (SIGTERM, then SIGKILL) however the test ends.
class Prometheus {
public:
    explicit Prometheus(const std::string& target) {
        char pattern[] = "/tmp/prometheus-itest.XXXXXX";
        dir_ = ::mkdtemp(pattern);
        std::ofstream(dir_ + "/prometheus.yml")
            << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
            << "scrape_configs:\n  - job_name: reaperd\n    static_configs:\n"
            << "      - targets: ['" << target << "']\n";
        port_ = free_port();
        child_ = std::make_unique<Child>(
            dir_, std::vector<std::string>{prometheus_path, "--config.file=" + dir_ + "/prometheus.yml",
                                           "--storage.tsdb.path=" + dir_ + "/data",
                                           "--web.listen-address=127.0.0.1:" + std::to_string(port_)});
    }
    ~Prometheus() {
        if (child_ && child_->running()) {
            child_->signal(SIGTERM);
            child_->wait(20s);  // if it is still running then, Child's destructor SIGKILLs it
        }
        child_.reset();
        std::error_code ec;
        fs::remove_all(dir_, ec);
    }
    Prometheus(const Prometheus&) = delete;
    Prometheus& operator=(const Prometheus&) = delete;

    bool ready() { return child_->running() && http_get(port_, "/-/ready").status == 200; }
    std::string log() const { return child_->stderr_text() + child_->stdout_text(); }

    // An instant query; throws unless Prometheus answers "success" with a vector.
    std::vector<Sample> query(const std::string& promql) const {
        Poco::URI uri("/api/v1/query");
        uri.addQueryParameter("query", promql);
        const auto reply = http_get(port_, uri.getPathAndQuery());
        Poco::JSON::Parser parser;
        auto root = parser.parse(reply.body).extract<Poco::JSON::Object::Ptr>();
        if (reply.status != 200 || root->getValue<std::string>("status") != "success")
            throw std::runtime_error("query " + promql + ": " + reply.body);
        auto data = root->getObject("data");
        if (data->getValue<std::string>("resultType") != "vector")
            throw std::runtime_error("query " + promql + ": not a vector: " + reply.body);
        std::vector<Sample> samples;
        auto result = data->getArray("result");
        for (std::size_t i = 0; i < result->size(); ++i) {
            auto entry = result->getObject(static_cast<unsigned>(i));
            samples.push_back({entry->getObject("metric"),
                               std::stod(entry->getArray("value")->getElement<std::string>(1))});
        }
        return samples;
    }
    // The value of a query that names one series; NaN (equal to nothing) when it names none.
    double value(const std::string& promql) const {
        auto samples = query(promql);
        if (samples.empty()) return std::numeric_limits<double>::quiet_NaN();
        if (samples.size() != 1) throw std::runtime_error("query " + promql + ": several series");
        return samples[0].value;
    }

private:
    std::string dir_;
    std::uint16_t port_ = 0;
    std::unique_ptr<Child> child_;
};

struct CheckResult {
    int exit_code = -1;
    std::string output;
};

// `promtool check metrics` with `exposition` on its stdin.
CheckResult promtool_check(const std::string& exposition, const std::string& dir) {
    const std::string out_path = dir + "/promtool.out";
    const std::string command = std::string(promtool_path) + " check metrics >" + out_path + " 2>&1";
    FILE* pipe = ::popen(command.c_str(), "w");
    BOOST_REQUIRE(pipe != nullptr);
    std::fwrite(exposition.data(), 1, exposition.size(), pipe);
    const int status = ::pclose(pipe);
    std::ifstream in(out_path);
    std::stringstream text;
    text << in.rdbuf();
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text.str()};
}

double unix_now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

BOOST_AUTO_TEST_CASE(promtool_finds_a_broken_exposition) {
    // The check below is worth something only if promtool says so about a bad one.
    BOOST_REQUIRE_MESSAGE(fs::exists(promtool_path), promtool_path << " is missing: run scripts/deps.sh");
    Reaperd d;  // for its temp dir
    auto bad = promtool_check("# HELP reaperd_reaps counter without _total.\n"
                              "# TYPE reaperd_reaps counter\nreaperd_reaps 1\n",
                              d.dir);
    BOOST_TEST(bad.exit_code != 0);
    BOOST_TEST(bad.output.find("_total") != std::string::npos, bad.output);
}

BOOST_AUTO_TEST_CASE(prometheus_scrapes_the_reaps_the_test_caused) {
    BOOST_REQUIRE_MESSAGE(fs::exists(prometheus_path), prometheus_path << " is missing: run scripts/deps.sh");
    const auto began = std::chrono::steady_clock::now();
    const double began_unix = unix_now();
    const auto metrics_port = free_port();
    const std::string target = "127.0.0.1:" + std::to_string(metrics_port);
    Reaperd d("", "metrics:\n  listen: " + target + "\n");
    d.start();

    // Prometheus from the start: it sees reaperd_reaps_total 0 first, then the reaps.
    Prometheus prometheus(target);
    BOOST_REQUIRE_MESSAGE(eventually([&] { return prometheus.ready(); }),
                          "prometheus did not become ready; its log:\n" << prometheus.log());
    BOOST_REQUIRE_MESSAGE(eventually([&] { return prometheus.value("up{job=\"reaperd\"}") == 1.0; }),
                          "no successful scrape of " << target << "; prometheus' log:\n"
                                                     << prometheus.log());
    BOOST_TEST(prometheus.value("reaperd_reaps_total") == 0.0);

    constexpr int reaps = 3;
    const std::string session = "prom-1";
    auto lease = d.control().lease(session);
    std::vector<std::string> ids;
    for (int i = 0; i < reaps; ++i) ids.push_back(run_container(session_label(session)));
    const std::string bystander = run_container({{"app", "not-reaperd's"}});
    BOOST_REQUIRE(eventually([&] { return d.containers_of(session) == reaps; }));
    d.control().end(session);
    BOOST_REQUIRE(eventually([&] {
        for (const auto& id : ids)
            if (exists(id)) return false;
        return true;
    }));
    BOOST_TEST(exists(bystander));
    engine_client().remove(bystander, reaper::RemoveOptions{.force = true});

    // A scrape that began after the last removal holds all of them.
    const double reaped_unix = unix_now();
    BOOST_REQUIRE_MESSAGE(
        eventually([&] {
            return !prometheus.query("timestamp(reaperd_reaps_total) > " + std::to_string(reaped_unix))
                        .empty();
        }),
        "no scrape after the reaps; prometheus' log:\n" << prometheus.log());
    BOOST_TEST(prometheus.value("reaperd_reaps_total") == double(reaps));
    BOOST_TEST(prometheus.value("reaperd_reaps_done_total") == double(reaps));  // the old name
    BOOST_TEST(prometheus.value("reaperd_reap_latency_seconds_count") == double(reaps));
    BOOST_TEST(prometheus.value("reaperd_reap_latency_seconds_bucket{le=\"+Inf\"}") == double(reaps));
    // Each reap took from the end to the engine's 204: well under the 60 s bucket here.
    BOOST_TEST(prometheus.value("reaperd_reap_latency_seconds_bucket{le=\"60\"}") == double(reaps));
    const double latency_sum = prometheus.value("reaperd_reap_latency_seconds_sum");
    BOOST_TEST(latency_sum > 0);
    BOOST_TEST_MESSAGE("mean reap latency: " << latency_sum / reaps << " s");
    BOOST_TEST(prometheus.value("reaperd_sessions_ended_total{reason=\"end\"}") == 1.0);
    BOOST_TEST(prometheus.value("reaperd_reaps_failed_total") == 0.0);
    BOOST_TEST(prometheus.value("reaperd_state_save_failures_total") == 0.0);

    auto build = prometheus.query("reaperd_build_info");
    BOOST_REQUIRE(build.size() == 1u);
    BOOST_TEST(build[0].value == 1.0);
    BOOST_TEST(build[0].labels->getValue<std::string>("version") == REAPER_VERSION);
    const double started = prometheus.value("process_start_time_seconds");
    BOOST_TEST(started >= began_unix - 1);  // whole clock ticks, btime whole seconds
    BOOST_TEST(started <= reaped_unix);
    const double synced = prometheus.value("reaperd_engine_last_sync_timestamp_seconds");
    BOOST_TEST(synced >= began_unix);
    BOOST_TEST(synced <= unix_now());
    for (const char* name : {"process_open_fds", "process_max_fds", "process_resident_memory_bytes",
                             "process_virtual_memory_bytes"})
        BOOST_TEST(prometheus.value(name) > 0, name);
    BOOST_TEST(prometheus.value("process_cpu_seconds_total") >= 0);

    // What Prometheus read, read again and linted.
    const auto scraped = http_get(metrics_port, "/metrics");
    BOOST_REQUIRE(scraped.status == 200);
    BOOST_TEST(scraped.body.find("reaperd_reaps_total " + std::to_string(reaps) + "\n") !=
               std::string::npos);
    const auto check = promtool_check(scraped.body, d.dir);
    BOOST_TEST(check.exit_code == 0, check.output);
    BOOST_TEST(check.output.empty(), check.output);

    lease->release();
    BOOST_TEST_MESSAGE("prometheus_test: "
                       << std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count()
                       << " s from reaperd's start to the last check");
}
