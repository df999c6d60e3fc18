#include "reaper/control.hpp"

#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace control = reaper::control;
using namespace std::chrono_literals;

namespace {

struct BadRequest {
    std::string line;
    std::string expected_fragment;  // the error must name the problem
};

// A minimal scripted peer for the client: accepts connections on a temp socket and answers
// each request line with what `respond` returns ("" = close without a reply).
class ScriptedDaemon {
public:
    explicit ScriptedDaemon(std::function<std::string(const std::string&)> respond)
        : respond_(std::move(respond)) {
        char dir_template[] = "/tmp/reaper-control-test.XXXXXX";
        dir_ = ::mkdtemp(dir_template);
        path_ = dir_ + "/control.sock";
        listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_un address{};
        address.sun_family = AF_UNIX;
        std::strcpy(address.sun_path, path_.c_str());
        BOOST_REQUIRE(::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
        BOOST_REQUIRE(::listen(listener_, 16) == 0);
        thread_ = std::thread([this] { serve(); });
    }
    ~ScriptedDaemon() {
        stop_ = true;
        ::shutdown(listener_, SHUT_RDWR);
        thread_.join();
        ::close(listener_);
        for (int fd : held_) ::close(fd);
        std::filesystem::remove_all(dir_);
    }
    const std::string& path() const { return path_; }
    std::vector<std::string> requests() {
        std::lock_guard lock(mutex_);
        return requests_;
    }
    // Closes every connection kept open (leases).
    void drop_all() {
        std::lock_guard lock(mutex_);
        for (int fd : held_) ::close(fd);
        held_.clear();
    }

private:
    void serve() {
        while (!stop_) {
            const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
            if (fd < 0) return;
            std::string line;
            char c;
            while (::read(fd, &c, 1) == 1 && c != '\n') line += c;
            const auto reply = respond_(line);
            std::lock_guard lock(mutex_);
            requests_.push_back(line);
            held_.push_back(fd);
            if (!reply.empty()) ::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
        }
    }

    std::function<std::string(const std::string&)> respond_;
    std::string dir_;
    std::string path_;
    int listener_ = -1;
    std::atomic<bool> stop_{false};
    std::thread thread_;
    std::mutex mutex_;
    std::vector<std::string> requests_;
    std::vector<int> held_;
};

template <class Exception>
std::string message_of(const std::function<void()>& action) {
    try {
        action();
    } catch (const Exception& e) {
        return e.what();
    }
    BOOST_FAIL("no exception thrown");
    return {};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(protocol)

BOOST_AUTO_TEST_CASE(valid_requests_parse) {
    struct Case {
        std::string line;
        control::Op op;
        std::string session;
        std::string container;
    };
    const std::vector<Case> cases{
        {R"({"op":"lease","session":"s-1"})", control::Op::Lease, "s-1", ""},
        {R"({"session":"abc","op":"end"})", control::Op::End, "abc", ""},
        {R"({"op":"orphan","container":"0123abcd"})", control::Op::Orphan, "", "0123abcd"},
        {R"({"op":"orphan","container":"c","session":"s"})", control::Op::Orphan, "s", "c"},
        {R"({"op":"status"})", control::Op::Status, "", ""},
        {" { \"op\" : \"metrics\" } \r", control::Op::Metrics, "", ""},
        {R"({"op":"lease","session":"org.testcontainers/x:y@z"})", control::Op::Lease,
         "org.testcontainers/x:y@z", ""},
    };
    for (const auto& c : cases) {
        BOOST_TEST_CONTEXT(c.line) {
            const auto request = control::parse_request(c.line);
            BOOST_TEST(static_cast<int>(request.op) == static_cast<int>(c.op));
            BOOST_TEST(request.session == c.session);
            BOOST_TEST(request.container == c.container);
        }
    }
}

BOOST_AUTO_TEST_CASE(malformed_requests_name_the_problem) {
    const std::string long_session(control::max_session_id_bytes + 1, 'a');
    const std::vector<BadRequest> cases{
        {"", "empty request"},
        {"   ", "empty request"},
        {"not json", "not a JSON object"},
        {"{not json}", "not valid JSON"},
        {R"({"op":"lease","session":"s")", "not valid JSON"},
        {R"(["op","lease"])", "not a JSON object"},
        {R"("lease")", "not a JSON object"},
        {"42", "not a JSON object"},
        {R"({"session":"s"})", "no \"op\""},
        {R"({"op":7})", "\"op\" must be a string"},
        {R"({"op":"explode"})", "unknown op \"explode\""},
        {R"({"op":"lease"})", "needs a \"session\""},
        {R"({"op":"end"})", "needs a \"session\""},
        {R"({"op":"orphan","session":"s"})", "needs a \"container\""},
        {R"({"op":"lease","session":5})", "\"session\" must be a string"},
        {R"({"op":"lease","session":null})", "\"session\" must be a string"},
        {R"({"op":"lease","session":["s"]})", "\"session\" must be a string"},
        {R"({"op":"orphan","container":{"id":"x"}})", "\"container\" must be a string"},
        {R"({"op":"lease","session":""})", "session id is empty"},
        {R"({"op":"lease","session":"a b"})", "session id \"a b\" has a space"},
        {R"({"op":"lease","session":"a\u0000b"})", "session id"},
        {R"({"op":"lease","session":"caf\u00e9"})", "non-ASCII"},
        {R"({"op":"lease","session":")" + long_session + "\"}", "bytes long"},
        {R"({"op":"lease","session":"s","extra":1})", "unexpected field \"extra\""},
        {R"({"op":"status","session":"s"})", "unexpected field \"session\""},
        {R"({"op":"end","session":"s","container":"c"})", "unexpected field \"container\""},
        {R"({"op":"lease","session":{"a":{"b":{"c":1}}}})", "not valid JSON"},
        {std::string("{\"op\":\"lease\",\"session\":\"\xff\xfe\"}"), "not valid UTF-8"},
        {std::string("{\"op\":\"status\"}\0", 16), "NUL"},
        {std::string("\x00\x01\x02\x03", 4), "NUL"},
        {std::string(control::max_message_bytes + 1, ' '), "the limit is 65536"},
        {std::string(20000, '['), "not a JSON object"},
        {"{\"op\":" + std::string(20000, '['), "not valid JSON"},
    };
    for (const auto& c : cases) {
        BOOST_TEST_CONTEXT(c.line.substr(0, 80)) {
            const auto message = message_of<control::ProtocolViolation>(
                [&] { control::parse_request(c.line); });
            BOOST_TEST(message.find(c.expected_fragment) != std::string::npos, message);
        }
    }
}

BOOST_AUTO_TEST_CASE(encode_then_parse_round_trips) {
    const std::vector<control::Request> requests{
        {control::Op::Lease, "s1", ""},
        {control::Op::End, "s\"2\\", ""},
        {control::Op::Orphan, "", "c1"},
        {control::Op::Orphan, "s3", "c2"},
        {control::Op::Status, "", ""},
        {control::Op::Metrics, "", ""},
    };
    for (const auto& request : requests) {
        const auto line = control::encode_request(request);
        BOOST_TEST(line.back() == '\n');
        BOOST_TEST(line.find('\n') == line.size() - 1);
        const auto parsed = control::parse_request(std::string_view(line).substr(0, line.size() - 1));
        BOOST_TEST(static_cast<int>(parsed.op) == static_cast<int>(request.op));
        BOOST_TEST(parsed.session == request.session);
        BOOST_TEST(parsed.container == request.container);
    }
}

BOOST_AUTO_TEST_CASE(encode_rejects_invalid_requests) {
    BOOST_CHECK_THROW(control::encode_request({control::Op::Lease, "", ""}),
                      control::ProtocolViolation);
    BOOST_CHECK_THROW(control::encode_request({control::Op::Lease, "a b", ""}),
                      control::ProtocolViolation);
    BOOST_CHECK_THROW(control::encode_request({control::Op::Orphan, "s", ""}),
                      control::ProtocolViolation);
    BOOST_CHECK_THROW(control::encode_request({control::Op::Status, "s", ""}),
                      control::ProtocolViolation);
}

BOOST_AUTO_TEST_CASE(replies_encode_and_parse) {
    BOOST_TEST(control::encode_ok() == "{\"ok\":true}\n");
    auto reply = control::parse_reply("{\"ok\":true}");
    BOOST_TEST(reply.ok);

    const auto error = control::encode_error("bad \"thing\"\nsecond line");
    BOOST_TEST(error.find('\n') == error.size() - 1);
    reply = control::parse_reply(std::string_view(error).substr(0, error.size() - 1));
    BOOST_TEST(!reply.ok);
    BOOST_TEST(reply.error == "bad \"thing\"\nsecond line");

    const auto binary_error = control::encode_error("got \xff\xfe");
    reply = control::parse_reply(std::string_view(binary_error).substr(0, binary_error.size() - 1));
    BOOST_TEST(reply.error.find("\\xff") != std::string::npos);

    const auto status = control::encode_status_reply("{\n  \"sessions\": [ {\"id\":\"s\"} ],\n  \"n\": 3\n}");
    BOOST_TEST(status.find('\n') == status.size() - 1);
    reply = control::parse_reply(std::string_view(status).substr(0, status.size() - 1));
    BOOST_TEST(reply.ok);
    BOOST_TEST(reply.status_json.find("\"sessions\"") != std::string::npos);
    BOOST_CHECK_THROW(control::encode_status_reply("[1,2]"), control::ProtocolViolation);
    BOOST_CHECK_THROW(control::encode_status_reply("{"), control::ProtocolViolation);

    const auto metrics = control::encode_metrics_reply("# TYPE x counter\nx 1\n");
    reply = control::parse_reply(std::string_view(metrics).substr(0, metrics.size() - 1));
    BOOST_TEST(reply.metrics == "# TYPE x counter\nx 1\n");

    BOOST_CHECK_THROW(control::parse_reply("{\"error\":\"x\"}"), control::ProtocolViolation);
    BOOST_CHECK_THROW(control::parse_reply("{\"ok\":\"yes\"}"), control::ProtocolViolation);
    BOOST_CHECK_THROW(control::parse_reply("garbage"), control::ProtocolViolation);
}

BOOST_AUTO_TEST_CASE(socket_path_comes_from_the_environment) {
    ::unsetenv("REAPERD_SOCKET");
    BOOST_TEST(control::socket_path_from_environment() == control::default_socket_path);
    ::setenv("REAPERD_SOCKET", "", 1);
    BOOST_TEST(control::socket_path_from_environment() == control::default_socket_path);
    ::setenv("REAPERD_SOCKET", "/tmp/x.sock", 1);
    BOOST_TEST(control::socket_path_from_environment() == "/tmp/x.sock");
    ::unsetenv("REAPERD_SOCKET");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(client)

BOOST_AUTO_TEST_CASE(unreachable_daemon_names_the_path_and_the_errno) {
    control::ControlClient client("/tmp/reaper-control-test-missing/none.sock", 500ms);
    const auto message = message_of<control::DaemonUnreachable>([&] { client.end("s"); });
    BOOST_TEST(message.find("/tmp/reaper-control-test-missing/none.sock") != std::string::npos, message);
    BOOST_TEST(message.find("No such file or directory") != std::string::npos, message);

    // A socket file with nobody listening: refused.
    char dir_template[] = "/tmp/reaper-control-test.XXXXXX";
    const std::string dir = ::mkdtemp(dir_template);
    const std::string path = dir + "/stale.sock";
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strcpy(address.sun_path, path.c_str());
    BOOST_REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    ::close(fd);
    const auto refused = message_of<control::DaemonUnreachable>(
        [&] { control::ControlClient(path, 500ms).lease("s"); });
    BOOST_TEST(refused.find("Connection refused") != std::string::npos, refused);
    std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(requests_and_replies_over_the_socket) {
    ScriptedDaemon daemon([](const std::string& line) {
        const auto request = control::parse_request(line);
        switch (request.op) {
        case control::Op::Status: return control::encode_status_reply(R"({"sessions":[]})");
        case control::Op::Metrics: return control::encode_metrics_reply("m 1\n");
        case control::Op::End:
            if (request.session == "refused") return control::encode_error("no such luck");
            return control::encode_ok();
        default: return control::encode_ok();
        }
    });
    control::ControlClient client(daemon.path());
    client.end("s1");
    client.report_orphan("c1", "s1");
    client.report_orphan("c2", "");
    BOOST_TEST(client.status_json() == R"({"sessions":[]})");
    BOOST_TEST(client.metrics_text() == "m 1\n");
    const auto refused = message_of<control::ErrorReply>([&] { client.end("refused"); });
    BOOST_TEST(refused.find("no such luck") != std::string::npos, refused);
    BOOST_CHECK_THROW(client.end("bad id"), control::ProtocolViolation);

    const auto requests = daemon.requests();
    BOOST_REQUIRE(requests.size() == 6u);
    BOOST_TEST(requests[0] == R"({"op":"end","session":"s1"})");
    BOOST_TEST(requests[1] == R"({"op":"orphan","container":"c1","session":"s1"})");
    BOOST_TEST(requests[2] == R"({"op":"orphan","container":"c2"})");
}

BOOST_AUTO_TEST_CASE(silent_or_garbled_daemon) {
    ScriptedDaemon silent([](const std::string&) { return std::string(); });
    const auto start = std::chrono::steady_clock::now();
    const auto message = message_of<control::DaemonUnreachable>(
        [&] { control::ControlClient(silent.path(), 300ms).end("s"); });
    BOOST_TEST(message.find("timed out") != std::string::npos, message);
    BOOST_TEST((std::chrono::steady_clock::now() - start < 10s));

    ScriptedDaemon garbled([](const std::string&) { return std::string("<html>\n"); });
    const auto garbage = message_of<control::ControlError>(
        [&] { control::ControlClient(garbled.path()).end("s"); });
    BOOST_TEST(garbage.find("garbled reply") != std::string::npos, garbage);
}

BOOST_AUTO_TEST_CASE(lease_lives_until_released_or_dropped) {
    ScriptedDaemon daemon([](const std::string&) { return control::encode_ok(); });
    control::ControlClient client(daemon.path());
    auto lease = client.lease("s1");
    BOOST_TEST(lease->alive());
    BOOST_TEST(lease->native_handle() >= 0);
    BOOST_TEST((::fcntl(lease->native_handle(), F_GETFD) & FD_CLOEXEC) != 0);
    daemon.drop_all();
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (lease->alive() && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(5ms);
    }
    BOOST_TEST(!lease->alive());
    lease->release();
    lease->release();
    BOOST_TEST(lease->native_handle() == -1);

    auto second = client.lease("s2");
    BOOST_TEST(second->alive());
    second->release();
    BOOST_TEST(!second->alive());
    auto third = client.lease("s3");  // released by its destructor
    third.reset();
    BOOST_TEST(daemon.requests().size() == 3u);

    ScriptedDaemon refusing([](const std::string&) { return control::encode_error("nope"); });
    BOOST_CHECK_THROW(control::ControlClient(refusing.path()).lease("s"), control::ErrorReply);
}

BOOST_AUTO_TEST_SUITE_END()
