#include "control_server.hpp"

#include "reaper/control.hpp"
#include "eventually.hpp"

#include <boost/test/unit_test.hpp>

#include <grp.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <map>
#include <optional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace control = reaper::control;
using namespace std::chrono_literals;
using reaper::test::eventually;

namespace {

struct Event {
    std::string kind;  // opened, closed, proxy, end, session, orphan
    std::string a;
    std::string b;
    std::uint64_t connection = 0;
    reaperd::ProxyReport proxy{};
};

class RecordingHandler : public reaperd::ControlHandler {
public:
    void lease_opened(const std::string& session, std::uint64_t id) override {
        if (session == "refuse-me") throw std::runtime_error("leases for refuse-me are refused");
        record({"opened", session, "", id});
    }
    void lease_closed(const std::string& session, std::uint64_t id) override {
        record({"closed", session, "", id});
    }
    void proxy_reported(const std::string& session, std::uint64_t id, const reaperd::ProxyReport& report) override {
        if (report.labelled.volumes == 666) throw std::runtime_error("cursed count");
        record({"proxy", session, "", id, report});
    }
    control::Reply end_session(const std::string& session) override {
        if (hold_end) hold_end->wait_for(60s);
        if (session == "explode") throw std::runtime_error("the daemon is unwell");
        record({"end", session, "", 0});
        control::Reply reply;
        reply.session = session;
        reply.known = session != "stranger";
        reply.already_ended = false;
        reply.reaps_queued = control::KindCounts{{"containers", 3}};
        return reply;
    }
    control::Reply session_report(const std::string& session) override {
        record({"session", session, "", 0});
        control::Reply reply;
        reply.session = session;
        reply.known = true;
        reply.state = "ended";
        reply.ready = true;
        reply.remaining = control::KindCounts{{"containers", 1}, {"networks", 0}};
        return reply;
    }
    control::Reply orphan_reported(const std::string& container, const std::string& session) override {
        if (hold_orphan) hold_orphan->wait_for(60s);
        if (container == "nowhere") throw reaperd::Refused("no container matches \"nowhere\"; not reaped");
        if (container == "theirs") {
            control::Reply details;
            details.container = std::string(64, 'b');
            details.name = "theirs";
            details.owned = false;
            details.queued = false;
            throw reaperd::Refused("container theirs carries no session label; not reaped", details);
        }
        record({"orphan", container, session, 0});
        control::Reply reply;
        reply.container = std::string(64, 'a');
        reply.name = container;
        reply.session = session.empty() ? "owner" : session;
        reply.owned = true;
        reply.queued = true;
        return reply;
    }
    std::string status_json(const control::StatusQuery&) override {
        if (hold_status) hold_status->wait_for(60s);
        ++status_calls;
        if (status_padding > 0) {
            return "{\"sessions\": [], \"pad\": \"" + std::string(status_padding, 'x') + "\"}";
        }
        return "{\n  \"sessions\": [{\"id\": \"s1\", \"state\": \"leased\"}]\n}"; }
    std::string metrics_text() override { return "# TYPE reaperd_up gauge\nreaperd_up 1\n"; }
    void request_refused(const std::string& reason) override {
        std::lock_guard lock(mutex_);
        ++refusals_[reason];
    }
    std::size_t refused(const std::string& reason) {
        std::lock_guard lock(mutex_);
        return refusals_[reason];
    }

    std::vector<Event> events() {
        std::lock_guard lock(mutex_);
        return events_;
    }
    std::atomic<std::size_t> status_calls{0};
    std::size_t status_padding = 0;  // when set, status_json() is this many bytes bigger
    // When set, status_json() waits for it (a daemon whose main loop is busy).
    std::optional<std::shared_future<void>> hold_status;
    // When set, orphan_reported() waits for it (an engine slow to answer the inspect).
    std::optional<std::shared_future<void>> hold_orphan;
    // When set, end_session() waits for it (a daemon whose main loop is busy).
    std::optional<std::shared_future<void>> hold_end;
    std::size_t count(const std::string& kind) {
        std::lock_guard lock(mutex_);
        return static_cast<std::size_t>(std::count_if(
            events_.begin(), events_.end(), [&](const Event& e) { return e.kind == kind; }));
    }
    // Waits (generously) until `predicate` holds over the events.
    bool wait_for(const std::function<bool()>& predicate, std::chrono::seconds limit = 30s) {
        std::unique_lock lock(mutex_);
        return changed_.wait_for(lock, limit, [&] {
            lock.unlock();
            const bool ok = predicate();
            lock.lock();
            return ok;
        });
    }

private:
    void record(Event event) {
        {
            std::lock_guard lock(mutex_);
            events_.push_back(std::move(event));
        }
        changed_.notify_all();
    }
    std::mutex mutex_;
    std::condition_variable changed_;
    std::vector<Event> events_;
    std::map<std::string, std::size_t> refusals_;
};

std::string make_temp_dir() {
    char dir_template[] = "/tmp/reaper-control-server-test.XXXXXX";
    return ::mkdtemp(dir_template);
}

struct Fixture {
    Fixture(reaperd::ControlServerLimits limits = {}) : dir(make_temp_dir()) {
        config.socket = dir + "/run/control.sock";
        server = std::make_unique<reaperd::ControlServer>(config, handler, limits);
        server->start();
    }
    ~Fixture() {
        server.reset();
        std::filesystem::remove_all(dir);
    }
    std::string dir;
    reaperd::ControlConfig config;
    RecordingHandler handler;
    std::unique_ptr<reaperd::ControlServer> server;
};

int connect_raw(const std::string& path) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strcpy(address.sun_path, path.c_str());
    BOOST_REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    timeval timeout{30, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    return fd;
}

void send_all(int fd, std::string_view data) {
    while (!data.empty()) {
        const auto n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
        if (n <= 0) return;  // the server may close early on garbage; that is allowed
        data.remove_prefix(static_cast<std::size_t>(n));
    }
}

// Everything the server sends until it closes the connection (or 30 s pass).
std::string read_until_eof(int fd) {
    std::string all;
    char buffer[4096];
    for (;;) {
        const auto n = ::recv(fd, buffer, sizeof buffer, 0);
        if (n <= 0) break;
        all.append(buffer, static_cast<std::size_t>(n));
    }
    return all;
}

// Sends `bytes` on a new connection and parses the last reply the server sends before closing
// it (an error reply, for the bad requests the tables below send).
control::Reply last_reply_to(const std::string& socket, std::string_view bytes) {
    const int fd = connect_raw(socket);
    send_all(fd, bytes);
    const auto received = read_until_eof(fd);
    ::close(fd);
    const auto last_line_start = received.rfind('\n', received.size() - 2);
    const auto last = received.substr(last_line_start == std::string::npos ? 0 : last_line_start + 1);
    return control::parse_reply(std::string_view(last).substr(0, last.size() - 1));
}

std::string read_line(int fd) {
    std::string line;
    char c;
    while (::recv(fd, &c, 1, 0) == 1 && c != '\n') line += c;
    return line;
}


std::size_t open_fd_count() {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
    return n;
}

}  // namespace

BOOST_AUTO_TEST_CASE(lease_open_and_close_reach_the_handler) {
    Fixture f;
    control::ControlClient client(f.config.socket);
    auto lease = client.lease("s1");
    auto events = f.handler.events();
    BOOST_REQUIRE(events.size() == 1u);
    BOOST_TEST(events[0].kind == "opened");
    BOOST_TEST(events[0].a == "s1");
    const auto id = events[0].connection;
    BOOST_TEST(lease->alive());
    lease->release();
    BOOST_REQUIRE(f.handler.wait_for([&] { return f.handler.count("closed") == 1; }));
    events = f.handler.events();
    BOOST_TEST(events[1].a == "s1");
    BOOST_TEST(events[1].connection == id);

    auto second = client.lease("s1");
    BOOST_TEST(f.handler.events()[2].connection != id);
}

// The lease reply tells the holder reaperd's log cap and whether a labelling proxy should set
// Docker's own rotation; a keeper keeps the reply of its lease. Before any terms are set (and
// from a daemon older than them) the reply is a plain {"ok":true}.
BOOST_AUTO_TEST_CASE(lease_reply_carries_the_log_terms) {
    Fixture f;
    const int plain = connect_raw(f.config.socket);
    send_all(plain, "{\"op\":\"lease\",\"session\":\"s1\"}\n");
    BOOST_TEST(read_line(plain) == R"({"ok":true})");
    ::close(plain);

    f.server->set_lease_terms({2 * 1024 * 1024, true});
    control::LeaseKeeper keeper(control::ControlClient(f.config.socket), "s2");
    BOOST_TEST(!keeper.lease_reply().has_value());
    BOOST_REQUIRE(keeper.start() == nullptr);
    const auto reply = keeper.lease_reply();
    BOOST_REQUIRE(reply.has_value());
    BOOST_TEST(reply->log_max_size.value() == 2u * 1024 * 1024);
    BOOST_TEST(reply->log_rotate_at_create.value());

    f.server->set_lease_terms({0, false});  // a reload: new leases get the new terms
    const int raw = connect_raw(f.config.socket);
    send_all(raw, "{\"op\":\"lease\",\"session\":\"s3\"}\n");
    BOOST_TEST(read_line(raw) == R"({"ok":true,"log_max_size":0,"log_rotate_at_create":false})");
    ::close(raw);
}

BOOST_AUTO_TEST_CASE(end_orphan_status_and_metrics_dispatch) {
    Fixture f;
    control::ControlClient client(f.config.socket);
    client.end("s1");
    client.report_orphan("c1", "s2");
    client.report_orphan("c2", "");
    const auto events = f.handler.events();
    BOOST_REQUIRE(events.size() == 3u);
    BOOST_TEST(events[0].kind == "end");
    BOOST_TEST(events[0].a == "s1");
    BOOST_TEST(events[1].kind == "orphan");
    BOOST_TEST(events[1].a == "c1");
    BOOST_TEST(events[1].b == "s2");
    BOOST_TEST(events[2].b == "");
    BOOST_TEST(client.status_json() == R"({"sessions":[{"id":"s1","state":"leased"}]})");
    BOOST_TEST(client.metrics_text() == "# TYPE reaperd_up gauge\nreaperd_up 1\n");
}

BOOST_AUTO_TEST_CASE(several_requests_share_one_plain_connection) {
    Fixture f;
    const int fd = connect_raw(f.config.socket);
    send_all(fd, "{\"op\":\"end\",\"session\":\"a\"}\n{\"op\":\"status\"}\r\n");
    BOOST_TEST(read_line(fd) == R"({"ok":true,"session":"a","known":true,"already_ended":false,"reaps_queued":{"containers":3}})");
    BOOST_TEST(read_line(fd).find("\"status\"") != std::string::npos);
    send_all(fd, "{\"op\":\"end\",\"session\":\"b\"}\n");
    BOOST_TEST(control::parse_reply(read_line(fd)).session == "b");
    ::close(fd);
    BOOST_TEST(f.handler.count("end") == 2u);
}

BOOST_AUTO_TEST_CASE(a_slow_status_delays_only_its_asker) {
    Fixture f;
    std::promise<void> release;
    f.handler.hold_status = release.get_future().share();
    const int asker = connect_raw(f.config.socket);
    send_all(asker, "{\"op\":\"status\"}\n{\"op\":\"end\",\"session\":\"after-status\"}\n");
    // Meanwhile others are served at once.
    control::ControlClient client(f.config.socket, 5s);
    auto lease = client.lease("quick");
    client.end("meanwhile");
    BOOST_TEST(f.handler.count("end") == 1u);  // the asker's end waits behind its status
    release.set_value();
    BOOST_TEST(read_line(asker).find("\"status\"") != std::string::npos);
    BOOST_TEST(control::parse_reply(read_line(asker)).session == "after-status");
    BOOST_TEST(f.handler.count("end") == 2u);
    ::close(asker);
}

BOOST_AUTO_TEST_CASE(a_slow_orphan_report_delays_neither_other_requests_nor_status) {
    Fixture f;
    std::promise<void> release;
    f.handler.hold_orphan = release.get_future().share();
    const int reporter = connect_raw(f.config.socket);
    send_all(reporter, "{\"op\":\"orphan\",\"container\":\"web\",\"session\":\"A\"}\n"
                       "{\"op\":\"end\",\"session\":\"after-orphan\"}\n");
    control::ControlClient client(f.config.socket, 5s);
    auto lease = client.lease("quick");
    client.end("meanwhile");
    BOOST_TEST(client.status_json().find("sessions") != std::string::npos);
    BOOST_TEST(f.handler.count("end") == 1u);  // the reporter's end waits behind its orphan
    release.set_value();
    BOOST_TEST(control::parse_reply(read_line(reporter)).container == std::string(64, 'a'));
    BOOST_TEST(control::parse_reply(read_line(reporter)).session == "after-orphan");
    BOOST_TEST(f.handler.count("orphan") == 1u);
    BOOST_TEST(f.handler.count("end") == 2u);
    ::close(reporter);
}

BOOST_AUTO_TEST_CASE(a_refused_orphan_report_gets_the_handlers_words_and_the_connection_stays) {
    Fixture f;
    const int fd = connect_raw(f.config.socket);
    send_all(fd, "{\"op\":\"orphan\",\"container\":\"nowhere\"}\n");
    BOOST_TEST(read_line(fd) == R"({"ok":false,"error":"no container matches \"nowhere\"; not reaped"})");
    send_all(fd, "{\"op\":\"orphan\",\"container\":\"web\"}\n");
    BOOST_TEST(read_line(fd) == R"({"ok":true,"container":")" + std::string(64, 'a') +
                                    R"(","name":"web","session":"owner","owned":true,"queued":true})");
    // A refusal after the report was resolved names what it resolved to.
    send_all(fd, "{\"op\":\"orphan\",\"container\":\"theirs\"}\n");
    BOOST_TEST(read_line(fd) == R"({"ok":false,"error":"container theirs carries no session label; not reaped",)"
                                R"("container":")" + std::string(64, 'b') +
                                    R"(","name":"theirs","owned":false,"queued":false})");
    ::close(fd);
    control::ControlClient client(f.config.socket);
    try {
        client.report_orphan("nowhere", "");
        BOOST_FAIL("no error reply");
    } catch (const control::ErrorReply& e) {
        BOOST_TEST(std::string(e.what()).find("no container matches \"nowhere\"") != std::string::npos, e.what());
    }
}

BOOST_AUTO_TEST_CASE(stop_while_a_status_is_pending) {
    Fixture f;
    std::promise<void> release;
    f.handler.hold_status = release.get_future().share();
    const int asker = connect_raw(f.config.socket);
    send_all(asker, "{\"op\":\"status\"}\n");
    std::thread releaser([&] {
        // stop() must find the status still pending, and nothing tells when it has started
        // waiting for it.
        std::this_thread::sleep_for(200ms);  // real time: ample for stop() to begin waiting
        release.set_value();
    });
    f.server->stop();
    releaser.join();
    BOOST_TEST(read_until_eof(asker).empty());
    ::close(asker);
}

BOOST_AUTO_TEST_CASE(handler_failures_become_error_replies) {
    Fixture f;
    control::ControlClient client(f.config.socket);
    try {
        client.end("explode");
        BOOST_FAIL("no error reply");
    } catch (const control::ErrorReply& e) {
        BOOST_TEST(std::string(e.what()).find("the daemon is unwell") != std::string::npos, e.what());
    }
    BOOST_CHECK_THROW(client.lease("refuse-me"), control::ErrorReply);
    BOOST_TEST(f.handler.count("closed") == 0u);  // a refused lease was never a lease
    client.end("fine");
    BOOST_TEST(f.handler.count("end") == 1u);
}

BOOST_AUTO_TEST_CASE(malformed_requests_get_an_error_reply_and_the_connection_closes) {
    Fixture f;
    struct Case {
        std::string name;
        std::string bytes;
        std::string expected_fragment;
    };
    const std::vector<Case> cases{
        {"not json", "hello\n", "not a JSON object"},
        {"broken json", "{\"op\":\n", "not valid JSON"},
        {"unknown op", "{\"op\":\"reap-everything\"}\n", "unknown op"},
        {"missing session", "{\"op\":\"lease\"}\n", "needs a \"session\""},
        {"wrong type", "{\"op\":\"end\",\"session\":1}\n", "must be a string"},
        {"a field the op does not take", "{\"op\":\"status\",\"session\":\"s\"}\n", "unexpected field"},
        {"bad session id", "{\"op\":\"lease\",\"session\":\"a b\"}\n", "has a space"},
        {"binary", std::string("\x00\xff\x13\x37\n", 5), "not valid UTF-8"},
        {"non-utf8 string", "{\"op\":\"lease\",\"session\":\"\xc3\x28\"}\n", "not valid UTF-8"},
        {"empty line", "\n", "empty request"},
        {"oversized line", std::string(control::max_message_bytes + 10, 'x') + "\n", "the limit is 65536"},
        {"oversized without newline", std::string(200 * 1024, '{'), "exceeds 65536"},
        {"request after a lease", "{\"op\":\"lease\",\"session\":\"L\"}\n{\"op\":\"status\"}\n",
         "lease connections take no further requests"},
        {"bytes after a lease", "{\"op\":\"lease\",\"session\":\"L2\"}\nx", "lease connections take no further requests"},
    };
    for (const auto& c : cases) {
        BOOST_TEST_CONTEXT(c.name) {
            const auto reply = last_reply_to(f.config.socket, c.bytes);
            BOOST_TEST(!reply.ok);
            BOOST_TEST(reply.error.find(c.expected_fragment) != std::string::npos, reply.error);
        }
    }
    // The leases taken before the bad request ended when their connections were closed.
    BOOST_REQUIRE(f.handler.wait_for([&] { return f.handler.count("closed") == 2; }));
    BOOST_TEST(f.handler.count("opened") == 2u);
    // And the server carries on.
    control::ControlClient client(f.config.socket);
    BOOST_TEST(client.status_json().find("sessions") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(garbage_never_stops_the_server) {
    Fixture f;
    std::vector<std::string> garbage{
        "{\"op\":\"lea",                              // half a line, then close
        std::string(1024, '\0'),                      // NULs, no newline
        std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16),  // binary with newlines
        "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    };
    for (int i = 0; i < 50; ++i) {
        for (const auto& bytes : garbage) {
            const int fd = connect_raw(f.config.socket);
            send_all(fd, bytes);
            ::close(fd);  // without reading the reply
        }
    }
    control::ControlClient client(f.config.socket);
    client.end("still-here");
    BOOST_TEST(f.handler.count("end") == 1u);
    BOOST_TEST(f.handler.count("opened") == 0u);
    BOOST_REQUIRE(eventually([&] { return f.server->connection_count() == 0; }));
}

BOOST_AUTO_TEST_CASE(idle_half_lines_are_closed_after_the_timeout) {
    reaperd::ControlServerLimits limits;
    limits.idle_timeout = 200ms;
    Fixture f(limits);
    const int fd = connect_raw(f.config.socket);
    send_all(fd, "{\"op\":");
    const auto start = std::chrono::steady_clock::now();
    BOOST_TEST(read_until_eof(fd).empty());
    BOOST_TEST((std::chrono::steady_clock::now() - start < 20s));
    ::close(fd);

    // A lease is never idle.
    control::ControlClient client(f.config.socket);
    auto lease = client.lease("long");
    std::this_thread::sleep_for(600ms);  // real time: twice the idle timeout, which is real time
    BOOST_TEST(lease->alive());
    BOOST_TEST(f.handler.count("closed") == 0u);
}

BOOST_AUTO_TEST_CASE(a_byte_at_a_time_does_not_defeat_the_idle_timeout) {
    reaperd::ControlServerLimits limits;
    limits.idle_timeout = 300ms;
    Fixture f(limits);
    const int fd = connect_raw(f.config.socket);
    const auto start = std::chrono::steady_clock::now();
    bool closed = false;
    // A byte every 100 ms, never a newline: before, each byte reset the timeout.
    while (std::chrono::steady_clock::now() - start < 10s) {
        if (::send(fd, " ", 1, MSG_NOSIGNAL) != 1) {
            closed = true;
            break;
        }
        std::this_thread::sleep_for(100ms);  // real time: the server's idle timeout is real time
        char c;
        const auto n = ::recv(fd, &c, 1, MSG_DONTWAIT);
        if (n == 0) {
            closed = true;
            break;
        }
    }
    BOOST_TEST(closed);
    BOOST_TEST((std::chrono::steady_clock::now() - start < 5s));
    ::close(fd);
}

BOOST_AUTO_TEST_CASE(reading_pauses_while_replies_are_unread) {
    reaperd::ControlServerLimits limits;
    limits.output_pause_bytes = 4 * 1024;
    Fixture f(limits);
    f.handler.status_padding = 32 * 1024;
    const int fd = connect_raw(f.config.socket);
    constexpr std::size_t asked = 200;
    std::string requests;
    for (std::size_t i = 0; i < asked; ++i) requests += "{\"op\":\"status\"}\n";
    send_all(fd, requests);
    // The kernel's socket buffers take a few replies; then the server stops answering. A
    // pause shows only as nothing more happening, so the count is watched over half a second
    // (the first dozen replies take ~5 ms here).
    std::size_t settled = 0;
    for (int i = 0; i < 10; ++i) {
        std::this_thread::sleep_for(50ms);  // real time: a negative check, nothing more answered
        settled = f.handler.status_calls;
    }
    BOOST_TEST(settled < asked / 2, settled << " of " << asked << " answered while unread");
    BOOST_TEST(f.server->connection_count() == 1u);
    // Reading resumes it: every request is answered, none lost. Read in blocks: 6.4 MB a
    // byte per recv() took 3 s.
    std::size_t replies = 0;
    std::string pending;
    char block[64 * 1024];
    while (replies < asked) {
        const auto n = ::recv(fd, block, sizeof block, 0);
        if (n <= 0) break;
        pending.append(block, static_cast<std::size_t>(n));
        for (auto end = pending.find('\n'); end != std::string::npos; end = pending.find('\n')) {
            BOOST_REQUIRE(std::string_view(pending).substr(0, end).find("\"ok\":true") != std::string_view::npos);
            pending.erase(0, end + 1);
            ++replies;
        }
    }
    BOOST_TEST(replies == asked);
    BOOST_TEST(f.handler.status_calls == asked);
    ::close(fd);
}

BOOST_AUTO_TEST_CASE(a_client_over_the_hard_output_limit_is_disconnected) {
    reaperd::ControlServerLimits limits;
    limits.output_pause_bytes = 4 * 1024;
    limits.output_hard_bytes = 256 * 1024;
    Fixture f(limits);
    f.handler.status_padding = 2 * 1024 * 1024;  // one reply is past the hard limit
    const int fd = connect_raw(f.config.socket);
    send_all(fd, "{\"op\":\"status\"}\n{\"op\":\"status\"}\n");
    BOOST_REQUIRE(eventually([&] { return f.handler.status_calls >= 1u; }));
    BOOST_REQUIRE(eventually([&] { return f.server->connection_count() == 0; }));
    BOOST_TEST(f.handler.status_calls == 1u);
    // What it gets is cut short: less than the reply, then end of stream.
    BOOST_TEST(read_until_eof(fd).size() < 2u * 1024 * 1024);
    ::close(fd);
    // Others are served as before.
    control::ControlClient client(f.config.socket);
    f.handler.status_padding = 0;
    BOOST_TEST(!client.status_json().empty());
}

BOOST_AUTO_TEST_CASE(the_connection_cap_stays_below_the_descriptor_limit) {
    const reaperd::ControlServerLimits defaults;
    // The unit's LimitNOFILE leaves the default cap as it is.
    BOOST_TEST(reaperd::fit_to_descriptors(defaults, 8192).max_connections == 4096u);
    // A shell's usual 1024 keeps the reserve free.
    BOOST_TEST(reaperd::fit_to_descriptors(defaults, 1024).max_connections ==
               1024u - reaperd::reserved_descriptors);
    // Absurdly low limits still serve one connection.
    BOOST_TEST(reaperd::fit_to_descriptors(defaults, 100).max_connections == 1u);
    BOOST_TEST(reaperd::fit_to_descriptors(defaults, 0).max_connections == 1u);
    // An infinite limit changes nothing.
    BOOST_TEST(reaperd::fit_to_descriptors(defaults, ~std::uint64_t{0}).max_connections == 4096u);
}

BOOST_AUTO_TEST_CASE(connections_beyond_the_per_uid_limit_are_refused_with_a_clear_error) {
    reaperd::ControlServerLimits limits;
    limits.max_connections_per_uid = 2;
    Fixture f(limits);
    control::ControlClient client(f.config.socket);
    auto a = client.lease("a");
    auto b = client.lease("b");
    try {
        client.lease("c");
        BOOST_FAIL("third connection of one uid accepted");
    } catch (const control::ErrorReply& e) {
        BOOST_TEST(std::string(e.what()).find("too many connections from uid " + std::to_string(::getuid())) !=
                       std::string::npos,
                   e.what());
    }
    a->release();
    BOOST_REQUIRE(f.handler.wait_for([&] { return f.handler.count("closed") == 1; }));
    auto c = client.lease("c");
    BOOST_TEST(c->alive());
}

// Everything the daemon's log writes to stderr (its sink outside journald) while `body` runs.
std::string stderr_of(const std::function<void()>& body) {
    char path[] = "/tmp/reaper-control-server-stderr.XXXXXX";
    const int file = ::mkstemp(path);
    BOOST_REQUIRE(file >= 0);
    const int saved = ::dup(2);
    ::dup2(file, 2);
    try {
        body();
    } catch (...) {
        ::dup2(saved, 2);
        throw;
    }
    ::dup2(saved, 2);
    ::close(saved);
    ::close(file);
    std::ifstream in(path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ::unlink(path);
    return text;
}

std::size_t occurrences(const std::string& text, const std::string& word) {
    std::size_t n = 0;
    for (auto at = text.find(word); at != std::string::npos; at = text.find(word, at + word.size())) ++n;
    return n;
}

BOOST_AUTO_TEST_CASE(leases_beyond_the_per_uid_limit_are_refused_counted_and_logged_once_per_burst) {
    reaperd::ControlServerLimits limits;
    limits.max_leases_per_uid = 2;
    Fixture f(limits);
    control::ControlClient client(f.config.socket);
    auto a = client.lease("a");
    auto b = client.lease("b");
    const std::string refusal = "too many leases held by uid " + std::to_string(::getuid()) +
                                " (2, control.max_leases_per_uid)";
    const auto log = stderr_of([&] {
        for (int i = 0; i < 5; ++i) {
            try {
                client.lease("c");
                BOOST_FAIL("third lease of one uid accepted");
            } catch (const control::ErrorReply& e) {
                BOOST_TEST(std::string(e.what()).find(refusal) != std::string::npos, e.what());
            }
        }
        // Plain requests of that uid are still served at its lease limit.
        BOOST_TEST(client.status_json().find("s1") != std::string::npos);
    });
    BOOST_TEST(occurrences(log, "refusing leases") == 1u, log);
    BOOST_TEST(occurrences(log, "lease session c") == 0u, log);  // refused before the request is logged
    BOOST_TEST(f.handler.count("opened") == 2u);  // the handler never saw the refused ones
    BOOST_TEST(f.handler.refused("leases_per_uid") == 5u);

    // A lease freed makes room, and ends the burst: the next refusal is logged again.
    a->release();
    BOOST_REQUIRE(f.handler.wait_for([&] { return f.handler.count("closed") == 1; }));
    BOOST_REQUIRE(eventually([&] { return f.server->connection_count() == 1; }));
    auto c = client.lease("c");
    BOOST_TEST(c->alive());
    const auto again = stderr_of([&] { BOOST_CHECK_THROW(client.lease("d"), control::ErrorReply); });
    BOOST_TEST(occurrences(again, "refusing leases") == 1u, again);
    BOOST_TEST(f.handler.refused("leases_per_uid") == 6u);
}

BOOST_AUTO_TEST_CASE(a_lease_refused_or_failed_holds_no_place_under_the_per_uid_limit) {
    reaperd::ControlServerLimits limits;
    limits.max_leases_per_uid = 1;
    Fixture f(limits);
    control::ControlClient client(f.config.socket);
    BOOST_CHECK_THROW(client.lease("refuse-me"), control::ErrorReply);  // the handler threw
    auto a = client.lease("a");
    BOOST_CHECK_THROW(client.lease("b"), control::ErrorReply);
    a->release();
    BOOST_REQUIRE(f.handler.wait_for([&] { return f.handler.count("closed") == 1; }));
    BOOST_REQUIRE(eventually([&] { return f.server->connection_count() == 0; }));
    auto b = client.lease("b");
    BOOST_TEST(b->alive());
}

BOOST_AUTO_TEST_CASE(new_uid_limits_apply_to_new_requests_and_keep_what_is_held) {
    Fixture f;  // no per-uid limits
    control::ControlClient client(f.config.socket);
    auto a = client.lease("a");
    auto b = client.lease("b");
    auto c = client.lease("c");
    f.server->set_uid_limits(0, 2);
    BOOST_CHECK_THROW(client.lease("d"), control::ErrorReply);
    BOOST_TEST(a->alive());
    BOOST_TEST(c->alive());
    BOOST_TEST(f.handler.count("closed") == 0u);
    f.server->set_uid_limits(3, 0);
    BOOST_CHECK_THROW(client.lease("d"), control::ErrorReply);  // a fourth connection
    BOOST_TEST(f.handler.refused("connections_per_uid") == 1u);
    f.server->set_uid_limits(0, 0);
    auto d = client.lease("d");
    BOOST_TEST(d->alive());
}

BOOST_AUTO_TEST_CASE(connections_beyond_the_limit_are_refused) {
    reaperd::ControlServerLimits limits;
    limits.max_connections = 3;
    Fixture f(limits);
    control::ControlClient client(f.config.socket);
    auto a = client.lease("a");
    auto b = client.lease("b");
    auto c = client.lease("c");
    try {
        client.lease("d");
        BOOST_FAIL("fourth connection accepted");
    } catch (const control::ErrorReply& e) {
        BOOST_TEST(std::string(e.what()).find("too many connections") != std::string::npos, e.what());
    }
    a->release();
    BOOST_REQUIRE(f.handler.wait_for([&] { return f.handler.count("closed") == 1; }));
    auto d = client.lease("d");
    BOOST_TEST(d->alive());
}

BOOST_AUTO_TEST_CASE(a_thousand_lease_cycles_leave_the_fd_count_at_baseline) {
    Fixture f;
    control::ControlClient client(f.config.socket);
    client.end("warm-up");
    BOOST_REQUIRE(eventually([&] { return f.server->connection_count() == 0; }));
    const auto baseline = open_fd_count();
    for (int i = 0; i < 1000; ++i) {
        auto lease = client.lease("cycle-" + std::to_string(i % 10));
    }
    BOOST_REQUIRE(f.handler.wait_for([&] { return f.handler.count("closed") == 1000; }));
    BOOST_TEST(f.handler.count("opened") == 1000u);
    BOOST_REQUIRE(eventually([&] { return f.server->connection_count() == 0; }));
    BOOST_TEST(open_fd_count() == baseline);
}

BOOST_AUTO_TEST_CASE(two_hundred_concurrent_leases) {
    Fixture f;
    std::vector<std::unique_ptr<control::Lease>> leases(200);
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
        threads.emplace_back([&, t] {
            control::ControlClient client(f.config.socket, 30s);
            for (std::size_t i = static_cast<std::size_t>(t); i < leases.size(); i += 8) {
                leases[i] = client.lease("s" + std::to_string(i));
            }
        });
    }
    for (auto& thread : threads) thread.join();
    BOOST_TEST(f.handler.count("opened") == 200u);
    BOOST_TEST(f.server->connection_count() == 200u);
    // Status still answers while 200 leases are open.
    BOOST_TEST(control::ControlClient(f.config.socket).status_json().find("sessions") != std::string::npos);
    for (const auto& lease : leases) BOOST_TEST(lease->alive());
    leases.clear();
    BOOST_REQUIRE(f.handler.wait_for([&] { return f.handler.count("closed") == 200; }));
}

BOOST_AUTO_TEST_CASE(stop_closes_leases_without_ending_them) {
    Fixture f;
    control::ControlClient client(f.config.socket);
    auto lease = client.lease("survivor");
    f.server->stop();
    f.server->stop();
    BOOST_TEST(f.handler.count("closed") == 0u);
    BOOST_TEST(eventually([&] { return !lease->alive(); }));
    BOOST_TEST(!std::filesystem::exists(f.config.socket));
    BOOST_CHECK_THROW(client.end("x"), control::DaemonUnreachable);
}

BOOST_AUTO_TEST_CASE(socket_file_mode_group_and_stale_handling) {
    const auto dir = make_temp_dir();
    RecordingHandler handler;
    reaperd::ControlConfig config;
    config.socket = dir + "/control.sock";
    {
        const group* own = ::getgrgid(::getgid());
        BOOST_REQUIRE(own != nullptr);
        config.group = own->gr_name;
        reaperd::ControlServer server(config, handler);
        struct stat info {};
        BOOST_REQUIRE(::stat(config.socket.c_str(), &info) == 0);
        BOOST_TEST(S_ISSOCK(info.st_mode));
        BOOST_TEST((info.st_mode & 07777) == 0660u);
        BOOST_TEST(info.st_gid == ::getgid());
        // The path appears only once the socket listens (it is bound as ".new" and renamed):
        // a connect the moment the file exists is never refused.
        BOOST_TEST(!std::filesystem::exists(config.socket + ".new"));
        {
            const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
            sockaddr_un address{};
            address.sun_family = AF_UNIX;
            std::strcpy(address.sun_path, config.socket.c_str());
            BOOST_TEST(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0, std::strerror(errno));
            ::close(fd);
        }
        server.start();

        // A second server must not steal a live socket.
        try {
            reaperd::ControlServer second(config, handler);
            BOOST_FAIL("bound over a live socket");
        } catch (const std::runtime_error& e) {
            BOOST_TEST(std::string(e.what()).find("another process is listening") != std::string::npos, e.what());
        }
        control::ControlClient(config.socket).end("still-served");
    }
    BOOST_TEST(handler.count("end") == 1u);

    // A stale socket file (nobody listening) is replaced.
    {
        const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
        sockaddr_un address{};
        address.sun_family = AF_UNIX;
        std::strcpy(address.sun_path, config.socket.c_str());
        BOOST_REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
        ::close(fd);
        config.group = std::to_string(::getgid());
        reaperd::ControlServer server(config, handler);
        server.start();
        control::ControlClient(config.socket).end("after-stale");
    }

    // Something that is not a socket is never removed.
    std::ofstream(config.socket) << "precious";
    try {
        reaperd::ControlServer server(config, handler);
        BOOST_FAIL("replaced a regular file");
    } catch (const std::runtime_error& e) {
        BOOST_TEST(std::string(e.what()).find("is not a socket") != std::string::npos, e.what());
    }
    BOOST_TEST(std::filesystem::is_regular_file(config.socket));
    std::filesystem::remove(config.socket);

    config.group = "no-such-group-reaperd-test";
    try {
        reaperd::ControlServer server(config, handler);
        BOOST_FAIL("unknown group accepted");
    } catch (const std::runtime_error& e) {
        BOOST_TEST(std::string(e.what()).find("no such group \"no-such-group-reaperd-test\"") != std::string::npos, e.what());
    }
    BOOST_TEST(!std::filesystem::exists(config.socket));
    BOOST_TEST(!std::filesystem::exists(config.socket + ".new"));

    config.group.clear();
    config.socket = dir + "/" + std::string(120, 'x');
    try {
        reaperd::ControlServer server(config, handler);
        BOOST_FAIL("overlong path accepted");
    } catch (const std::runtime_error& e) {
        BOOST_TEST(std::string(e.what()).find("at most") != std::string::npos, e.what());
    }
    std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(replies_say_what_happened) {
    Fixture f;
    control::ControlClient client(f.config.socket);
    const auto ended = client.end("s1");
    BOOST_TEST(ended.session == "s1");
    BOOST_TEST(ended.known.value());
    BOOST_TEST(!ended.already_ended.value());
    BOOST_TEST((ended.reaps_queued == control::KindCounts{{"containers", 3}}));
    BOOST_TEST(!client.end("stranger").known.value());

    const auto left = client.session("s1");
    BOOST_TEST(left.state == "ended");
    BOOST_TEST(left.remaining_total() == 1u);
    BOOST_TEST(!left.nothing_remains());
    BOOST_TEST(f.handler.count("session") == 1u);

    const auto orphan = client.report_orphan("web", "");
    BOOST_TEST(orphan.container == std::string(64, 'a'));
    BOOST_TEST(orphan.name == "web");
    BOOST_TEST(orphan.owned.value());
    BOOST_TEST(orphan.queued.value());
    try {
        client.report_orphan("theirs", "");
        BOOST_FAIL("no error reply");
    } catch (const control::ErrorReply& e) {
        BOOST_TEST(e.reply().container == std::string(64, 'b'));
        BOOST_TEST(!e.reply().owned.value());
        BOOST_TEST(!e.reply().queued.value());
        BOOST_TEST(e.reply().error.find("carries no session label") != std::string::npos, e.reply().error);
    }
}

BOOST_AUTO_TEST_CASE(a_slow_end_delays_neither_leases_nor_status) {
    Fixture f;
    std::promise<void> release;
    f.handler.hold_end = release.get_future().share();
    const int ender = connect_raw(f.config.socket);
    send_all(ender, "{\"op\":\"end\",\"session\":\"slow\"}\n");
    control::ControlClient client(f.config.socket, 5s);
    auto lease = client.lease("quick");
    BOOST_TEST(client.status_json().find("sessions") != std::string::npos);
    BOOST_TEST(f.handler.count("end") == 0u);
    release.set_value();
    BOOST_TEST(control::parse_reply(read_line(ender)).session == "slow");
    ::close(ender);
}

BOOST_AUTO_TEST_CASE(a_proxy_lease_takes_updates_and_names_its_client_process) {
    Fixture f;
    const int fd = connect_raw(f.config.socket);
    send_all(fd, "{\"op\":\"lease\",\"session\":\"P\",\"proxy\":true,\"containers_labelled\":1}\n");
    BOOST_TEST(read_line(fd) == "{\"ok\":true}");
    // A line may come in pieces; the lease holds meanwhile.
    send_all(fd, "{\"op\":\"update\",\"containers_labelled\":2,");
    std::this_thread::sleep_for(50ms);  // real time: the server reads the two pieces apart
    send_all(fd, "\"networks_labelled\":1}\n");
    BOOST_TEST(read_line(fd) == "{\"ok\":true}");
    // A report the handler fails on is answered with the error; the lease stays.
    send_all(fd, "{\"op\":\"update\",\"volumes_labelled\":666}\n");
    BOOST_TEST(read_line(fd).find("update failed: cursed count") != std::string::npos);
    send_all(fd, "{\"op\":\"update\",\"containers_labelled\":3,\"networks_labelled\":1,\"volumes_labelled\":1}\n");
    BOOST_TEST(read_line(fd) == "{\"ok\":true}");
    auto events = f.handler.events();
    BOOST_REQUIRE(events.size() == 4u);
    BOOST_TEST(events[0].kind == "opened");
    for (std::size_t i = 1; i < events.size(); ++i) {
        BOOST_TEST(events[i].kind == "proxy");
        BOOST_TEST(events[i].a == "P");
        BOOST_TEST(events[i].connection == events[0].connection);
        BOOST_TEST(events[i].proxy.client == ::getpid());
    }
    BOOST_TEST((events[1].proxy.labelled == control::LabelledCounts{1, 0, 0}));
    BOOST_TEST((events[2].proxy.labelled == control::LabelledCounts{2, 1, 0}));
    BOOST_TEST((events[3].proxy.labelled == control::LabelledCounts{3, 1, 1}));
    BOOST_TEST(f.handler.count("closed") == 0u);
    ::close(fd);
    BOOST_REQUIRE(f.handler.wait_for([&] { return f.handler.count("closed") == 1; }));

    // The library's side of it.
    control::ControlClient client(f.config.socket);
    auto lease = client.proxy_lease("Q", {4, 0, 0});
    lease->update({5, 0, 1}, 2s);
    BOOST_TEST(lease->alive());
    BOOST_REQUIRE(f.handler.wait_for([&] { return f.handler.count("proxy") == 5; }));
    BOOST_TEST((f.handler.events().back().proxy.labelled == control::LabelledCounts{5, 0, 1}));
}

BOOST_AUTO_TEST_CASE(updates_and_proxy_fields_are_refused_where_they_do_not_belong) {
    Fixture f;
    struct Case {
        std::string name;
        std::string bytes;
        std::string expected_fragment;
        bool leased;  // a lease was taken (and ends with the connection)
    };
    const std::vector<Case> cases{
        {"update without a lease", "{\"op\":\"update\",\"containers_labelled\":1}\n",
         "belongs on the connection of a lease taken with \"proxy\":true", false},
        {"update on a plain lease", "{\"op\":\"lease\",\"session\":\"L1\"}\n{\"op\":\"update\"}\n",
         "lease connections take no further requests", true},
        {"another op on a proxy lease", "{\"op\":\"lease\",\"session\":\"L2\",\"proxy\":true}\n{\"op\":\"status\"}\n",
         "takes no requests but \"update\"", true},
        {"a negative count", "{\"op\":\"lease\",\"session\":\"L3\",\"proxy\":true}\n{\"op\":\"update\",\"containers_labelled\":-1}\n",
         "field \"containers_labelled\" must be a non-negative integer", true},
        {"a count that is a string", "{\"op\":\"lease\",\"session\":\"L4\",\"proxy\":true}\n{\"op\":\"update\",\"volumes_labelled\":\"2\"}\n",
         "field \"volumes_labelled\" must be a non-negative integer", true},
        {"proxy not a boolean", "{\"op\":\"lease\",\"session\":\"L5\",\"proxy\":\"yes\"}\n",
         "field \"proxy\" must be a boolean", false},
        {"counts without a proxy", "{\"op\":\"lease\",\"session\":\"L6\",\"networks_labelled\":1}\n",
         "field \"networks_labelled\" needs \"proxy\":true", false},
        {"proxy on end", "{\"op\":\"end\",\"session\":\"L7\",\"proxy\":true}\n",
         "unexpected field \"proxy\" for op \"end\"", false},
    };
    std::size_t leases = 0;
    for (const auto& c : cases) {
        BOOST_TEST_CONTEXT(c.name) {
            const auto reply = last_reply_to(f.config.socket, c.bytes);
            BOOST_TEST(!reply.ok);
            BOOST_TEST(reply.error.find(c.expected_fragment) != std::string::npos, reply.error);
            if (c.leased) ++leases;
        }
    }
    BOOST_REQUIRE(f.handler.wait_for([&] { return f.handler.count("closed") == leases; }));
    BOOST_TEST(f.handler.count("opened") == leases);
    // Fields this daemon does not know are ignored: a newer client's.
    const int fd = connect_raw(f.config.socket);
    send_all(fd, "{\"op\":\"end\",\"session\":\"newer\",\"reason\":\"done\"}\n");
    BOOST_TEST(control::parse_reply(read_line(fd)).session == "newer");
    ::close(fd);
}

// A user's reaperd serves that uid only; root by control.allow_root; root's reaperd leaves
// admission to the socket's mode and group.
BOOST_AUTO_TEST_CASE(a_users_daemon_admits_its_own_uid_and_root_only_when_allowed) {
    struct Row {
        std::int64_t peer;
        std::int64_t daemon;
        bool allow_root;
        bool admitted;
    };
    const std::vector<Row> rows{
        {1000, 1000, false, true}, {1001, 1000, false, false}, {1001, 1000, true, false},
        {0, 1000, false, false},   {0, 1000, true, true},      {-1, 1000, true, false},
        {1000, 0, false, true},    {0, 0, false, true},        {-1, 0, false, true},
    };
    for (const Row& row : rows) {
        BOOST_TEST_CONTEXT("peer " << row.peer << ", daemon " << row.daemon << ", allow_root " << row.allow_root) {
            BOOST_TEST(reaperd::peer_admitted(row.peer, row.daemon, row.allow_root) == row.admitted);
        }
    }
}
