// Unit tests of the engine client: the address parser, query encoding, error mapping, and a
// table of faults injected by a scripted fake engine on a unix socket (409, 500, garbage,
// hangs, dropped connections, broken event streams).
#include <reaper/client.hpp>

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

using namespace reaper;
using namespace std::chrono_literals;
namespace bdata = boost::unit_test::data;

// ---- pure helpers ---------------------------------------------------------------------

struct AddressCase {
    const char* text;
    EngineAddress::Kind kind;
    const char* path_or_host;
    std::uint16_t port;
};
std::ostream& operator<<(std::ostream& out, const AddressCase& c) { return out << c.text; }

const AddressCase good_addresses[] = {
    {"unix:///var/run/docker.sock", EngineAddress::Kind::Unix, "/var/run/docker.sock", 0},
    {"/tmp/x/docker.sock", EngineAddress::Kind::Unix, "/tmp/x/docker.sock", 0},
    {"tcp://127.0.0.1:2375", EngineAddress::Kind::Tcp, "127.0.0.1", 2375},
    {"tcp://localhost:1/", EngineAddress::Kind::Tcp, "localhost", 1},
    {"tcp://[::1]:2376", EngineAddress::Kind::Tcp, "::1", 2376},
};

BOOST_DATA_TEST_CASE(address_parser_accepts, bdata::make(good_addresses), c) {
    auto a = EngineAddress::parse(c.text);
    BOOST_TEST((a.kind == c.kind));
    if (c.kind == EngineAddress::Kind::Unix) {
        BOOST_TEST(a.path == c.path_or_host);
    } else {
        BOOST_TEST(a.host == c.path_or_host);
        BOOST_TEST(a.port == c.port);
    }
    BOOST_TEST(EngineAddress::parse(a.to_string()).to_string() == a.to_string());
}

struct BadAddress {
    const char* text;
    const char* problem;
};
std::ostream& operator<<(std::ostream& out, const BadAddress& c) { return out << c.text; }

const BadAddress bad_addresses[] = {
    {"", "empty"},
    {"unix://relative.sock", "must be absolute"},
    {"tcp://host", "missing port"},
    {"tcp://:2375", "missing host"},
    {"tcp://host:0", "port must be"},
    {"tcp://host:70000", "port must be"},
    {"tcp://host:23x", "port must be"},
    {"tcp://host:2375/path", "path after host:port"},
    {"https://host:2376", "unsupported scheme"},
    {"ssh://me@host", "unsupported scheme"},
    {"docker.sock", "not an address"},
};

BOOST_DATA_TEST_CASE(address_parser_rejects_with_a_reason, bdata::make(bad_addresses), c) {
    try {
        EngineAddress::parse(c.text);
        BOOST_FAIL("accepted");
    } catch (const std::invalid_argument& e) {
        std::string what = e.what();
        BOOST_TEST(what.find(c.problem) != std::string::npos, what);
        BOOST_TEST(what.find(std::string("\"") + c.text + "\"") != std::string::npos, what);
    }
}

BOOST_AUTO_TEST_CASE(address_from_environment) {
    ::setenv("DOCKER_HOST", "tcp://10.0.0.1:2375", 1);
    BOOST_TEST(EngineAddress::from_environment().to_string() == "tcp://10.0.0.1:2375");
    ::setenv("DOCKER_HOST", "", 1);
    BOOST_TEST(EngineAddress::from_environment().to_string() == default_engine_address);
    ::unsetenv("DOCKER_HOST");
    BOOST_TEST(EngineAddress::from_environment().to_string() == default_engine_address);
}

// ---- plain TCP and TLS options ---------------------------------------------------------

struct LocalCase {
    const char* address;
    bool local;
};
std::ostream& operator<<(std::ostream& out, const LocalCase& c) { return out << c.address; }

const LocalCase local_cases[] = {
    {"unix:///var/run/docker.sock", true}, {"tcp://127.0.0.1:2375", true},   {"tcp://127.9.8.7:2375", true},
    {"tcp://localhost:2375", true},        {"tcp://LocalHost:2375", true},   {"tcp://[::1]:2375", true},
    {"tcp://[::ffff:127.0.0.1]:2375", true}, {"tcp://192.0.2.1:2375", false}, {"tcp://10.0.0.1:2375", false},
    {"tcp://128.0.0.1:2375", false},       {"tcp://[::2]:2375", false},      {"tcp://[::ffff:10.0.0.1]:2375", false},
    // A name is not resolved to find out: it could point anywhere later.
    {"tcp://docker.example:2375", false},  {"tcp://localhost.example:2375", false},
};

BOOST_DATA_TEST_CASE(only_unix_sockets_and_loopback_addresses_are_local, bdata::make(local_cases), c) {
    BOOST_TEST(EngineAddress::parse(c.address).is_local() == c.local);
}

BOOST_AUTO_TEST_CASE(plain_tcp_to_another_host_is_refused_naming_the_address_and_the_fix) {
    ClientOptions options;
    options.address = EngineAddress::parse("tcp://192.0.2.1:2375");
    for (auto check : std::vector<std::function<void()>>{[&] { check_plain_tcp(options); },
                                                         [&] { Client client(options); }}) {
        try {
            check();
            BOOST_FAIL("plain TCP to 192.0.2.1 was accepted");
        } catch (const std::invalid_argument& e) {
            const std::string what = e.what();
            BOOST_TEST(what.find("tcp://192.0.2.1:2375") != std::string::npos, what);
            BOOST_TEST(what.find("use TLS (DOCKER_TLS_VERIFY=1, DOCKER_CERT_PATH) or set engine.allow_plain_tcp") !=
                           std::string::npos,
                       what);
        }
    }
    options.allow_plain_tcp = true;  // allowed: the client is made, and connects only when called
    Client allowed(options);
    BOOST_TEST(allowed.open_connections() == 0u);
    options.allow_plain_tcp = false;
    options.tls = TlsOptions{"/ca.pem", "", ""};
    check_plain_tcp(options);  // TLS is not plain
    options.tls.reset();
    options.address = EngineAddress::parse("tcp://127.0.0.1:2375");
    Client local(options);
}

// A scratch dir, removed at scope exit.
struct TempDir {
    std::string path;
    TempDir() {
        char pattern[] = "/tmp/reaper-client-test.XXXXXX";
        path = ::mkdtemp(pattern);
    }
    ~TempDir() { std::filesystem::remove_all(path); }
    std::string write(const std::string& name, const std::string& text) const {
        std::ofstream(path + "/" + name) << text;
        return path + "/" + name;
    }
};

BOOST_AUTO_TEST_CASE(tls_options_the_client_cannot_use_fail_its_constructor_named) {
    TempDir dir;
    const std::string garbage = dir.write("ca.pem", "not a certificate\n");
    struct Case {
        std::string address;
        TlsOptions tls;
        std::string problem;
    };
    const std::vector<Case> cases{
        {"unix:///run/docker.sock", {garbage, "", ""}, "TLS is for tcp:// engines; unix:///run/docker.sock is a unix socket"},
        {"tcp://127.0.0.1:2376", {"", "", ""}, "TLS needs a CA file"},
        {"tcp://127.0.0.1:2376", {garbage, dir.path + "/cert.pem", ""}, "certificate file " + dir.path + "/cert.pem has no key file"},
        {"tcp://127.0.0.1:2376", {garbage, "", dir.path + "/key.pem"}, "key file " + dir.path + "/key.pem has no certificate file"},
        {"tcp://127.0.0.1:2376", {dir.path + "/none.pem", "", ""},
         "TLS CA file " + dir.path + "/none.pem: cannot read: No such file or directory"},
        {"tcp://127.0.0.1:2376", {garbage, "", ""}, "Cannot load CA file/directory at " + garbage},
    };
    for (const auto& c : cases) {
        BOOST_TEST_CONTEXT(c.problem) {
            ClientOptions options;
            options.address = EngineAddress::parse(c.address);
            options.tls = c.tls;
            try {
                Client client(options);
                BOOST_FAIL("accepted");
            } catch (const std::invalid_argument& e) {
                BOOST_TEST(std::string(e.what()).find(c.problem) != std::string::npos, e.what());
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(tls_options_come_from_the_environment_as_the_docker_cli_reads_it) {
    TempDir dir;
    const char* home = std::getenv("HOME");
    const std::string saved_home = home ? home : "";
    ::setenv("HOME", dir.path.c_str(), 1);
    ::unsetenv("DOCKER_CERT_PATH");
    ::unsetenv("DOCKER_TLS_VERIFY");
    BOOST_TEST(!TlsOptions::from_environment().has_value());
    ::setenv("DOCKER_TLS_VERIFY", "", 1);
    BOOST_TEST(!TlsOptions::from_environment().has_value());

    // Any other value turns it on, "0" too, as for the docker CLI; the files default to
    // ~/.docker, and a cert.pem or key.pem that does not exist is left out.
    ::setenv("DOCKER_TLS_VERIFY", "0", 1);
    BOOST_TEST((TlsOptions::from_environment() == TlsOptions{dir.path + "/.docker/ca.pem", "", ""}));

    dir.write("cert.pem", "");
    dir.write("key.pem", "");
    ::setenv("DOCKER_CERT_PATH", dir.path.c_str(), 1);
    const TlsOptions in_dir{dir.path + "/ca.pem", dir.path + "/cert.pem", dir.path + "/key.pem"};
    BOOST_TEST((TlsOptions::from_environment() == in_dir));
    BOOST_TEST((TlsOptions::in_directory(dir.path) == in_dir));

    ::setenv("DOCKER_HOST", "tcp://127.0.0.1:2376", 1);
    ::setenv("DOCKER_API_VERSION", "1.44", 1);
    const auto options = ClientOptions::from_environment();
    BOOST_TEST(options.address.to_string() == "tcp://127.0.0.1:2376");
    BOOST_TEST(options.pinned_api_version == "1.44");
    BOOST_TEST((options.tls == in_dir));
    BOOST_TEST(!options.allow_plain_tcp);

    ::unsetenv("DOCKER_CERT_PATH");
    ::unsetenv("HOME");
    BOOST_CHECK_THROW(TlsOptions::from_environment(), std::invalid_argument);
    for (const char* name : {"DOCKER_TLS_VERIFY", "DOCKER_HOST", "DOCKER_API_VERSION"}) ::unsetenv(name);
    if (home) ::setenv("HOME", saved_home.c_str(), 1);
}

BOOST_AUTO_TEST_CASE(query_encoding) {
    BOOST_TEST(url_encode("abc-._~09") == "abc-._~09");
    BOOST_TEST(url_encode("a b=c&d/e") == "a%20b%3Dc%26d%2Fe");
    BOOST_TEST(url_encode("{\"x\":[1]}") == "%7B%22x%22%3A%5B1%5D%7D");
    BOOST_TEST(encode_filters({}) == "{}");
    BOOST_TEST(encode_filters({{"label", {"a=b", "c"}}, {"status", {"running"}}}) ==
               R"({"label":["a=b","c"],"status":["running"]})");
    BOOST_TEST(encode_filters({{"label", {"quote\"d"}}}) == R"({"label":["quote\"d"]})");
}

BOOST_AUTO_TEST_CASE(api_version_comparison) {
    BOOST_TEST(compare_api_versions("1.41", "1.41") == 0);
    BOOST_TEST(compare_api_versions("1.9", "1.10") < 0);
    BOOST_TEST(compare_api_versions("1.43", "1.40") > 0);
    BOOST_TEST(compare_api_versions("2.0", "1.99") > 0);
    BOOST_TEST(compare_api_versions("1.41", "1.41.0") == 0);
}

// Each of these once looped forever (a component that is not a number consumed nothing), and
// the loop ran under the client's negotiation lock: every later engine call would hang.
const char* odd_versions[] = {"1.43-rc1", "x", "", ".", "..", "1..2", "1.x.3", "-1", "99999999999999999999.1", "1.43 "};

BOOST_DATA_TEST_CASE(api_version_comparison_terminates_on_any_input, bdata::make(odd_versions), text) {
    int vs_newest = compare_api_versions(text, "1.52");
    int back = compare_api_versions("1.52", text);
    BOOST_TEST((vs_newest < 0) == (back > 0));
    BOOST_TEST(compare_api_versions(text, text) == 0);
}

BOOST_AUTO_TEST_CASE(api_version_comparison_reads_a_suffix_as_the_end) {
    BOOST_TEST(compare_api_versions("1.43-rc1", "1.43") == 0);
    BOOST_TEST(compare_api_versions("1.43-rc1", "1.44") < 0);
    BOOST_TEST(compare_api_versions("99999999999999999999.1", "1.52") > 0);
}

BOOST_AUTO_TEST_CASE(api_versions_are_digits_dot_digits) {
    for (const char* good : {"1.44", "1.9", "10.100"}) BOOST_TEST(is_api_version(good), good);
    for (const char* bad : {"", "1", "1.", ".4", "v1.44", "1.44.0", "1.44 ", "1.4a", "12345.1"})
        BOOST_TEST(!is_api_version(bad), bad);
}

BOOST_AUTO_TEST_CASE(docker_api_version_pins_from_the_environment) {
    ::unsetenv("DOCKER_API_VERSION");
    BOOST_TEST(api_version_from_environment() == "");
    ::setenv("DOCKER_API_VERSION", "", 1);
    BOOST_TEST(api_version_from_environment() == "");
    ::setenv("DOCKER_API_VERSION", "1.43", 1);
    BOOST_TEST(api_version_from_environment() == "1.43");
    ::setenv("DOCKER_API_VERSION", "latest", 1);
    try {
        api_version_from_environment();
        BOOST_FAIL("accepted");
    } catch (const std::invalid_argument& e) {
        BOOST_TEST(std::string(e.what()).find("DOCKER_API_VERSION=latest") != std::string::npos, e.what());
    }
    ::unsetenv("DOCKER_API_VERSION");
}

struct StatusCase {
    int status;
    EngineErrorKind kind;
};
std::ostream& operator<<(std::ostream& out, const StatusCase& c) { return out << c.status; }
const StatusCase status_cases[] = {
    {404, EngineErrorKind::NotFound}, {409, EngineErrorKind::Conflict}, {400, EngineErrorKind::BadRequest},
    {403, EngineErrorKind::BadRequest}, {500, EngineErrorKind::Server}, {503, EngineErrorKind::Server},
    {200, EngineErrorKind::Protocol},
};

BOOST_DATA_TEST_CASE(error_kind_per_status, bdata::make(status_cases), c) {
    BOOST_TEST(error_kind_for_status(c.status) == c.kind);
    try {
        throw_engine_error(c.kind, c.status, "engine words", "what");
    } catch (const EngineError& e) {
        BOOST_TEST(e.kind() == c.kind);
        BOOST_TEST(e.status() == c.status);
        BOOST_TEST(e.engine_message() == "engine words");
    }
}

BOOST_AUTO_TEST_CASE(typed_errors_are_catchable_by_type) {
    BOOST_CHECK_THROW(throw_engine_error(EngineErrorKind::NotFound, 404, "", ""), NotFound);
    BOOST_CHECK_THROW(throw_engine_error(EngineErrorKind::Conflict, 409, "", ""), Conflict);
    BOOST_CHECK_THROW(throw_engine_error(EngineErrorKind::Server, 500, "", ""), ServerError);
    BOOST_CHECK_THROW(throw_engine_error(EngineErrorKind::Unreachable, 0, "", ""), Unreachable);
    BOOST_CHECK_THROW(throw_engine_error(EngineErrorKind::Timeout, 0, "", ""), Timeout);
    BOOST_CHECK_THROW(throw_engine_error(EngineErrorKind::Protocol, 0, "", ""), ProtocolError);
    BOOST_CHECK_THROW(throw_engine_error(EngineErrorKind::Closed, 0, "", ""), ClientClosed);
}

// The engine's wording is read here once: a 409 that says the engine is removing the
// container already is RemovalInProgress (still a Conflict); other 409s are plain Conflicts.
BOOST_AUTO_TEST_CASE(a_delete_refused_because_removal_is_under_way_is_its_own_type) {
    BOOST_CHECK_THROW(throw_engine_error(EngineErrorKind::Conflict, 409,
                                         "removal of container abc is already in progress", ""),
                      RemovalInProgress);
    BOOST_CHECK_THROW(throw_engine_error(EngineErrorKind::Conflict, 409, "Removal Of Container x Is Already In Progress", ""),
                      RemovalInProgress);
    try {
        throw_engine_error(EngineErrorKind::Conflict, 409,
                           "You cannot remove a running container abc. Stop the container before attempting removal or force remove", "");
    } catch (const RemovalInProgress&) {
        BOOST_FAIL("a running container's 409 is not a removal in progress");
    } catch (const Conflict& e) {
        BOOST_TEST(e.kind() == EngineErrorKind::Conflict);
    }
}

BOOST_AUTO_TEST_CASE(container_status_words_round_trip_and_others_are_unknown) {
    for (auto status : {ContainerStatus::created, ContainerStatus::running, ContainerStatus::paused,
                        ContainerStatus::restarting, ContainerStatus::removing, ContainerStatus::exited,
                        ContainerStatus::dead})
        BOOST_TEST((parse_container_status(to_string(status)) == status), to_string(status));
    BOOST_TEST((parse_container_status("stopped") == ContainerStatus::unknown));  // Podman's own
    BOOST_TEST((parse_container_status("") == ContainerStatus::unknown));
    BOOST_TEST(std::string(to_string(ContainerStatus::unknown)) == "unknown");
    ContainerState state;
    state.status = "removing";
    BOOST_TEST(state.removing());
    state.status = "running";
    BOOST_TEST(!state.removing());
}

// ---- a scripted fake engine -----------------------------------------------------------

namespace {

// What the fake does with one request.
struct Scripted {
    std::string bytes;        // written back verbatim (status line, headers, body)
    bool hang = false;        // write `bytes`, then never answer further
    bool close_after = false; // close the connection after writing
};

std::string http(int status, const std::string& body, const std::string& extra_headers = "") {
    return "HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n" + extra_headers + "\r\n" + body;
}

const std::string version_reply =
    http(200, R"({"Version":"20.10.24","ApiVersion":"1.41","MinAPIVersion":"1.12","Os":"linux","Arch":"amd64"})");

// Serves HTTP/1.1 on a unix socket; `script` maps the request line to the reply. Each
// connection has its own thread; the destructor ends them all.
class FakeEngine {
public:
    using Script = std::function<Scripted(const std::string& request_line)>;

    explicit FakeEngine(Script script) : script_(std::move(script)) {
        path_ = std::filesystem::temp_directory_path() / ("reaper-fake-" + std::to_string(::getpid()) + "-" +
                                                          std::to_string(counter_++) + ".sock");
        ::unlink(path_.c_str());
        listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path_.c_str());
        if (::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listener_, 64) != 0) {
            throw std::runtime_error("fake engine cannot listen on " + path_);
        }
        acceptor_ = std::thread([this] { accept_loop(); });
    }

    ~FakeEngine() {
        stopping_ = true;
        ::shutdown(listener_, SHUT_RDWR);
        acceptor_.join();
        {
            std::lock_guard lock(mutex_);
            for (int fd : connections_) ::shutdown(fd, SHUT_RDWR);
        }
        for (auto& t : workers_) t.join();
        ::close(listener_);
        ::unlink(path_.c_str());
    }

    ClientOptions options(std::chrono::milliseconds timeout = 2000ms) const {
        ClientOptions o;
        o.address = EngineAddress::parse("unix://" + path_);
        o.request_timeout = timeout;
        return o;
    }
    int connections_accepted() const { return accepted_; }
    std::vector<std::string> requests() {
        std::lock_guard lock(mutex_);
        return requests_;
    }

private:
    void accept_loop() {
        while (!stopping_) {
            int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
            if (fd < 0) return;
            ++accepted_;
            std::lock_guard lock(mutex_);
            connections_.push_back(fd);
            workers_.emplace_back([this, fd] { serve(fd); });
        }
    }

    void serve(int fd) {
        std::string buffer;
        char chunk[4096];
        for (;;) {
            auto head_end = buffer.find("\r\n\r\n");
            while (head_end == std::string::npos) {
                auto n = ::read(fd, chunk, sizeof chunk);
                if (n <= 0) return finish(fd);
                buffer.append(chunk, static_cast<std::size_t>(n));
                head_end = buffer.find("\r\n\r\n");
            }
            std::string head = buffer.substr(0, head_end);
            std::size_t length = 0;
            auto cl = head.find("Content-Length: ");
            if (cl != std::string::npos) length = std::stoul(head.substr(cl + 16));
            while (buffer.size() < head_end + 4 + length) {
                auto n = ::read(fd, chunk, sizeof chunk);
                if (n <= 0) return finish(fd);
                buffer.append(chunk, static_cast<std::size_t>(n));
            }
            buffer.erase(0, head_end + 4 + length);
            std::string request_line = head.substr(0, head.find("\r\n"));
            {
                std::lock_guard lock(mutex_);
                requests_.push_back(request_line);
            }
            auto reply = script_(request_line);
            if (!reply.bytes.empty()) (void)!::write(fd, reply.bytes.data(), reply.bytes.size());
            if (reply.hang) {
                pollfd p{fd, POLLIN, 0};
                while (!stopping_ && ::poll(&p, 1, 20) == 0) {
                }
                return finish(fd);
            }
            if (reply.close_after) return finish(fd);
        }
    }

    void finish(int fd) {
        std::lock_guard lock(mutex_);
        ::shutdown(fd, SHUT_RDWR);
        // The fd is closed by the destructor's shutdown pass; keep the number reserved till then.
    }

    static inline std::atomic<int> counter_{0};
    Script script_;
    std::string path_;
    int listener_ = -1;
    std::atomic<bool> stopping_{false};
    std::atomic<int> accepted_{0};
    std::thread acceptor_;
    std::mutex mutex_;
    std::vector<int> connections_;
    std::vector<std::thread> workers_;
    std::vector<std::string> requests_;
};

// /_ping as Debian 12's dockerd 20.10 answers it: its API-Version header settles negotiation.
const std::string ping_reply = http(200, "OK", "API-Version: 1.41\r\n");

// A script that answers /_ping and /version normally and `reply` to everything else.
FakeEngine::Script answering(Scripted reply) {
    return [reply](const std::string& line) {
        if (line.find(" /_ping ") != std::string::npos) return Scripted{ping_reply};
        if (line.find(" /version ") != std::string::npos) return Scripted{version_reply};
        return reply;
    };
}

}  // namespace

struct Fault {
    const char* name;
    Scripted reply;
    EngineErrorKind kind;
    int status;
    const char* message;  // expected in engine_message() (statuses) or what() (others)
};
std::ostream& operator<<(std::ostream& out, const Fault& f) { return out << f.name; }

const Fault faults[] = {
    {"409 conflict", {http(409, R"({"message":"You cannot remove a running container abc"})")},
     EngineErrorKind::Conflict, 409, "You cannot remove a running container abc"},
    {"404 not found", {http(404, R"({"message":"No such container: abc"})")}, EngineErrorKind::NotFound, 404,
     "No such container: abc"},
    {"500 engine error", {http(500, R"({"message":"driver failed"})")}, EngineErrorKind::Server, 500, "driver failed"},
    {"500 plain text", {http(500, "plain words\n")}, EngineErrorKind::Server, 500, "plain words"},
    // Podman's dialect: a 500 whose message ends with libpod's cause reads as Docker's status.
    {"podman 500, container state improper", {http(500, R"({"message":"cannot remove container abc as it is running: container state improper"})")},
     EngineErrorKind::Conflict, 500, "container state improper"},
    {"podman 500, no such container", {http(500, R"({"message":"abc: no such container"})")},
     EngineErrorKind::NotFound, 500, "no such container"},
    {"podman 500, removed by another delete", {http(500, R"({"message":"removing container abc: container has already been removed"})")},
     EngineErrorKind::NotFound, 500, "already been removed"},
    {"400 bad request", {http(400, R"({"message":"bad parameter"})")}, EngineErrorKind::BadRequest, 400,
     "bad parameter"},
    {"hung: no answer", {"", true}, EngineErrorKind::Timeout, 0, "no answer"},
    {"hung half-way through headers", {"HTTP/1.1 200 OK\r\nContent-", true}, EngineErrorKind::Timeout, 0,
     "no answer"},
    {"hung half-way through the body", {"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n[", true},
     EngineErrorKind::Timeout, 0, "no answer"},
    {"closed without answering", {"", false, true}, EngineErrorKind::Unreachable, 0, "connection to the engine failed"},
    {"closed half-way through the body", {"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n[{", false, true},
     EngineErrorKind::Unreachable, 0, "connection to the engine failed"},
    {"not HTTP", {"SSH-2.0-OpenSSH\r\n\r\n", false, true}, EngineErrorKind::Protocol, 0, "malformed HTTP"},
    {"200 with broken JSON", {http(200, "[{\"Id\": ")}, EngineErrorKind::Protocol, 0, "unparseable JSON"},
    {"200 with the wrong JSON type", {http(200, "{}")}, EngineErrorKind::Protocol, 0, "expected a JSON array"},
};

BOOST_DATA_TEST_CASE(injected_faults_become_typed_errors, bdata::make(faults), fault) {
    FakeEngine fake(answering(fault.reply));
    Client client(fake.options(300ms));
    auto t0 = std::chrono::steady_clock::now();
    try {
        client.list_containers({});
        BOOST_FAIL("no error");
    } catch (const EngineError& e) {
        BOOST_TEST(e.kind() == fault.kind, e.what());
        BOOST_TEST(e.status() == fault.status);
        std::string text = fault.status ? e.engine_message() : e.what();
        BOOST_TEST(text.find(fault.message) != std::string::npos, text);
        BOOST_TEST(std::string(e.what()).find("/containers/json") != std::string::npos, e.what());
    }
    BOOST_TEST((std::chrono::steady_clock::now() - t0) < 3s);
    client.close();
}

// A force remove kills at once on either engine. Podman's compat DELETE would first wait
// the container's stop timeout (10 s measured on Podman 5.4, and on 4.3 for a container its
// CLI made), so on Podman, known by the Libpod-Api-Version header on its every answer, it
// goes to libpod's DELETE with no wait; a plain remove stays Docker's call everywhere.
struct RemoveCase {
    const char* name;
    const char* engine_header;  // "" = Docker
    RemoveOptions options;
    const char* request;        // the DELETE's request line, up to " HTTP/1.1"
    std::string reply;
};
std::ostream& operator<<(std::ostream& out, const RemoveCase& c) { return out << c.name; }

const RemoveCase remove_cases[] = {
    {"Docker, force", "", {true, true}, "DELETE /v1.41/containers/abc?force=true&v=true", http(204, "")},
    {"Docker, plain", "", {false, false}, "DELETE /v1.41/containers/abc?force=false&v=false", http(204, "")},
    {"Podman, force", "Libpod-Api-Version: 5.4.2\r\n", {true, true},
     "DELETE /v1.41/libpod/containers/abc?force=true&timeout=0&volumes=true", http(200, R"([{"Id":"abc"}])")},
    {"Podman, force, no volumes", "Libpod-Api-Version: 4.3.1\r\n", {true, false},
     "DELETE /v1.41/libpod/containers/abc?force=true&timeout=0&volumes=false", http(200, R"([{"Id":"abc"}])")},
    {"Podman, plain", "Libpod-Api-Version: 5.4.2\r\n", {false, true}, "DELETE /v1.41/containers/abc?force=false&v=true",
     http(204, "")},
};

BOOST_DATA_TEST_CASE(a_force_remove_kills_at_once_in_each_engines_dialect, bdata::make(remove_cases), c) {
    const std::string header = c.engine_header;
    const std::string expected = c.request;
    const std::string reply = c.reply;
    FakeEngine fake([&](const std::string& line) {
        if (line.find(" /_ping ") != std::string::npos) return Scripted{http(200, "OK", "API-Version: 1.41\r\n" + header)};
        if (line.rfind(expected + " ", 0) == 0) return Scripted{reply};
        return Scripted{http(400, R"({"message":"unexpected request"})", header)};
    });
    Client client(fake.options());
    client.remove("abc", c.options);
    BOOST_TEST(fake.requests().back().rfind(expected + " ", 0) == 0u, fake.requests().back());

    // libpod's answers for a container that is gone or cannot go read as Docker's.
    if (header.empty() || !c.options.force) return;
    FakeEngine gone([&](const std::string& line) {
        if (line.find(" /_ping ") != std::string::npos) return Scripted{http(200, "OK", "API-Version: 1.41\r\n" + header)};
        return Scripted{http(404, R"({"cause":"no such container","message":"no container with ID or name \"abc\" found: no such container","response":404})", header)};
    });
    Client on_gone(gone.options());
    BOOST_CHECK_THROW(on_gone.remove("abc", c.options), NotFound);
}

BOOST_AUTO_TEST_CASE(engine_without_api_version_is_a_protocol_error) {
    FakeEngine fake([](const std::string&) { return Scripted{http(200, R"({"Version":"x"})")}; });
    Client client(fake.options());
    client.ping();  // /_ping is unversioned: it needs no negotiation
    BOOST_CHECK_THROW(client.list_containers({}), ProtocolError);
}

BOOST_AUTO_TEST_CASE(negotiation_takes_the_lower_of_both_versions) {
    FakeEngine fake([](const std::string& line) {
        if (line.find(" /version ") != std::string::npos) {
            return Scripted{http(200, R"({"ApiVersion":"1.40","MinAPIVersion":"1.12"})")};
        }
        return Scripted{http(200, "[]")};
    });
    Client client(fake.options());
    client.list_containers({});
    BOOST_TEST(client.api_version() == "1.40");
    auto requests = fake.requests();
    BOOST_TEST(requests.back().find("GET /v1.40/containers/json?all=0 ") == 0u, requests.back());

    FakeEngine newer([](const std::string& line) {
        if (line.find(" /version ") != std::string::npos) return Scripted{http(200, R"({"ApiVersion":"1.99"})")};
        return Scripted{http(200, "[]")};
    });
    Client client2(newer.options());
    BOOST_TEST(client2.api_version() == ClientOptions{}.max_api_version);
}

// The (MinAPIVersion, ApiVersion) pairs that engines present, and what this client must use.
struct Negotiation {
    const char* engine;  // what the row stands for
    const char* min;     // "" = the engine names none (Docker before 1.25, some compat engines)
    const char* max;
    const char* pinned;
    const char* expected;  // nullptr = UnsupportedVersion
};
std::ostream& operator<<(std::ostream& out, const Negotiation& n) { return out << n.engine; }

const Negotiation negotiations[] = {
    {"Debian 12 docker.io 20.10", "1.12", "1.41", "", "1.41"},
    {"Podman 4.3", "1.24", "1.41", "", "1.41"},
    {"Docker 26", "1.24", "1.45", "", "1.45"},
    {"Docker 29.0", "1.44", "1.52", "", "1.52"},
    {"Docker 29.7", "1.40", "1.52", "", "1.52"},
    {"a future engine, floor within reach", "1.48", "1.60", "", "1.52"},
    {"an engine without MinAPIVersion", "", "1.43", "", "1.43"},
    {"a future engine past this client", "1.53", "1.60", "", nullptr},
    {"an engine older than this client", "1.12", "1.39", "", nullptr},
    {"pinned below Docker 29's floor", "1.44", "1.52", "1.43", nullptr},
    {"pinned above the engine", "1.12", "1.41", "1.44", nullptr},
    {"pinned within Docker 29", "1.44", "1.52", "1.44", "1.44"},
    {"pinned past this client's ceiling", "1.44", "1.60", "1.55", "1.55"},
};

BOOST_DATA_TEST_CASE(negotiation_per_engine, bdata::make(negotiations), n) {
    std::string body = std::string(R"({"Version":"x","ApiVersion":")") + n.max + '"' +
                       (*n.min ? std::string(R"(,"MinAPIVersion":")") + n.min + '"' : "") + "}";
    FakeEngine fake([body](const std::string& line) {
        if (line.find(" /version ") != std::string::npos) return Scripted{http(200, body)};
        return Scripted{http(200, "[]")};
    });
    auto options = fake.options();
    options.pinned_api_version = n.pinned;
    Client client(options);
    if (!n.expected) {
        try {
            client.list_containers({});
            BOOST_FAIL("negotiated");
        } catch (const UnsupportedVersion& e) {
            std::string what = e.what();
            BOOST_TEST(e.kind() == EngineErrorKind::Unsupported);
            BOOST_TEST(what.find(std::string("speaks API ")) != std::string::npos, what);
            BOOST_TEST(what.find(n.max) != std::string::npos, what);
            if (*n.pinned) BOOST_TEST(what.find(std::string(n.pinned) + " is pinned") != std::string::npos, what);
        }
        // Nothing is cached: the next call asks the engine again.
        BOOST_CHECK_THROW(client.list_containers({}), UnsupportedVersion);
        auto requests = fake.requests();
        BOOST_TEST(std::count_if(requests.begin(), requests.end(), [](const std::string& r) {
                       return r.find(" /version ") != std::string::npos;
                   }) == 2);
        return;
    }
    client.list_containers({});
    BOOST_TEST(client.api_version() == n.expected);
    BOOST_TEST(fake.requests().back().find(std::string("GET /v") + n.expected + "/containers/json") == 0u,
               fake.requests().back());
}

// Negotiation from /_ping's API-Version header: it settles alone when the header is within
// this client's range (1.40-1.52) and nothing is pinned; otherwise GET /version decides,
// exactly as without the header (negotiation_per_engine).
struct PingNegotiation {
    const char* engine;
    const char* ping_header;  // "" = none
    const char* pinned;
    bool asks_version;
    const char* expected;  // nullptr = UnsupportedVersion
};
std::ostream& operator<<(std::ostream& out, const PingNegotiation& n) { return out << n.engine; }

const PingNegotiation ping_negotiations[] = {
    {"Podman 4.3 and Docker 20.10", "1.41", "", false, "1.41"},
    {"Docker 26", "1.45", "", false, "1.45"},
    {"Docker 29", "1.52", "", false, "1.52"},
    {"at this client's floor", "1.40", "", false, "1.40"},
    {"newer than this client: its floor decides", "1.60", "", true, "1.52"},
    {"older than this client", "1.39", "", true, nullptr},
    {"no header", "", "", true, "1.52"},
    {"a header that is no version", "latest", "", true, "1.52"},
    {"pinned: checked against the floor", "1.52", "1.44", true, "1.44"},
};

BOOST_DATA_TEST_CASE(negotiation_from_ping, bdata::make(ping_negotiations), n) {
    // /version says what the ping says, with Docker 29's floor (its own 1.39 for the older one).
    const std::string max = *n.ping_header && is_api_version(n.ping_header) ? n.ping_header : "1.52";
    const std::string min = compare_api_versions(max, "1.44") < 0 ? "1.12" : "1.44";
    const std::string header = *n.ping_header ? std::string("API-Version: ") + n.ping_header + "\r\n" : "";
    const std::string version_body = R"({"Version":"x","ApiVersion":")" + max + R"(","MinAPIVersion":")" + min + R"("})";
    FakeEngine fake([&](const std::string& line) {
        if (line.find(" /_ping ") != std::string::npos) return Scripted{http(200, "OK", header)};
        if (line.find(" /version ") != std::string::npos) return Scripted{http(200, version_body)};
        return Scripted{http(200, "[]")};
    });
    auto options = fake.options();
    options.pinned_api_version = n.pinned;
    Client client(options);
    if (n.expected) {
        client.list_containers({});
        BOOST_TEST(client.api_version() == n.expected);
    } else {
        BOOST_CHECK_THROW(client.list_containers({}), UnsupportedVersion);
    }
    auto requests = fake.requests();
    const bool asked = std::any_of(requests.begin(), requests.end(),
                                   [](const std::string& r) { return r.find("GET /version ") == 0; });
    BOOST_TEST(asked == n.asks_version);
}

// An engine upgraded under a running client (20.10 -> 29.0) refuses the old version with
// Docker's 400; the client negotiates again and the call goes through once, on the new one.
BOOST_AUTO_TEST_CASE(an_engine_upgraded_under_the_client_is_renegotiated) {
    std::atomic<bool> upgraded{false};
    FakeEngine fake([&upgraded](const std::string& line) {
        if (line.find(" /version ") != std::string::npos) {
            return Scripted{upgraded ? http(200, R"({"ApiVersion":"1.52","MinAPIVersion":"1.44"})") : version_reply};
        }
        if (upgraded && line.find("/v1.41/") != std::string::npos) {
            return Scripted{http(400, R"({"message":"client version 1.41 is too old. Minimum supported API version )"
                                      R"(is 1.44, please upgrade your client to a newer version"})")};
        }
        return Scripted{http(201, R"({"Id":"abc"})")};
    });
    Client client(fake.options());
    BOOST_TEST(client.create({.image = "x"}) == "abc");
    BOOST_TEST(client.api_version() == "1.41");
    upgraded = true;
    BOOST_TEST(client.create({.image = "x"}) == "abc");
    BOOST_TEST(client.api_version() == "1.52");
    auto requests = fake.requests();
    BOOST_TEST(std::count_if(requests.begin(), requests.end(), [](const std::string& r) {
                   return r.find("POST /v1.52/containers/create") == 0;
               }) == 1);
}

// A pinned version the engine refuses is reported as such, with the engine's words.
BOOST_AUTO_TEST_CASE(a_refused_version_is_unsupported_not_a_bad_request) {
    FakeEngine fake([](const std::string& line) {
        if (line.find(" /version ") != std::string::npos) return Scripted{version_reply};
        return Scripted{http(400, R"({"message":"client version 1.41 is too new. Maximum supported API version is 1.40"})")};
    });
    Client client(fake.options());
    try {
        client.list_containers({});
        BOOST_FAIL("no error");
    } catch (const UnsupportedVersion& e) {
        BOOST_TEST(e.status() == 400);
        BOOST_TEST(e.engine_message().find("too new") != std::string::npos, e.engine_message());
    }
    BOOST_CHECK_THROW(client.events({}), UnsupportedVersion);
}

// A POST whose answer was lost may have reached the engine: it is never sent again, or a lost
// create answer would make a second container. A GET is (issue 10, point 5).
BOOST_AUTO_TEST_CASE(a_request_that_may_have_reached_the_engine_is_sent_once) {
    std::atomic<int> creates{0};
    FakeEngine fake([&](const std::string& line) {
        if (line.find(" /version ") != std::string::npos) return Scripted{version_reply};
        if (line.find("POST ") == 0) {
            ++creates;
            return Scripted{"", false, true};  // received, then the connection dropped
        }
        return Scripted{http(200, "[]")};
    });
    Client client(fake.options());
    client.list_containers({});  // leaves a kept-alive connection for the create to reuse
    BOOST_CHECK_THROW(client.create({.image = "x"}), Unreachable);
    BOOST_TEST(creates == 1);
}

// Issue 23: a GET the engine does not answer in time, on a reused connection, is not sent
// again on a fresh one (that would wait twice the request timeout on a stalled engine); the
// connection it timed out on is closed, not kept.
BOOST_AUTO_TEST_CASE(a_get_that_timed_out_is_not_sent_again_and_its_connection_is_closed) {
    std::atomic<int> lists{0};
    FakeEngine fake([&](const std::string& line) {
        if (line.find(" /version ") != std::string::npos) return Scripted{version_reply};
        if (line.find("/containers/json") != std::string::npos && ++lists > 1) return Scripted{"", true};  // hangs
        return Scripted{http(200, "[]")};
    });
    Client client(fake.options(300ms));
    client.list_containers({});  // leaves a kept-alive connection for the next one to reuse
    BOOST_CHECK_THROW(client.list_containers({}), Timeout);
    BOOST_TEST(lists == 2);
    BOOST_TEST(client.open_connections() == 0u);
}

BOOST_AUTO_TEST_CASE(requests_are_encoded_as_the_engine_expects) {
    FakeEngine fake(answering({http(200, "[]")}));
    Client client(fake.options());
    client.list_containers({.all = true, .filters = {{"label", {"reaperd.session=s 1"}}}});
    auto line = fake.requests().back();
    BOOST_TEST(line ==
               "GET /v1.41/containers/json?all=1&filters=%7B%22label%22%3A%5B%22reaperd.session%3Ds%201%22%5D%7D "
               "HTTP/1.1");
}

BOOST_AUTO_TEST_CASE(a_connection_the_engine_dropped_while_idle_is_replaced_once) {
    // The fake closes every connection after one answer without saying so, as an engine
    // restart would; the next call must not fail for it.
    FakeEngine fake([](const std::string& line) {
        if (line.find(" /version ") != std::string::npos) return Scripted{version_reply, false, true};
        return Scripted{http(200, "[]"), false, true};
    });
    Client client(fake.options());
    for (int i = 0; i < 5; ++i) client.list_containers({});
    BOOST_TEST(fake.connections_accepted() >= 5);
}

BOOST_AUTO_TEST_CASE(connections_are_reused_not_reopened) {
    FakeEngine fake(answering({http(200, "[]")}));
    Client client(fake.options());
    for (int i = 0; i < 20; ++i) client.list_containers({});
    BOOST_TEST(fake.connections_accepted() == 1);
    BOOST_TEST(client.open_connections() == 1u);
    client.close();
    BOOST_TEST(client.open_connections() == 0u);
}

// ---- exec ------------------------------------------------------------------------------
// Started attached on both engines: Podman 4.3 reports a detached exec Running for ever.

namespace {
// The engine's answer to an attached exec start: it takes the connection over and sends the
// command's output until the command ends, then closes it (no length, no chunks).
const std::string attached_exec_head = "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.raw-stream\r\n\r\n";

// One frame of the multiplexed output: the stream (1 stdout, 2 stderr), three zero bytes, the
// length in 4 big-endian bytes, the bytes.
std::string output_frame(char stream, const std::string& text) {
    std::string frame{stream, 0, 0, 0};
    for (int shift : {24, 16, 8, 0}) frame += static_cast<char>((text.size() >> shift) & 0xff);
    return frame + text;
}

// An engine with one running container c1 whose exec e1 is started with `start`.
FakeEngine::Script exec_script(Scripted start, std::function<std::string()> inspect = {}) {
    return [start, inspect](const std::string& line) {
        if (line.find(" /version ") != std::string::npos) return Scripted{version_reply};
        if (line.find("POST /v1.41/containers/c1/exec ") == 0) return Scripted{http(201, R"({"Id":"e1"})")};
        if (line.find("POST /v1.41/exec/e1/start ") == 0) return start;
        if (line.find("GET /v1.41/exec/e1/json ") == 0 && inspect) return Scripted{http(200, inspect())};
        return Scripted{http(404, R"({"message":"page not found"})")};
    };
}
}  // namespace

BOOST_AUTO_TEST_CASE(exec_reads_the_output_to_its_end_then_the_exit_code) {
    std::atomic<int> inspects{0};
    FakeEngine fake(exec_script(
        {attached_exec_head + output_frame(1, "out\n") + output_frame(2, "err\n"), false, true},
        // The output can close a moment before the engine has the exit code.
        [&] { return ++inspects == 1 ? R"({"Running":true,"ExitCode":0})" : R"({"Running":false,"ExitCode":3})"; }));
    Client client(fake.options());
    BOOST_TEST(client.exec("c1", {"sh", "-c", "exit 3"}, 5s) == 3);
    BOOST_TEST(inspects == 2);
    auto requests = fake.requests();
    BOOST_TEST(std::count(requests.begin(), requests.end(), "POST /v1.41/exec/e1/start HTTP/1.1") == 1);
}

BOOST_AUTO_TEST_CASE(an_exec_that_outlives_its_timeout_is_a_timeout_at_its_deadline) {
    // Some output, then nothing, the connection held open: a command that never ends.
    FakeEngine fake(exec_script({attached_exec_head + output_frame(1, "starting\n"), true}));
    Client client(fake.options(5000ms));
    client.api_version();
    auto start = std::chrono::steady_clock::now();
    try {
        client.exec("c1", {"sleep", "1000"}, 300ms);
        BOOST_FAIL("the exec returned");
    } catch (const Timeout& e) {
        BOOST_TEST(std::string(e.what()).find("did not finish within 300 ms") != std::string::npos, e.what());
    }
    auto took = std::chrono::steady_clock::now() - start;
    BOOST_TEST(took >= 300ms);
    BOOST_TEST(took < 1500ms);  // its own deadline, not the 5 s request timeout
    BOOST_TEST(client.open_connections() == 0u);  // the engine took it over: not kept
}

BOOST_AUTO_TEST_CASE(an_exec_start_the_engine_refuses_is_its_typed_error) {
    FakeEngine fake(exec_script({http(409, R"({"message":"container c1 is not running"})")}));
    Client client(fake.options());
    BOOST_CHECK_THROW(client.exec("c1", {"true"}, 5s), Conflict);
}

// ---- event streams ---------------------------------------------------------------------

namespace {
std::string chunked_events(const std::vector<std::string>& lines, bool terminate) {
    std::string out = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (const auto& l : lines) {
        char size[16];
        std::snprintf(size, sizeof size, "%zx", l.size());
        out += size + std::string("\r\n") + l + "\r\n";
    }
    if (terminate) out += "0\r\n\r\n";
    return out;
}
const std::string create_event =
    R"({"Type":"container","Action":"create","Actor":{"ID":"abc","Attributes":{"name":"n","reaperd.session":"s"}},"timeNano":5})"
    "\n";
}  // namespace

struct StreamFault {
    const char* name;
    Scripted reply;
    EngineErrorKind kind;
    const char* message;
};
std::ostream& operator<<(std::ostream& out, const StreamFault& f) { return out << f.name; }

const StreamFault stream_faults[] = {
    {"engine ends the stream", {chunked_events({create_event}, true)}, EngineErrorKind::Unreachable,
     "ended the event stream"},
    {"connection drops", {chunked_events({create_event}, false), false, true}, EngineErrorKind::Unreachable, ""},
    {"line cut short, then the end", {chunked_events({create_event, R"({"Type":"contai)"}, true)},
     EngineErrorKind::Protocol, "inside an event"},
    {"garbage line", {chunked_events({create_event, "not json at all\n"}, false), true}, EngineErrorKind::Protocol,
     "unparseable JSON"},
    {"500 instead of a stream", {http(500, R"({"message":"events broke"})")}, EngineErrorKind::Server,
     "events broke"},
};

BOOST_DATA_TEST_CASE(broken_event_streams_end_with_typed_errors, bdata::make(stream_faults), fault) {
    FakeEngine fake(answering(fault.reply));
    Client client(fake.options(1000ms));
    std::vector<Event> seen;
    try {
        auto stream = client.events({});
        while (auto e = stream->next()) seen.push_back(*e);
        BOOST_FAIL("the stream ended without an error");
    } catch (const EngineError& e) {
        BOOST_TEST(e.kind() == fault.kind, e.what());
        BOOST_TEST(std::string(e.what()).find(fault.message) != std::string::npos, e.what());
    }
    if (fault.kind != EngineErrorKind::Server) {
        BOOST_REQUIRE_EQUAL(seen.size(), 1u);
        BOOST_TEST(seen[0].id == "abc");
        BOOST_TEST(seen[0].action == "create");
        BOOST_TEST(seen[0].attributes.at("reaperd.session") == "s");
        BOOST_TEST(seen[0].time_nano == 5);
    }
}

BOOST_AUTO_TEST_CASE(a_stream_with_until_ends_normally_at_its_end) {
    FakeEngine fake(answering({chunked_events({create_event}, true)}));
    Client client(fake.options());
    auto stream = client.events({.until = 100});
    BOOST_TEST(stream->next().has_value());
    BOOST_TEST(!stream->next().has_value());
}

BOOST_AUTO_TEST_CASE(cancel_unblocks_a_reader_of_a_silent_stream) {
    FakeEngine fake(answering({chunked_events({}, false), true}));
    Client client(fake.options());
    auto stream = client.events({});
    std::optional<Event> result{Event{}};
    std::thread reader([&] { result = stream->next(); });
    std::this_thread::sleep_for(100ms);  // real time: the reader is blocked in next() by then
    auto t0 = std::chrono::steady_clock::now();
    stream->cancel();
    reader.join();
    // Uncancelled, the reader would wait for the silent stream forever; a cancel takes
    // microseconds, and 1 s leaves room for a loaded machine's scheduling.
    BOOST_TEST((std::chrono::steady_clock::now() - t0) < 1s);
    BOOST_TEST(!result.has_value());
}
