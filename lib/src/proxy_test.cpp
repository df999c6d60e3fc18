// The labelling engine proxy against a scripted engine on a unix socket: what reaches the
// engine, what reaches the tool, streams, hijacks, refusals, and that stop() leaves nothing.
#include <reaper/proxy.hpp>

#include "eventually.hpp"

#include <boost/test/unit_test.hpp>

#include <Poco/JSON/Object.h>
#include <Poco/JSON/Parser.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using reaper::test::eventually;
using reaper::add_label;
using reaper::add_log_rotation;
using reaper::create_kind;
using reaper::CreateKind;
using reaper::LabelRefused;

namespace {

std::size_t open_fds() {
    std::size_t n = 0;
    for ([[maybe_unused]] auto& entry : fs::directory_iterator("/proc/self/fd")) ++n;
    return n;
}

struct TempDir {
    TempDir() {
        char pattern[] = "/tmp/proxy-test.XXXXXX";
        path = ::mkdtemp(pattern);
    }
    ~TempDir() { fs::remove_all(path); }
    std::string path;
};

int connect_to(const std::string& path) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un where{};
    where.sun_family = AF_UNIX;
    std::strncpy(where.sun_path, path.c_str(), sizeof where.sun_path - 1);
    BOOST_REQUIRE_MESSAGE(::connect(fd, reinterpret_cast<sockaddr*>(&where), sizeof where) == 0,
                          "connect " << path << ": " << std::strerror(errno));
    return fd;
}

// One end of a test connection: blocking reads with a 10 s limit, so a bug fails the test
// instead of hanging it.
class Peer {
public:
    explicit Peer(int fd) : fd_(fd) {
        timeval limit{10, 0};
        ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    }
    ~Peer() { ::close(fd_); }
    Peer(const Peer&) = delete;
    Peer& operator=(const Peer&) = delete;

    int fd() const { return fd_; }
    void send(std::string_view data) {
        while (!data.empty()) {
            auto n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
            if (n <= 0) throw std::runtime_error("send failed");
            data.remove_prefix(static_cast<std::size_t>(n));
        }
    }
    void shutdown_write() { ::shutdown(fd_, SHUT_WR); }
    // False at EOF (or after the 10 s limit).
    bool fill() {
        char chunk[65536];
        auto n = ::recv(fd_, chunk, sizeof chunk, 0);
        if (n <= 0) return false;
        buffer_.append(chunk, static_cast<std::size_t>(n));
        return true;
    }
    // The next head, "" at EOF.
    std::string head() {
        for (;;) {
            auto end = buffer_.find("\r\n\r\n");
            if (end != std::string::npos) return take(end + 4);
            if (!fill()) return "";
        }
    }
    std::string take(std::size_t n) {
        while (buffer_.size() < n)
            if (!fill()) throw std::runtime_error("EOF after " + std::to_string(buffer_.size()) + " bytes");
        auto out = buffer_.substr(0, n);
        buffer_.erase(0, n);
        return out;
    }
    // A body as `head` frames it, decoded.
    std::string body(const std::string& head) {
        auto lower = head;
        for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (lower.find("transfer-encoding: chunked") != std::string::npos) {
            std::string out;
            for (;;) {
                while (buffer_.find("\r\n") == std::string::npos)
                    if (!fill()) throw std::runtime_error("EOF in a chunk size");
                auto line = take(buffer_.find("\r\n") + 2);
                auto size = std::stoul(line, nullptr, 16);
                if (size == 0) {
                    take(2);
                    return out;
                }
                out += take(size);
                take(2);
            }
        }
        auto at = lower.find("content-length: ");
        if (at == std::string::npos) return "";
        return take(std::stoul(head.substr(at + 16)));
    }
    std::string rest() {
        while (fill()) {
        }
        return std::exchange(buffer_, {});
    }
    // True when the peer closed (EOF) within `limit`.
    bool sees_eof(std::chrono::milliseconds limit) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, static_cast<int>(limit.count())) <= 0) return false;
        char byte;
        return ::recv(fd_, &byte, 1, MSG_DONTWAIT) == 0;
    }

private:
    int fd_;
    std::string buffer_;
};

// A scripted engine: each connection runs `script` on a thread of its own.
class ScriptedEngine {
public:
    using Script = std::function<void(Peer&, ScriptedEngine&)>;

    ScriptedEngine(std::string path, Script script) : path_(std::move(path)), script_(std::move(script)) {
        listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_un where{};
        where.sun_family = AF_UNIX;
        std::strncpy(where.sun_path, path_.c_str(), sizeof where.sun_path - 1);
        BOOST_REQUIRE(::bind(listener_, reinterpret_cast<sockaddr*>(&where), sizeof where) == 0);
        BOOST_REQUIRE(::listen(listener_, 16) == 0);
        acceptor_ = std::thread([this] {
            for (;;) {
                int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
                if (fd < 0) return;
                std::lock_guard lock(mutex_);
                ++connections;
                auto& peer = peers_.emplace_back(std::make_unique<Peer>(fd));
                threads_.emplace_back([this, p = peer.get()] {
                    try {
                        script_(*p, *this);
                    } catch (const std::exception&) {
                        // The proxy side went away.
                    }
                });
            }
        });
    }
    ~ScriptedEngine() {
        ::shutdown(listener_, SHUT_RDWR);
        acceptor_.join();
        ::close(listener_);
        {
            std::lock_guard lock(mutex_);
            for (auto& peer : peers_) ::shutdown(peer->fd(), SHUT_RDWR);
        }
        for (auto& t : threads_) t.join();
    }

    void record(std::string request) {
        std::lock_guard lock(mutex_);
        requests.push_back(std::move(request));
        changed_.notify_all();
    }
    std::vector<std::string> seen() {
        std::lock_guard lock(mutex_);
        return requests;
    }
    bool wait_requests(std::size_t n) {
        std::unique_lock lock(mutex_);
        return changed_.wait_for(lock, 10s, [&] { return requests.size() >= n; });
    }

    std::atomic<int> connections{0};

private:
    std::string path_;
    Script script_;
    int listener_ = -1;
    std::thread acceptor_;
    std::mutex mutex_;
    std::condition_variable changed_;
    std::list<std::unique_ptr<Peer>> peers_;
    std::list<std::thread> threads_;
    std::vector<std::string> requests;
};

// An engine that records each request (head + decoded body) and answers with `answer`.
ScriptedEngine::Script answering(std::function<std::string(const std::string& head, const std::string& body)> answer) {
    return [answer](Peer& peer, ScriptedEngine& engine) {
        for (;;) {
            auto head = peer.head();
            if (head.empty()) return;
            auto body = peer.body(head);
            engine.record(head + body);
            peer.send(answer(head, body));
        }
    };
}

std::string json_answer(int status, const std::string& body) {
    return "HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
}

struct Fixture {
    explicit Fixture(ScriptedEngine::Script script, std::size_t max_body = 16 * 1024 * 1024,
                     std::uint64_t rotation_cap = 0)
        : engine(dir.path + "/engine.sock", std::move(script)) {
        reaper::ProxyOptions options;
        options.upstream = reaper::EngineAddress::parse("unix://" + dir.path + "/engine.sock");
        options.listen_path = dir.path + "/proxy.sock";
        options.session = "s-test";
        options.max_body_bytes = max_body;
        if (rotation_cap > 0) options.log_rotation_cap = [rotation_cap] { return rotation_cap; };
        options.log = [this](const reaper::LogRecord& record) {
            std::lock_guard lock(log_mutex);
            log.push_back(record);
        };
        proxy = std::make_unique<reaper::EngineProxy>(options);
        proxy->start();
    }
    std::unique_ptr<Peer> client() { return std::make_unique<Peer>(connect_to(dir.path + "/proxy.sock")); }
    std::size_t warnings() {
        std::lock_guard lock(log_mutex);
        std::size_t n = 0;
        for (const auto& r : log) n += r.level == reaper::LogLevel::Warning;
        return n;
    }

    TempDir dir;
    ScriptedEngine engine;
    std::mutex log_mutex;
    std::vector<reaper::LogRecord> log;
    std::unique_ptr<reaper::EngineProxy> proxy;
};

Poco::JSON::Object::Ptr parse_object(const std::string& text) {
    Poco::JSON::Parser parser;
    return parser.parse(text).extract<Poco::JSON::Object::Ptr>();
}

std::string body_of(const std::string& request) { return request.substr(request.find("\r\n\r\n") + 4); }

std::string post(const std::string& target, const std::string& body) {
    return "POST " + target + " HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
}

}  // namespace

BOOST_AUTO_TEST_CASE(create_kind_matches_the_three_creates_as_the_engine_routes_them) {
    struct Row {
        const char* method;
        const char* target;
        CreateKind kind;
    };
    const Row rows[] = {
        {"POST", "/containers/create", CreateKind::Container},
        {"POST", "/v1.41/containers/create?name=web", CreateKind::Container},
        {"POST", "/v1/containers/create", CreateKind::Container},
        {"POST", "/networks/create", CreateKind::Network},
        {"POST", "/v1.52/volumes/create", CreateKind::Volume},
        {"POST", "/containers/%63reate", CreateKind::Container},  // the router sees it decoded
        {"POST", "//containers/./create", CreateKind::Container},
        {"GET", "/containers/create", CreateKind::None},
        {"post", "/containers/create", CreateKind::None},  // methods are case-sensitive
        {"POST", "/containers/json", CreateKind::None},
        {"POST", "/containers/abc/start", CreateKind::None},
        {"POST", "/vx/containers/create", CreateKind::None},
        {"POST", "/v1.41/v1.41/containers/create", CreateKind::None},
        {"POST", "/images/create?fromImage=busybox", CreateKind::None},
        {"POST", "/exec/abc/start", CreateKind::None},
    };
    for (const auto& row : rows) {
        BOOST_TEST_CONTEXT(row.method << " " << row.target) {
            BOOST_TEST(to_string(create_kind(row.method, row.target)) == to_string(row.kind));
        }
    }
}

BOOST_AUTO_TEST_CASE(add_label_adds_the_label_and_keeps_the_rest_of_the_text) {
    struct Row {
        std::string body;
        std::string expected;
    };
    const std::vector<Row> rows{
        {R"({"Image":"x"})", R"({"Labels":{"k":"S"},"Image":"x"})"},
        {R"({})", R"({"Labels":{"k":"S"}})"},
        {" { } ", R"( {"Labels":{"k":"S"} } )"},
        {"", R"({"Labels":{"k":"S"}})"},
        {"\n", R"({"Labels":{"k":"S"}})"},
        {R"({"Labels":null,"Image":"x"})", R"({"Labels":{"k":"S"},"Image":"x"})"},
        {R"({"Labels":{},"Image":"x"})", R"({"Labels":{"k":"S"},"Image":"x"})"},
        {R"({"Labels":{"a":"b"}})", R"({"Labels":{"k":"S","a":"b"}})"},
        {R"({"labels":{"a":"b"}})", R"({"labels":{"k":"S","a":"b"}})"},    // Go matches any case
        {R"({"LABELS" : { "a":"b"}})", R"({"LABELS" : {"k":"S", "a":"b"}})"},
        {R"({"Lab\u0065ls":{"a":"b"}})", R"({"Lab\u0065ls":{"k":"S","a":"b"}})"},
        {"{\"label\xC5\xBF\":{}}", "{\"label\xC5\xBF\":{\"k\":\"S\"}}"},  // U+017F folds to s
        {R"({"Labels":{"k":"S"},"Image":"x"})", R"({"Labels":{"k":"S"},"Image":"x"})"},  // same value
        // Numbers, nesting and a Labels below the top level stay as they are.
        {R"({"Memory":12345678901234567890,"Cpu":0.1000000000000000055511151231257827,"HostConfig":{"Labels":{"k":"other"}},"NetworkingConfig":{"EndpointsConfig":{"n":{"Aliases":["a}\"{"]}}}})",
         R"({"Labels":{"k":"S"},"Memory":12345678901234567890,"Cpu":0.1000000000000000055511151231257827,"HostConfig":{"Labels":{"k":"other"}},"NetworkingConfig":{"EndpointsConfig":{"n":{"Aliases":["a}\"{"]}}}})"},
        {"{\"Labels\":{\"a\":\"\\\"}\"}}\n", "{\"Labels\":{\"k\":\"S\",\"a\":\"\\\"}\"}}\n"},
    };
    for (const auto& row : rows) {
        BOOST_TEST_CONTEXT(row.body) {
            BOOST_TEST(add_label(row.body, "k", "S") == row.expected);
            // What the engine will decode: valid JSON with the label.
            auto object = parse_object(add_label(row.body, "k", "S"));
            BOOST_TEST(object->size() >= 1u);
        }
    }
    BOOST_TEST(add_label("{}", "reaperd.session", "a\"b") == R"({"Labels":{"reaperd.session":"a\"b"}})");
}

// Docker's own rotation (max-size = half the cap, max-file = 2) goes where the engine reads it,
// the rest of the body byte for byte; a tool's own choice of max-size or max-file, a driver
// that does not rotate, and fields the engine would not read as objects leave the body alone.
BOOST_AUTO_TEST_CASE(add_log_rotation_adds_rotation_where_the_engine_reads_it) {
    const std::string r = R"("max-file":"2","max-size":"2000")";
    struct Row {
        std::string body;
        std::string default_driver;
        std::optional<std::string> expected;
    };
    const std::vector<Row> rows{
        {R"({"Image":"x"})", "json-file", R"({"HostConfig":{"LogConfig":{"Config":{)" + r + R"(}}},"Image":"x"})"},
        {R"({"Image":"x","HostConfig":null})", "local", R"({"Image":"x","HostConfig":{"LogConfig":{"Config":{)" + r + R"(}}}})"},
        {R"({"HostConfig":{"Memory":12345678901234567890}})", "json-file",
         R"({"HostConfig":{"LogConfig":{"Config":{)" + r + R"(}},"Memory":12345678901234567890}})"},
        {R"({"HostConfig":{"LogConfig":null}})", "json-file", R"({"HostConfig":{"LogConfig":{"Config":{)" + r + R"(}}}})"},
        {R"({"HostConfig":{"LogConfig":{"Type":"","Config":{}}}})", "json-file",
         R"({"HostConfig":{"LogConfig":{"Type":"","Config":{)" + r + R"(}}}})"},
        {R"({"HostConfig":{"LogConfig":{"Type":"json-file","Config":null}}})", "journald",
         R"({"HostConfig":{"LogConfig":{"Type":"json-file","Config":{)" + r + R"(}}}})"},
        {R"({"hostconfig":{"logconfig":{"type":"local","config":{"compress":"false"}}}})", "",
         R"({"hostconfig":{"logconfig":{"type":"local","config":{)" + r + R"(,"compress":"false"}}}})"},
        {R"({"HostConfig":{"LogConfig":{"Type":"json-file"}}})", "",
         R"({"HostConfig":{"LogConfig":{"Config":{)" + r + R"(},"Type":"json-file"}}})"},
        // The tool's own rotation is its choice, whichever half of it it gives.
        {R"({"HostConfig":{"LogConfig":{"Type":"json-file","Config":{"max-size":"5m"}}}})", "json-file", std::nullopt},
        {R"({"HostConfig":{"LogConfig":{"Type":"","Config":{"max-file":"9"}}}})", "json-file", std::nullopt},
        // Drivers that rotate nothing, and an engine whose default is not known.
        {R"({"HostConfig":{"LogConfig":{"Type":"journald"}}})", "json-file", std::nullopt},
        {R"({"Image":"x"})", "syslog", std::nullopt},
        {R"({"Image":"x"})", "", std::nullopt},
        // Not where the engine reads it, or named twice: left for the engine to judge.
        {R"({"HostConfig":{"LogConfig":{"Type":"json-file","Config":"x"}}})", "json-file", std::nullopt},
        {R"({"HostConfig":{"LogConfig":{"Type":7}}})", "json-file", std::nullopt},
        {R"({"HostConfig":{},"hostconfig":{}})", "json-file", std::nullopt},
        // A container exempt by its label; one whose label sets a cap of its own.
        {R"({"Labels":{"reaperd.log-max-size":"0"}})", "json-file", std::nullopt},
        {R"({"Labels":{"reaperd.log-max-size":"10k"}})", "json-file",
         R"({"HostConfig":{"LogConfig":{"Config":{"max-file":"2","max-size":"5000"}}},"Labels":{"reaperd.log-max-size":"10k"}})"},
    };
    for (const auto& row : rows) {
        BOOST_TEST_CONTEXT(row.body << " default " << row.default_driver) {
            const auto out = add_log_rotation(row.body, row.default_driver, 4000);
            BOOST_TEST((out == row.expected), (out ? *out : std::string("nullopt")));
            if (out) BOOST_TEST(parse_object(*out)->size() >= 1u);
        }
    }
    BOOST_TEST(!add_log_rotation(R"({"Image":"x"})", "json-file", 1).has_value());  // half of it is 0
}

BOOST_AUTO_TEST_CASE(add_label_refuses_what_it_cannot_label_without_overwriting) {
    const std::vector<std::pair<std::string, std::string>> rows{
        {R"({"Labels":{"k":"other"}})", "k=other is already set"},
        {R"({"Labels":{"k":5}})", "k=5 is already set"},
        {R"({"Labels":{"k":"S","k":"other"}})", "already set"},  // the last one counts, as in Go
        {R"({"Labels":{},"labels":{}})", "2 Labels fields"},
        {R"({"Labels":[]})", "must be an object"},
        {R"({"Labels":"k=S"})", "must be an object"},
        {R"([1,2])", "not a JSON object"},
        {R"("text")", "JSON"},
        {R"({"Image":)", "not valid JSON"},
        {R"(not json)", "not valid JSON"},
        {R"({"a":1} {"b":2})", "not valid JSON"},
    };
    for (const auto& [body, message] : rows) {
        BOOST_TEST_CONTEXT(body) {
            try {
                auto out = add_label(body, "k", "S");
                BOOST_ERROR("not refused: " << out);
            } catch (const LabelRefused& e) {
                BOOST_TEST(std::string(e.what()).find(message) != std::string::npos, e.what());
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(passes_requests_and_answers_through_unchanged_on_one_kept_alive_connection) {
    Fixture f(answering([](const std::string& head, const std::string&) {
        return json_answer(200, head.starts_with("GET /_ping") ? "OK" : R"([{"Id":"a"}])");
    }));
    auto tool = f.client();
    const std::string ping = "GET /_ping HTTP/1.1\r\nHost: api.moby.localhost\r\nUser-Agent: Docker-Client/20.10\r\n\r\n";
    const std::string list = "GET /v1.41/containers/json?all=1&filters=%7B%22label%22%3A%5B%22x%22%5D%7D HTTP/1.1\r\n"
                             "Host: docker\r\nX-Odd-Header:  spaced  \r\n\r\n";
    tool->send(ping);
    auto head = tool->head();
    BOOST_TEST(head.starts_with("HTTP/1.1 200 X\r\n"));
    BOOST_TEST(tool->body(head) == "OK");
    tool->send(list);
    head = tool->head();
    BOOST_TEST(tool->body(head) == R"([{"Id":"a"}])");
    // A request whose body is not a create goes as it is, body included.
    const auto start = post("/v1.41/containers/abc/start", R"({"Labels":{"reaperd.session":"x"}})");
    tool->send(start);
    BOOST_TEST(tool->body(tool->head()) == R"([{"Id":"a"}])");

    auto seen = f.engine.seen();
    BOOST_REQUIRE(seen.size() == 3u);
    BOOST_TEST(seen[0] == ping);
    BOOST_TEST(seen[1] == list);
    BOOST_TEST(seen[2] == start);
    BOOST_TEST(f.engine.connections == 1);
    BOOST_TEST(f.proxy->stats().labelled() == 0u);
}

BOOST_AUTO_TEST_CASE(labels_creates_whatever_their_framing_and_counts_what_the_engine_made) {
    Fixture f(answering([](const std::string& head, const std::string& body) {
        if (body.find("missing") != std::string::npos) return json_answer(404, R"({"message":"No such image"})");
        if (head.find("/containers/create") != std::string::npos) return json_answer(201, R"({"Id":"c1","Warnings":[]})");
        if (head.find("/networks/create") != std::string::npos) return json_answer(201, R"({"Id":"n1","Warning":""})");
        if (head.find("/volumes/create") != std::string::npos) return json_answer(201, R"({"Name":"v1"})");
        return json_answer(500, R"({"message":"no"})");
    }));
    auto tool = f.client();
    tool->send(post("/v1.41/containers/create?name=web", R"({"Image":"busybox","Labels":{"a":"b"}})"));
    auto head = tool->head();
    BOOST_TEST(head.starts_with("HTTP/1.1 201"));
    tool->body(head);
    // Chunked, split across writes, with an extension and a trailer.
    tool->send("POST /networks/create HTTP/1.1\r\nHost: docker\r\nTransfer-Encoding: chunked\r\n"
               "Content-Type: application/json\r\n\r\n5;ext=1\r\n{\"Nam\r\n");
    std::this_thread::sleep_for(20ms);  // real time: the proxy reads the two writes apart
    tool->send("7\r\ne\":\"n\"}\r\n0\r\nX-Trailer: 1\r\n\r\n");
    head = tool->head();
    BOOST_TEST(head.starts_with("HTTP/1.1 201"));
    tool->body(head);
    // An empty body, without a Content-Type.
    tool->send("POST /volumes/create HTTP/1.1\r\nHost: docker\r\nContent-Length: 0\r\n\r\n");
    head = tool->head();
    BOOST_TEST(head.starts_with("HTTP/1.1 201"));
    tool->body(head);
    // Refused by the engine: not counted.
    tool->send(post("/containers/create", R"({"Image":"missing"})"));
    head = tool->head();
    BOOST_TEST(head.starts_with("HTTP/1.1 404"));
    tool->body(head);

    BOOST_REQUIRE(f.engine.wait_requests(4));
    auto seen = f.engine.seen();
    BOOST_TEST(body_of(seen[0]) == R"({"Image":"busybox","Labels":{"reaperd.session":"s-test","a":"b"}})");
    BOOST_TEST(seen[0].find("Content-Length: " + std::to_string(body_of(seen[0]).size()) + "\r\n") != std::string::npos);
    BOOST_TEST(seen[1].find("Transfer-Encoding") == std::string::npos, seen[1]);
    BOOST_TEST(body_of(seen[1]) == R"({"Labels":{"reaperd.session":"s-test"},"Name":"n"})");
    BOOST_TEST(body_of(seen[2]) == R"({"Labels":{"reaperd.session":"s-test"}})");
    BOOST_TEST(seen[2].find("Content-Type: application/json\r\n") != std::string::npos);
    const auto stats = f.proxy->stats();
    BOOST_TEST(stats.containers == 1u);
    BOOST_TEST(stats.networks == 1u);
    BOOST_TEST(stats.volumes == 1u);
    BOOST_TEST(stats.refused == 0u);
}

// Docker's engine: the default driver comes from GET /info, asked once; every create without
// rotation of its own gets it and is counted; a tool's own max-size is passed on as it is.
// Podman (Libpod-Api-Version on its answers) gets none, and no /info (1.7 s there).
BOOST_AUTO_TEST_CASE(container_creates_get_log_rotation_on_docker_and_not_on_podman) {
    for (const bool podman : {false, true}) {
        BOOST_TEST_CONTEXT((podman ? "podman" : "docker")) {
            Fixture f(answering([podman](const std::string& head, const std::string&) {
                          if (head.starts_with("GET /_ping"))
                              return "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n" +
                                     std::string(podman ? "Libpod-Api-Version: 4.3.1\r\n" : "") + "\r\nOK";
                          if (head.starts_with("GET /info")) return json_answer(200, R"({"LoggingDriver":"json-file"})");
                          return json_answer(201, R"({"Id":"c1","Warnings":[]})");
                      }),
                      16 * 1024 * 1024, 2 * 1024 * 1024);
            auto tool = f.client();
            for (const std::string body : {R"({"Image":"a"})", R"({"Image":"b"})",
                                           R"({"Image":"c","HostConfig":{"LogConfig":{"Config":{"max-size":"5m"}}}})"}) {
                tool->send(post("/v1.41/containers/create", body));
                auto head = tool->head();
                BOOST_TEST(head.starts_with("HTTP/1.1 201"));
                tool->body(head);
            }
            std::vector<std::string> creates;
            int infos = 0;
            for (const auto& request : f.engine.seen()) {
                if (request.starts_with("POST")) creates.push_back(body_of(request));
                infos += request.starts_with("GET /info");
            }
            BOOST_REQUIRE(creates.size() == 3u);
            BOOST_TEST(infos == (podman ? 0 : 1));
            const std::string rotation = R"({"HostConfig":{"LogConfig":{"Config":{"max-file":"2","max-size":"1048576"}}},)";
            BOOST_TEST(creates[0] == (podman ? "" : rotation) + std::string(podman ? "{" : "") +
                                         R"("Labels":{"reaperd.session":"s-test"},"Image":"a"})");
            BOOST_TEST(creates[2] == R"({"Labels":{"reaperd.session":"s-test"},"Image":"c","HostConfig":{"LogConfig":{"Config":{"max-size":"5m"}}}})");
            BOOST_TEST(eventually([&] { return f.proxy->stats().containers == 3u; }));
            BOOST_TEST(f.proxy->stats().rotated == (podman ? 0u : 2u));
        }
    }
}

BOOST_AUTO_TEST_CASE(a_different_label_value_is_refused_400_and_never_reaches_the_engine) {
    Fixture f(answering([](const std::string&, const std::string&) { return json_answer(200, "OK"); }));
    auto tool = f.client();
    tool->send(post("/v1.41/containers/create", R"({"Image":"x","Labels":{"reaperd.session":"someone-else"}})"));
    auto head = tool->head();
    BOOST_TEST(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), head);
    auto message = parse_object(tool->body(head))->getValue<std::string>("message");
    BOOST_TEST(message.find("reaperd.session=someone-else is already set") != std::string::npos, message);
    // The connection goes on.
    tool->send("GET /_ping HTTP/1.1\r\nHost: d\r\n\r\n");
    head = tool->head();
    BOOST_TEST(head.starts_with("HTTP/1.1 200"));
    BOOST_TEST(tool->body(head) == "OK");
    auto seen = f.engine.seen();
    BOOST_REQUIRE(seen.size() == 1u);
    BOOST_TEST(seen[0].starts_with("GET /_ping"));
    BOOST_TEST(f.proxy->stats().refused == 1u);
    BOOST_TEST(f.warnings() == 1u);
}

BOOST_AUTO_TEST_CASE(bodies_that_are_not_json_or_too_large_are_refused_400) {
    Fixture f(answering([](const std::string&, const std::string&) { return json_answer(201, R"({"Id":"x"})"); }), 1024);
    {
        auto tool = f.client();
        tool->send(post("/containers/create", "Image=busybox"));
        auto head = tool->head();
        BOOST_TEST(head.starts_with("HTTP/1.1 400"));
        BOOST_TEST(tool->body(head).find("not valid JSON") != std::string::npos);
    }
    {
        // Too large by its Content-Length: answered before the body is read, then closed.
        auto tool = f.client();
        tool->send("POST /containers/create HTTP/1.1\r\nHost: d\r\nContent-Length: 5000\r\n\r\n{");
        auto head = tool->head();
        BOOST_TEST(head.starts_with("HTTP/1.1 400"));
        BOOST_TEST(head.find("Connection: close") != std::string::npos);
        BOOST_TEST(tool->body(head).find("larger than 1024 bytes") != std::string::npos);
        BOOST_TEST(tool->sees_eof(5s));
    }
    {
        auto tool = f.client();
        tool->send("POST /volumes/create HTTP/1.1\r\nHost: d\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n" +
                   std::string(0x800, ' ') + "\r\n");
        auto head = tool->head();
        BOOST_TEST(head.starts_with("HTTP/1.1 400"));
        BOOST_TEST(tool->body(head).find("larger than") != std::string::npos);
        BOOST_TEST(tool->sees_eof(5s));
    }
    {
        // Framing the engine would read differently is not guessed at.
        auto tool = f.client();
        tool->send("POST /containers/create HTTP/1.1\r\nHost: d\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}");
        auto head = tool->head();
        BOOST_TEST(head.starts_with("HTTP/1.1 400"));
        BOOST_TEST(tool->body(head).find("conflicting Content-Length") != std::string::npos);
    }
    {
        // Codings the engine does not take, and heads past the engine's 1 MiB.
        auto tool = f.client();
        tool->send("POST /containers/create HTTP/1.1\r\nHost: d\r\nTransfer-Encoding: gzip, chunked\r\n\r\n");
        auto head = tool->head();
        BOOST_TEST(head.starts_with("HTTP/1.1 501"));
        auto big = f.client();
        try {
            big->send("GET /_ping HTTP/1.1\r\nX-Registry-Config: " + std::string(1100 * 1024, 'a') + "\r\n\r\n");
        } catch (const std::runtime_error&) {
            // Answered and closed before the whole head was sent, as the engine would.
        }
        head = big->head();
        BOOST_TEST(head.starts_with("HTTP/1.1 431"));
    }
    BOOST_TEST(f.engine.seen().empty());
    BOOST_TEST(f.proxy->stats().refused == 6u);
}

BOOST_AUTO_TEST_CASE(answers_stream_as_they_arrive) {
    std::promise<void> first_seen;
    auto seen_future = first_seen.get_future().share();
    Fixture f([seen_future](Peer& peer, ScriptedEngine& engine) {
        auto head = peer.head();
        engine.record(head);
        if (head.starts_with("GET /events")) {
            peer.send("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
            peer.send("e\r\n{\"Action\":\"a\"}\r\n");
            // The next event only once the tool saw the first: nothing may sit in the proxy.
            seen_future.wait_for(10s);
            peer.send("e\r\n{\"Action\":\"b\"}\r\n0\r\n\r\n");
        } else {
            peer.send("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello");
            seen_future.wait_for(10s);
            peer.send("world");
        }
    });
    auto tool = f.client();
    tool->send("GET /events HTTP/1.1\r\nHost: d\r\n\r\n");
    auto head = tool->head();
    BOOST_TEST(head.find("chunked") != std::string::npos);
    BOOST_TEST(tool->take(19) == "e\r\n{\"Action\":\"a\"}\r\n");
    first_seen.set_value();
    BOOST_TEST(tool->take(24) == "e\r\n{\"Action\":\"b\"}\r\n0\r\n\r\n");

    auto logs = f.client();
    logs->send("GET /containers/x/logs?follow=1 HTTP/1.1\r\nHost: d\r\n\r\n");
    logs->head();
    BOOST_TEST(logs->take(10) == "helloworld");
}

BOOST_AUTO_TEST_CASE(a_hijacked_stream_is_copied_both_ways_and_half_close_is_passed_on) {
    // attach with Upgrade (101) and exec start without (200 raw-stream, no framing): each
    // echoes upper-cased until its input ends, then says bye and closes.
    Fixture f([](Peer& peer, ScriptedEngine& engine) {
        auto head = peer.head();
        engine.record(head);
        if (head.find("Upgrade: tcp") != std::string::npos) {
            peer.send("HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n"
                      "Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n");
        } else {
            peer.send("HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.raw-stream\r\n\r\n");
        }
        auto input = peer.rest();  // until the tool's half-close arrives as EOF
        for (auto& c : input) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
        peer.send(input + " bye");
        peer.shutdown_write();
    });
    for (const std::string extra : {"Connection: Upgrade\r\nUpgrade: tcp\r\n", ""}) {
        BOOST_TEST_CONTEXT(extra) {
            auto tool = f.client();
            tool->send("POST /v1.41/containers/c/attach?stream=1&stdin=1&stdout=1 HTTP/1.1\r\nHost: d\r\n" +
                       extra + "Content-Length: 0\r\n\r\n");
            auto head = tool->head();
            BOOST_TEST((head.starts_with("HTTP/1.1 101") || head.starts_with("HTTP/1.1 200")));
            tool->send("hello ");
            tool->send("world");
            tool->shutdown_write();
            BOOST_TEST(tool->rest() == "HELLO WORLD bye");
        }
    }
}

BOOST_AUTO_TEST_CASE(expect_100_continue_on_a_create_is_answered_by_the_proxy) {
    Fixture f(answering([](const std::string&, const std::string&) { return json_answer(201, R"({"Id":"c"})"); }));
    auto tool = f.client();
    tool->send("POST /containers/create HTTP/1.1\r\nHost: d\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n");
    BOOST_TEST(tool->head() == "HTTP/1.1 100 Continue\r\n\r\n");
    tool->send("{}");
    BOOST_TEST(tool->head().starts_with("HTTP/1.1 201"));
    BOOST_REQUIRE(f.engine.wait_requests(1));
    BOOST_TEST(f.engine.seen()[0].find("Expect") == std::string::npos);
}

BOOST_AUTO_TEST_CASE(an_unreachable_engine_is_answered_502_in_the_engines_words) {
    TempDir dir;
    reaper::ProxyOptions options;
    options.upstream = reaper::EngineAddress::parse("unix://" + dir.path + "/nobody.sock");
    options.listen_path = dir.path + "/proxy.sock";
    options.session = "s-test";
    options.log = [](const reaper::LogRecord&) {};
    reaper::EngineProxy proxy(options);
    proxy.start();
    Peer tool(connect_to(options.listen_path));
    tool.send("GET /_ping HTTP/1.1\r\nHost: d\r\n\r\n");
    auto head = tool.head();
    BOOST_TEST(head.starts_with("HTTP/1.1 502"));
    auto message = parse_object(tool.body(head))->getValue<std::string>("message");
    BOOST_TEST(message.find(dir.path + "/nobody.sock") != std::string::npos, message);
    BOOST_TEST(tool.sees_eof(5s));
}

BOOST_AUTO_TEST_CASE(a_tool_that_leaves_during_a_long_wait_ends_the_engine_connection) {
    std::atomic<bool> engine_saw_eof{false};
    Fixture f([&](Peer& peer, ScriptedEngine& engine) {
        engine.record(peer.head());
        // A wait that never ends: what matters is whether the proxy lets go.
        engine_saw_eof = peer.sees_eof(10s);
    });
    {
        auto tool = f.client();
        tool->send("POST /containers/c/wait HTTP/1.1\r\nHost: d\r\nContent-Length: 0\r\n\r\n");
        BOOST_REQUIRE(f.engine.wait_requests(1));
    }  // closed
    BOOST_TEST(eventually([&] { return engine_saw_eof.load(); }));
    BOOST_TEST(eventually([&] { return f.proxy->stats().open_connections == 0; }));
}

BOOST_AUTO_TEST_CASE(a_tool_that_closes_a_hijacked_stream_ends_it_though_the_engine_stays_silent) {
    std::atomic<bool> engine_saw_eof{false};
    Fixture f([&](Peer& peer, ScriptedEngine& engine) {
        engine.record(peer.head());
        peer.send("HTTP/1.1 101 UPGRADED\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n");
        peer.rest();
        engine_saw_eof = true;
        // An attach without stdin: the engine does not end its side when input ends.
        peer.sees_eof(10s);
    });
    {
        auto tool = f.client();
        tool->send("POST /containers/c/attach HTTP/1.1\r\nHost: d\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n");
        tool->head();
    }  // closed outright
    BOOST_TEST(eventually([&] { return f.proxy->stats().open_connections == 0; }, 5s));
    // The scripted engine's thread reads the close after the proxy has made it.
    BOOST_TEST(eventually([&] { return engine_saw_eof.load(); }, 5s));
}

BOOST_AUTO_TEST_CASE(stop_ends_every_connection_at_once_and_leaves_no_descriptor_or_file) {
    const auto before = open_fds();
    {
        Fixture f([](Peer& peer, ScriptedEngine& engine) {
            for (;;) {
                auto head = peer.head();
                if (head.empty()) return;
                engine.record(head);
                if (head.starts_with("GET /events")) {
                    peer.send("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
                } else if (head.starts_with("POST /containers/c/attach")) {
                    peer.send("HTTP/1.1 101 UPGRADED\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n");
                } else {
                    peer.send("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK");
                }
            }
        });
        struct stat info {};
        BOOST_REQUIRE(::stat((f.dir.path + "/proxy.sock").c_str(), &info) == 0);
        BOOST_TEST((info.st_mode & 0777) == 0600u);

        auto idle = f.client();
        idle->send("GET /_ping HTTP/1.1\r\nHost: d\r\n\r\n");
        idle->body(idle->head());
        auto events = f.client();
        events->send("GET /events HTTP/1.1\r\nHost: d\r\n\r\n");
        events->head();
        auto attached = f.client();
        attached->send("POST /containers/c/attach HTTP/1.1\r\nHost: d\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n");
        attached->head();
        auto silent = f.client();  // connected, never spoke
        BOOST_TEST(f.engine.wait_requests(3));
        BOOST_TEST(eventually([&] { return f.proxy->stats().open_connections >= 4; }, 10s));
        BOOST_TEST(f.proxy->stats().open_connections == 4u);

        const auto started = std::chrono::steady_clock::now();
        f.proxy->stop();
        const auto took = std::chrono::steady_clock::now() - started;
        BOOST_TEST(took < 1s, std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms");
        BOOST_TEST(!fs::exists(f.dir.path + "/proxy.sock"));
        BOOST_TEST(idle->sees_eof(5s));
        BOOST_TEST(events->sees_eof(5s));
        BOOST_TEST(attached->sees_eof(5s));
        BOOST_TEST(silent->sees_eof(5s));
        BOOST_TEST(f.proxy->stats().open_connections == 0u);
        f.proxy->stop();  // idempotent
    }
    BOOST_TEST(open_fds() == before);
}

BOOST_AUTO_TEST_CASE(a_head_answer_and_a_304_carry_no_body) {
    Fixture f([](Peer& peer, ScriptedEngine& engine) {
        for (;;) {
            auto head = peer.head();
            if (head.empty()) return;
            engine.record(head);
            if (head.starts_with("HEAD"))
                peer.send("HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n");
            else
                peer.send("HTTP/1.1 304 Not Modified\r\n\r\n");
        }
    });
    auto tool = f.client();
    tool->send("HEAD /containers/c/archive?path=/x HTTP/1.1\r\nHost: d\r\n\r\n");
    BOOST_TEST(tool->head().starts_with("HTTP/1.1 200"));
    tool->send("POST /containers/c/start HTTP/1.1\r\nHost: d\r\nContent-Length: 0\r\n\r\n");
    BOOST_TEST(tool->head().starts_with("HTTP/1.1 304"));
    tool->send("HEAD /_ping HTTP/1.1\r\nHost: d\r\n\r\n");
    BOOST_TEST(tool->head().starts_with("HTTP/1.1 200"));
}

BOOST_AUTO_TEST_CASE(the_proxy_refuses_bad_options_and_an_occupied_path) {
    TempDir dir;
    reaper::ProxyOptions options;
    options.upstream = reaper::EngineAddress::parse("unix:///nowhere.sock");
    options.listen_path = dir.path + "/taken.sock";
    options.session = "bad session";
    BOOST_CHECK_THROW(reaper::EngineProxy{options}, std::invalid_argument);
    options.session = "s";
    options.listen_path = "";
    BOOST_CHECK_THROW(reaper::EngineProxy{options}, std::invalid_argument);
    options.listen_path = dir.path + "/taken.sock";
    { std::ofstream(options.listen_path) << "x"; }
    reaper::EngineProxy proxy(options);
    BOOST_CHECK_THROW(proxy.start(), std::system_error);
    proxy.stop();
    BOOST_TEST(fs::exists(options.listen_path));  // not ours: left alone
}
