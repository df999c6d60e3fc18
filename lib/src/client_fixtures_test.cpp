// The client against recorded Docker Engine API 1.52 responses (Docker 29), served from
// lib/src/testdata/api-1.52/ by a small fake engine on a unix socket. The fixtures follow the
// 1.52 swagger: fields removed by 1.52 are absent (events' status/id/from, the top-level
// NetworkSettings fields, Config.MacAddress, ...), fields added since 1.41 are present (list
// Health, ImageManifestDescriptor, Storage, ...). See testdata/api-1.52/README.md.
#include <reaper/client.hpp>

#include <boost/test/unit_test.hpp>

#include <Poco/JSON/Object.h>
#include <Poco/JSON/Parser.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef REAPER_TESTDATA
#error "REAPER_TESTDATA must name lib/src/testdata (see lib/CMakeLists.txt)"
#endif

using namespace reaper;
using namespace std::chrono_literals;

namespace {

const std::string fixtures = std::string(REAPER_TESTDATA) + "/api-1.52/";

std::string fixture(const std::string& name) {
    std::ifstream in(fixtures + name, std::ios::binary);
    if (!in) throw std::runtime_error("missing fixture " + fixtures + name);
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
}

std::vector<std::string> fixture_lines(const std::string& name) {
    std::istringstream in(fixture(name));
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (!line.empty()) lines.push_back(line);
    }
    return lines;
}

// The ids the fixtures use.
const std::string pg_id = "6a68e55ef5b86bd55aac7d8496ce5615f2a98d82db8c114e2cefdeea2d448de1";
const std::string redis_id = "9eb22cbc7a2be10ddcac5cee101ba266f54d97494d055491ec53ec6800c2823f";
const std::string nginx_id = "b59c003146bdbbedff89f08cc5ea4c9683e291c43dba7450a2ee62fe4336c084";
const std::string events_container_id = "c1da4bbbaeef766ec37730e7bba51f1c3d1dee483b713f84408f62b76a5f5117";
const std::string exec_id = "2f6f823b46f7f978dc3188367a2304bdf4e9abfd493b93946b5bf81f03b155e9";
const std::string session = "s-4d6d5902ff7e7416";

// A whole HTTP response: `body` with a Content-Length, or (chunked) one chunk per line as
// the engine streams events and progress.
std::string reply(int status, const std::string& body, bool chunked = false) {
    std::string head = "HTTP/1.1 " + std::to_string(status) + " X\r\nApi-Version: 1.52\r\nContent-Type: application/json\r\n";
    if (!chunked) return head + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    std::string out = head + "Transfer-Encoding: chunked\r\n\r\n";
    std::istringstream in(body);
    for (std::string line; std::getline(in, line);) {
        line += '\n';
        std::ostringstream size;
        size << std::hex << line.size();
        out += size.str() + "\r\n" + line + "\r\n";
    }
    return out + "0\r\n\r\n";
}

struct Request {
    std::string method;
    std::string target;  // as sent, with the /vX.Y prefix
    std::string body;
};

// Answers each request with handler(method, target without the /vX.Y prefix, body): a whole
// HTTP response. One thread per connection; the destructor ends them.
class FixtureEngine {
public:
    using Handler = std::function<std::string(const std::string&, const std::string&, const std::string&)>;

    explicit FixtureEngine(Handler handler) : handler_(std::move(handler)) {
        static std::atomic<int> counter{0};
        path_ = (std::filesystem::temp_directory_path() /
                 ("reaper-fixtures-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".sock"))
                    .string();
        ::unlink(path_.c_str());
        listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path_.c_str());
        if (::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listener_, 16) != 0)
            throw std::runtime_error("cannot listen on " + path_);
        acceptor_ = std::thread([this] {
            for (;;) {
                int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
                if (fd < 0) return;
                std::lock_guard lock(mutex_);
                fds_.push_back(fd);
                workers_.emplace_back([this, fd] { serve(fd); });
            }
        });
    }

    ~FixtureEngine() {
        ::shutdown(listener_, SHUT_RDWR);
        acceptor_.join();
        {
            std::lock_guard lock(mutex_);
            for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
        }
        for (auto& t : workers_) t.join();
        for (int fd : fds_) ::close(fd);
        ::close(listener_);
        ::unlink(path_.c_str());
    }

    // Pinned to 1.52 so these tests do not depend on the client's default maximum.
    ClientOptions options() const {
        ClientOptions o;
        o.address = EngineAddress::parse("unix://" + path_);
        o.request_timeout = 5000ms;
        o.max_api_version = "1.52";
        return o;
    }

    std::vector<Request> requests() {
        std::lock_guard lock(mutex_);
        return requests_;
    }

private:
    void serve(int fd) {
        std::string buffer;
        char chunk[8192];
        auto fill = [&] {
            auto n = ::read(fd, chunk, sizeof chunk);
            if (n <= 0) return false;
            buffer.append(chunk, static_cast<std::size_t>(n));
            return true;
        };
        for (;;) {
            std::size_t head_end;
            while ((head_end = buffer.find("\r\n\r\n")) == std::string::npos)
                if (!fill()) return;
            std::string head = buffer.substr(0, head_end);
            std::size_t length = 0;
            if (auto cl = head.find("Content-Length: "); cl != std::string::npos) length = std::stoul(head.substr(cl + 16));
            while (buffer.size() < head_end + 4 + length)
                if (!fill()) return;
            Request r;
            std::istringstream line(head.substr(0, head.find("\r\n")));
            line >> r.method >> r.target;
            r.body = buffer.substr(head_end + 4, length);
            buffer.erase(0, head_end + 4 + length);
            {
                std::lock_guard lock(mutex_);
                requests_.push_back(r);
            }
            std::string target = r.target;
            if (target.rfind("/v", 0) == 0 && target.find('/', 1) != std::string::npos)
                target.erase(0, target.find('/', 1));
            auto bytes = handler_(r.method, target, r.body);
            if (::write(fd, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size())) return;
            // A body framed by neither a length nor chunks ends where the connection does (the
            // engine's answer to an attached exec start).
            const std::string reply_head = bytes.substr(0, bytes.find("\r\n\r\n"));
            if (reply_head.find("Content-Length:") == std::string::npos &&
                reply_head.find("Transfer-Encoding: chunked") == std::string::npos) {
                ::shutdown(fd, SHUT_RDWR);
                return;
            }
        }
    }

    Handler handler_;
    std::string path_;
    int listener_ = -1;
    std::thread acceptor_;
    std::mutex mutex_;
    std::vector<int> fds_;
    std::vector<std::thread> workers_;
    std::vector<Request> requests_;
};

// An engine that knows only GET /_ping (its API-Version header: 1.52) and GET /version, plus
// `more` for everything else (404 otherwise).
FixtureEngine::Handler with_version(FixtureEngine::Handler more = {}) {
    return [more](const std::string& method, const std::string& target, const std::string& body) {
        if (method == "GET" && target == "/_ping") return reply(200, "OK");
        if (method == "GET" && target == "/version") return reply(200, fixture("version.json"));
        if (more) {
            auto bytes = more(method, target, body);
            if (!bytes.empty()) return bytes;
        }
        return reply(404, R"({"message":"page not found"})" "\n");
    };
}

Poco::JSON::Object::Ptr parse(const std::string& text) {
    Poco::JSON::Parser parser;
    return parser.parse(text).extract<Poco::JSON::Object::Ptr>();
}

}  // namespace

BOOST_AUTO_TEST_CASE(version_negotiates_1_52_and_reads_the_engine) {
    FixtureEngine engine(with_version());
    Client client(engine.options());
    BOOST_TEST(client.api_version() == "1.52");
    auto v = client.version();
    BOOST_TEST(v.version == "29.1.3");
    BOOST_TEST(v.api_version == "1.52");
    BOOST_TEST(v.min_api_version == "1.44");
    BOOST_TEST(v.os == "linux");
    BOOST_TEST(v.arch == "amd64");
    auto requests = engine.requests();
    // Negotiated from /_ping's header (unversioned); /version asked only by version().
    BOOST_TEST(requests.front().target == "/_ping");
    BOOST_TEST(requests.size() == 2u);
    BOOST_TEST(requests.back().target == "/v1.52/version");
}

BOOST_AUTO_TEST_CASE(info_reads_the_docker_root_dir) {
    FixtureEngine engine(with_version([](auto& method, auto& target, auto&) {
        return method == "GET" && target == "/info" ? reply(200, fixture("info.json")) : std::string();
    }));
    Client client(engine.options());
    BOOST_TEST(client.info().docker_root_dir == "/var/lib/docker");
}

BOOST_AUTO_TEST_CASE(list_reads_every_summary) {
    FixtureEngine engine(with_version([](auto& method, auto& target, auto&) {
        return method == "GET" && target.rfind("/containers/json?", 0) == 0 ? reply(200, fixture("containers-list.json"))
                                                                             : std::string();
    }));
    Client client(engine.options());
    auto list = client.list_containers({true, {{"label", {"reaperd.session"}}}});
    BOOST_TEST_REQUIRE(list.size() == 3u);

    BOOST_TEST(list[0].id == pg_id);
    BOOST_TEST(list[0].names == std::vector<std::string>{"pg-" + session}, boost::test_tools::per_element());
    BOOST_TEST(list[0].image == "postgres:17-alpine");
    BOOST_TEST(list[0].labels.at("reaperd.session") == session);
    BOOST_TEST(list[0].labels.at("reaperd.max-age") == "2h");
    BOOST_TEST(list[0].state == "running");
    BOOST_TEST(list[0].status == "Up 2 minutes (healthy)");
    BOOST_TEST(list[0].created_unix_s == 1768381923);

    BOOST_TEST(list[1].id == redis_id);
    BOOST_TEST(list[1].state == "exited");
    BOOST_TEST(list[1].status == "Exited (137) About an hour ago");
    BOOST_TEST(list[1].labels.at("reaperd.session") == "s-f961673e19d2c8df");

    BOOST_TEST(list[2].id == nginx_id);
    BOOST_TEST(list[2].names.at(0) == "web");
    BOOST_TEST(list[2].labels.count("reaperd.session") == 0u);
    BOOST_TEST(list[2].labels.at("maintainer") == "NGINX Docker Maintainers <docker-maint@nginx.com>");

    auto target = engine.requests().back().target;
    BOOST_TEST(target.find("/v1.52/containers/json?all=1&filters=") == 0u, target);
}

BOOST_AUTO_TEST_CASE(inspect_reads_a_running_json_file_container_with_health) {
    FixtureEngine engine(with_version([](auto& method, auto& target, auto&) {
        return method == "GET" && target == "/containers/" + pg_id + "/json" ? reply(200, fixture("container-inspect.json"))
                                                                             : std::string();
    }));
    Client client(engine.options());
    auto info = client.inspect(pg_id);
    BOOST_TEST(info.id == pg_id);
    BOOST_TEST(info.name == "pg-" + session);
    BOOST_TEST(info.image == "sha256:5a0586ca2aac233dce9abfdb7b18d8721f3a4aacc28d59d433f05e05bf23e390");
    BOOST_TEST(info.created == "2026-01-14T09:12:03.418236917Z");
    BOOST_TEST(info.labels.at("reaperd.session") == session);
    BOOST_TEST(info.labels.size() == 2u);
    BOOST_TEST(info.log_path == "/var/lib/docker/containers/" + pg_id + "/" + pg_id + "-json.log");
    BOOST_TEST(info.log_driver == "json-file");
    BOOST_TEST(info.log_options.at("max-size") == "10m");
    BOOST_TEST(info.log_options.at("max-file") == "2");
    BOOST_TEST(info.auto_remove == false);
    BOOST_TEST(info.has_healthcheck);
    BOOST_TEST(info.state.status == "running");
    BOOST_TEST(info.state.running);
    BOOST_TEST(!info.state.paused);
    BOOST_TEST(!info.state.dead);
    BOOST_TEST(info.state.pid == 48213);
    BOOST_TEST(info.state.exit_code == 0);
    BOOST_TEST(info.state.health_status == "healthy");
    BOOST_TEST(info.state.started_at == "2026-01-14T09:12:03.702914356Z");
    BOOST_TEST(info.state.finished_at == "0001-01-01T00:00:00Z");
}

BOOST_AUTO_TEST_CASE(inspect_reads_an_exited_local_driver_container) {
    FixtureEngine engine(with_version([](auto& method, auto& target, auto&) {
        return method == "GET" && target == "/containers/" + redis_id + "/json"
                   ? reply(200, fixture("container-inspect-local-driver.json"))
                   : std::string();
    }));
    Client client(engine.options());
    auto info = client.inspect(redis_id);
    BOOST_TEST(info.name == "redis-s-f961673e19d2c8df");
    BOOST_TEST(info.log_path == "");
    BOOST_TEST(info.log_driver == "local");
    BOOST_TEST(info.log_options.at("max-size") == "10m");
    BOOST_TEST(!info.has_healthcheck);
    BOOST_TEST(info.state.status == "exited");
    BOOST_TEST(!info.state.running);
    BOOST_TEST(info.state.exit_code == 137);
    BOOST_TEST(info.state.pid == 0);
    BOOST_TEST(info.state.health_status == "");
    BOOST_TEST(info.state.finished_at == "2026-01-14T07:58:10.940377514Z");
}

BOOST_AUTO_TEST_CASE(event_lines_without_the_legacy_fields_parse) {
    auto lines = fixture_lines("events.jsonl");
    BOOST_TEST_REQUIRE(lines.size() == 9u);
    std::vector<Event> events;
    for (const auto& line : lines) {
        BOOST_TEST(line.find("\"status\"") == std::string::npos);  // removed in API 1.52
        events.push_back(parse_event_line(line));
    }
    BOOST_TEST(events[0].type == "image");
    BOOST_TEST(events[0].action == "import");
    BOOST_TEST(events[0].id == "sha256:e36964fdb7a6690b64ce7d2e85410e57a649dfe45f6de1beea9a64d5a6f8065d");
    BOOST_TEST(events[1].type == "container");
    BOOST_TEST(events[1].action == "create");
    BOOST_TEST(events[1].id == events_container_id);
    BOOST_TEST(events[1].attributes.at("reaperd.session") == session);
    BOOST_TEST(events[1].attributes.at("name") == "redis-" + session);
    BOOST_TEST(events[1].attributes.at("image") == "redis:7.4-alpine");
    BOOST_TEST(events[1].time_nano == 1768382047402918233);
    BOOST_TEST(events[2].type == "network");
    BOOST_TEST(events[2].action == "connect");
    BOOST_TEST(events[2].attributes.at("container") == events_container_id);
    BOOST_TEST(events[3].action == "start");
    BOOST_TEST(events[4].action == "health_status: healthy");
    BOOST_TEST(events[4].id == events_container_id);
    BOOST_TEST(events[5].action == "kill");
    BOOST_TEST(events[5].attributes.at("signal") == "9");
    BOOST_TEST(events[6].action == "die");
    BOOST_TEST(events[6].attributes.at("exitCode") == "137");
    BOOST_TEST(events[7].action == "disconnect");
    BOOST_TEST(events[8].action == "destroy");
    BOOST_TEST(events[8].id == events_container_id);
}

BOOST_AUTO_TEST_CASE(event_stream_reads_the_recorded_stream) {
    FixtureEngine engine(with_version([](auto& method, auto& target, auto&) {
        return method == "GET" && target.rfind("/events?", 0) == 0 ? reply(200, fixture("events.jsonl"), true)
                                                                   : std::string();
    }));
    Client client(engine.options());
    EventsOptions options;
    options.since = 1768382047;
    options.until = 1768382059;
    auto stream = client.events(options);
    std::vector<Event> events;
    while (auto e = stream->next()) events.push_back(*e);
    auto expected = fixture_lines("events.jsonl");
    BOOST_TEST_REQUIRE(events.size() == expected.size());
    for (std::size_t i = 0; i < events.size(); ++i) {
        auto want = parse_event_line(expected[i]);
        BOOST_TEST(events[i].type == want.type);
        BOOST_TEST(events[i].action == want.action);
        BOOST_TEST(events[i].id == want.id);
        BOOST_TEST(events[i].time_nano == want.time_nano);
        BOOST_TEST((events[i].attributes == want.attributes));
    }
}

BOOST_AUTO_TEST_CASE(exec_reads_the_exit_code) {
    FixtureEngine engine(with_version([](auto& method, auto& target, auto&) {
        if (method == "POST" && target == "/containers/" + pg_id + "/exec") return reply(201, fixture("exec-create.json"));
        // An attached start takes the connection over: 200, the output multiplexed (here one
        // stderr frame of 5 bytes), then the engine closes it.
        if (method == "POST" && target == "/exec/" + exec_id + "/start")
            return "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.raw-stream\r\nApi-Version: 1.52\r\n\r\n" +
                   std::string("\x02\0\0\0\0\0\0\x05", 8) + "nope\n";
        if (method == "GET" && target == "/exec/" + exec_id + "/json") return reply(200, fixture("exec-inspect.json"));
        return std::string();
    }));
    Client client(engine.options());
    BOOST_TEST(client.exec(pg_id, {"sh", "-c", "test -e /tmp/.ready"}, 5000ms) == 1);
    auto requests = engine.requests();
    BOOST_TEST_REQUIRE(requests.size() >= 4u);
    auto create = parse(requests[1].body);
    BOOST_TEST(create->getArray("Cmd")->size() == 3u);
    BOOST_TEST(create->getValue<bool>("AttachStdout"));
    BOOST_TEST(create->getValue<bool>("AttachStderr"));
    BOOST_TEST(requests[2].target == "/v1.52/exec/" + exec_id + "/start");
    BOOST_TEST(!parse(requests[2].body)->getValue<bool>("Detach"));
    BOOST_TEST(!parse(requests[2].body)->getValue<bool>("Tty"));
}

BOOST_AUTO_TEST_CASE(wait_reads_the_status_code) {
    FixtureEngine engine(with_version([](auto& method, auto& target, auto&) {
        return method == "POST" && target == "/containers/" + pg_id + "/wait" ? reply(200, fixture("wait.json"))
                                                                              : std::string();
    }));
    Client client(engine.options());
    BOOST_TEST(client.wait(pg_id, 5000ms) == 137);
}

BOOST_AUTO_TEST_CASE(create_reads_the_id_and_sends_a_1_52_body) {
    FixtureEngine engine(with_version([](auto& method, auto& target, auto&) {
        return method == "POST" && target.rfind("/containers/create", 0) == 0 ? reply(201, fixture("create.json"))
                                                                               : std::string();
    }));
    Client client(engine.options());
    ContainerSpec spec;
    spec.name = "pg-" + session;
    spec.image = "postgres:17-alpine";
    spec.env = {"POSTGRES_PASSWORD=reaper"};
    spec.labels = {{"reaperd.session", session}, {"reaperd.max-age", "2h"}};
    spec.log_config = {"json-file", {{"max-size", "10m"}, {"max-file", "2"}}};
    spec.memory_bytes = 536870912;
    spec.nano_cpus = 1000000000;
    spec.pids_limit = 256;
    spec.healthcheck_cmd = {"pg_isready", "-U", "postgres"};
    spec.healthcheck_interval = 500ms;
    BOOST_TEST(client.create(spec) == pg_id);

    auto sent = engine.requests().back();
    BOOST_TEST(sent.target == "/v1.52/containers/create?name=pg-" + session);
    auto body = parse(sent.body);
    // Container-wide MacAddress is refused from 1.52 on; resource limits belong in HostConfig.
    BOOST_TEST(!body->has("MacAddress"));
    for (const char* misplaced : {"Memory", "NanoCpus", "PidsLimit", "LogConfig", "NetworkMode", "AutoRemove"})
        BOOST_TEST(!body->has(misplaced), misplaced);
    BOOST_TEST(body->getObject("Labels")->getValue<std::string>("reaperd.session") == session);
    auto health = body->getObject("Healthcheck");
    BOOST_TEST(health->getArray("Test")->getElement<std::string>(0) == "CMD");
    BOOST_TEST(health->getValue<std::int64_t>("Interval") == 500'000'000);
    auto host = body->getObject("HostConfig");
    BOOST_TEST(host->getValue<std::int64_t>("Memory") == 536870912);
    BOOST_TEST(host->getObject("LogConfig")->getValue<std::string>("Type") == "json-file");
    BOOST_TEST(host->getValue<std::string>("NetworkMode") == "none");
}

BOOST_AUTO_TEST_CASE(lifecycle_calls_send_parameters_1_52_knows) {
    FixtureEngine engine(with_version([](auto& method, auto&, auto&) {
        return method == "POST" || method == "DELETE" ? reply(204, "") : std::string();
    }));
    Client client(engine.options());
    client.start(pg_id);
    client.stop(pg_id, 10s);
    client.kill(pg_id, "SIGKILL");
    client.remove(pg_id, {true, true});
    auto requests = engine.requests();
    BOOST_TEST_REQUIRE(requests.size() == 5u);
    BOOST_TEST(requests[1].target == "/v1.52/containers/" + pg_id + "/start");
    BOOST_TEST(requests[1].body.empty());  // a start body is refused since API 1.24
    BOOST_TEST(requests[2].target == "/v1.52/containers/" + pg_id + "/stop?t=10");
    BOOST_TEST(requests[3].target == "/v1.52/containers/" + pg_id + "/kill?signal=SIGKILL");
    BOOST_TEST(requests[4].method == "DELETE");
    BOOST_TEST(requests[4].target == "/v1.52/containers/" + pg_id + "?force=true&v=true");
}

BOOST_AUTO_TEST_CASE(import_accepts_the_recorded_stream) {
    FixtureEngine engine(with_version([](auto& method, auto& target, auto&) {
        return method == "POST" && target.rfind("/images/create?fromSrc=-&", 0) == 0
                   ? reply(200, fixture("images-create-import.jsonl"), true)
                   : std::string();
    }));
    Client client(engine.options());
    std::istringstream tar(std::string(1024, '\0'));
    BOOST_CHECK_NO_THROW(client.import_image(tar, "reaper-rootfs:1"));
    auto sent = engine.requests().back();
    // The tag inside repo=, as the docker CLI sends it: Podman ignores a separate tag=.
    BOOST_TEST(sent.target == "/v1.52/images/create?fromSrc=-&repo=reaper-rootfs%3A1");
    BOOST_TEST(sent.body.size() == 1024u);
    // No tag is :latest; a registry's port is not a tag.
    for (auto [reference, repo] : {std::pair{"reaper-rootfs", "reaper-rootfs%3Alatest"},
                                   std::pair{"localhost:5000/rootfs", "localhost%3A5000%2Frootfs%3Alatest"},
                                   std::pair{"localhost:5000/rootfs:2", "localhost%3A5000%2Frootfs%3A2"}}) {
        std::istringstream again(std::string(1024, '\0'));
        client.import_image(again, reference);
        BOOST_TEST(engine.requests().back().target == std::string("/v1.52/images/create?fromSrc=-&repo=") + repo);
    }
}

BOOST_AUTO_TEST_CASE(import_reports_an_error_inside_the_stream) {
    FixtureEngine engine(with_version([](auto& method, auto& target, auto&) {
        return method == "POST" && target.rfind("/images/create?", 0) == 0
                   ? reply(200, fixture("images-create-import-error.jsonl"), true)
                   : std::string();
    }));
    Client client(engine.options());
    std::istringstream tar("not a tar");
    try {
        client.import_image(tar, "reaper-rootfs:1");
        BOOST_FAIL("accepted");
    } catch (const ServerError& e) {
        BOOST_TEST(e.engine_message() == "archive/tar: invalid tar header");
    }
}
