// The engine client and reaperd against a private dockerd that serves TLS with --tlsverify on
// a loopback port (engine-guard with REAPER_ENGINE_TLS_DIR), with certificates made by openssl
// for this test process; and plain TCP to another host refused before any connection.
#include "daemon_fixture.hpp"
#include "engine.hpp"

#include <reaper/client.hpp>

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <string>

using namespace reaper;
using namespace std::chrono_literals;
using reaperd::itest::Child;
using reaperd::itest::eventually;
using reaperd::itest::Reaperd;
namespace fs = std::filesystem;

namespace {

// A CA; the engine's certificate for IP 127.0.0.1 (server-cert.pem, server-key.pem) and a
// client's (cert.pem, key.pem), both signed by it, so that the dir is what the docker CLI
// reads from DOCKER_CERT_PATH (ca.pem, cert.pem, key.pem); and another CA that signed nothing
// of the engine's (other-ca.pem). Removed at exit.
struct Certificates {
    std::string dir;

    Certificates() {
        char pattern[] = "/tmp/reaper-tls.XXXXXX";
        dir = ::mkdtemp(pattern);
        const std::string script = R"(set -e
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }
ca() { key "$1-key.pem"; openssl req -x509 -new -key "$1-key.pem" -out "$1.pem" -days 2 -subj "/CN=$2"; }
sign() {  # key file, certificate file, subject CN, extensions
  key "$1"; openssl req -new -key "$1" -subj "/CN=$3" -out "$2.csr"
  printf '%s\n' "$4" >"$2.ext"
  openssl x509 -req -in "$2.csr" -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 2 -extfile "$2.ext" -out "$2"
}
ca ca reaper-test-ca
ca other-ca reaper-test-other-ca
sign server-key.pem server-cert.pem reaper-test-engine 'subjectAltName=IP:127.0.0.1
extendedKeyUsage=serverAuth'
sign key.pem cert.pem reaperd 'extendedKeyUsage=clientAuth'
)";
        std::ofstream(dir + "/make.sh") << script;
        const std::string command = "cd '" + dir + "' && bash make.sh >make.log 2>&1";
        if (std::system(command.c_str()) != 0) {
            std::ifstream log(dir + "/make.log");
            std::stringstream text;
            text << log.rdbuf();
            throw std::runtime_error("openssl could not make the test certificates:\n" + text.str());
        }
    }
    ~Certificates() {
        std::error_code ec;
        fs::remove_all(dir, ec);
    }
    std::string file(const std::string& name) const { return dir + "/" + name; }
};

const Certificates& certificates() {
    static Certificates instance;
    return instance;
}

// Made after the certificates, so stopped before they are removed.
test::PrivateEngine& tls_engine() {
    static test::PrivateEngine instance(certificates().dir);
    return instance;
}

ClientOptions tls_client_options() {
    ClientOptions options;
    options.address = EngineAddress::parse(tls_engine().tls_address());
    options.tls = TlsOptions::in_directory(certificates().dir);
    return options;
}

ContainerSpec sleeper(const Labels& labels) {
    ContainerSpec spec;
    spec.name = test::unique_name("reaper-tls");
    spec.image = test::PrivateEngine::image;
    spec.cmd = {"sleep", "300"};
    spec.labels = labels;
    return spec;
}

// The Unreachable a call on `client` fails with.
std::string unreachable_message(Client& client) {
    try {
        client.ping();
    } catch (const Unreachable& e) {
        return e.what();
    } catch (const std::exception& e) {
        BOOST_FAIL(std::string("wrong exception: ") + e.what());
    }
    BOOST_FAIL("the engine answered");
    return "";
}

std::string invalid_argument_message(const ClientOptions& options) {
    try {
        Client client(options);
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    BOOST_FAIL("the client accepted the options");
    return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Adds `line` ("key: value") to the engine section of the config the fixture wrote.
void add_engine_key(const Reaperd& d, const std::string& line) {
    const std::string path = d.dir + "/reaperd.yaml";
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    std::string yaml = text.str();
    yaml.replace(yaml.find("engine:\n"), 8, "engine:\n  " + line + "\n");
    std::ofstream(path) << yaml;
}

// reaperd (started) reaps the container of a session that is ended through it.
void reaps_an_ended_session(Reaperd& d, Client& client, const std::string& session) {
    const std::string id = client.create(sleeper(reaperd::itest::session_label(session)));
    client.start(id);
    BOOST_REQUIRE(eventually([&] { return d.containers_of(session) == 1; }, 30s));
    d.control().end(session);
    BOOST_TEST(eventually(
        [&] {
            try {
                client.inspect(id);
                return false;
            } catch (const NotFound&) {
                return true;
            }
        },
        30s));
}

}  // namespace

BOOST_AUTO_TEST_CASE(client_over_tls_pings_negotiates_lists_creates_streams_and_removes) {
    const auto started = std::chrono::steady_clock::now();
    Client client(tls_client_options());
    client.ping();
    BOOST_TEST_MESSAGE("TLS engine at " << tls_engine().tls_address() << " up and answering in "
                                        << std::chrono::duration_cast<std::chrono::milliseconds>(
                                               std::chrono::steady_clock::now() - started).count()
                                        << " ms; API " << client.api_version());
    BOOST_TEST(compare_api_versions(client.api_version(), "1.40") >= 0);

    const Labels labels{{"reaper.test", test::unique_name("tls")}};
    EventsOptions events_options;
    events_options.filters = {{"type", {"container"}}, {"label", {"reaper.test=" + labels.at("reaper.test")}}};
    auto events = client.events(events_options);

    const std::string id = client.create(sleeper(labels));
    client.start(id);
    BOOST_TEST(client.inspect(id).state.running);
    ListOptions list;
    list.filters = {{"label", {"reaper.test=" + labels.at("reaper.test")}}};
    auto listed = client.list_containers(list);
    BOOST_REQUIRE(listed.size() == 1u);
    BOOST_TEST(listed[0].id == id);
    for (;;) {
        auto event = events->next();
        BOOST_REQUIRE_MESSAGE(event, "the TLS event stream ended before the container's start");
        if (event->id == id && event->action == "start") break;
    }

    client.remove(id, {.force = true, .volumes = true});
    BOOST_TEST(client.list_containers(list).empty());
}

BOOST_AUTO_TEST_CASE(close_ends_a_stream_blocked_in_a_tls_read_and_gives_every_fd_back) {
    const auto fds_before = test::open_fd_count();
    {
        Client client(tls_client_options());
        EventsOptions silent;
        silent.filters = {{"label", {"reaper.test=" + test::unique_name("nothing-has-this")}}};
        auto events = client.events(silent);
        auto reader = std::async(std::launch::async, [&] { return events->next(); });
        BOOST_TEST((reader.wait_for(200ms) == std::future_status::timeout));  // blocked
        const auto closed = std::chrono::steady_clock::now();
        client.close();
        BOOST_REQUIRE((reader.wait_for(5s) == std::future_status::ready));
        BOOST_TEST_MESSAGE("the reader returned "
                           << std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                                                    closed).count()
                           << " us after close()");
        BOOST_TEST(!reader.get().has_value());
    }
    BOOST_TEST(test::open_fd_count() == fds_before);
}

BOOST_AUTO_TEST_CASE(an_engine_with_tlsverify_refuses_a_client_without_a_certificate) {
    auto options = tls_client_options();
    options.tls->cert_file.clear();
    options.tls->key_file.clear();
    Client client(options);
    const auto message = unreachable_message(client);
    BOOST_TEST_MESSAGE(message);
    // dockerd 20.10's Go answers "bad certificate"; newer ones "certificate required".
    BOOST_TEST(contains(message, "TLS with the engine failed"), message);
    BOOST_TEST((contains(message, "alert bad certificate") || contains(message, "alert certificate required")), message);
    BOOST_TEST(contains(message, "this client shows no certificate"), message);
}

BOOST_AUTO_TEST_CASE(an_engine_certificate_another_ca_signed_is_not_accepted) {
    auto options = tls_client_options();
    options.tls->ca_file = certificates().file("other-ca.pem");
    Client client(options);
    const auto message = unreachable_message(client);
    BOOST_TEST_MESSAGE(message);
    BOOST_TEST(contains(message, "TLS handshake with the engine at " + tls_engine().tls_address() + " failed"), message);
    BOOST_TEST(contains(message, "its certificate was not accepted: unable to get local issuer certificate"), message);
    BOOST_TEST(contains(message, "reaper-test-engine"), message);
}

BOOST_AUTO_TEST_CASE(the_engine_certificate_must_name_the_host_even_on_loopback) {
    // The certificate names IP 127.0.0.1 only; "localhost" reaches the same engine.
    auto options = tls_client_options();
    options.address.host = "localhost";
    Client client(options);
    const auto message = unreachable_message(client);
    BOOST_TEST_MESSAGE(message);
    BOOST_TEST(contains(message, "its certificate was not accepted: hostname mismatch"), message);
}

BOOST_AUTO_TEST_CASE(a_key_that_is_not_the_certificates_is_refused_when_the_client_is_made) {
    auto options = tls_client_options();
    options.tls->key_file = certificates().file("server-key.pem");
    const auto message = invalid_argument_message(options);
    BOOST_TEST(contains(message, "TLS key file " + certificates().file("server-key.pem") +
                                     " is not the key of the certificate " + certificates().file("cert.pem")),
               message);
}

BOOST_AUTO_TEST_CASE(reaperd_with_docker_tls_verify_and_docker_cert_path_reaps_over_tls) {
    Client client(tls_client_options());
    Reaperd d("", "", tls_engine().tls_address());
    d.environment = {"DOCKER_TLS_VERIFY=1", "DOCKER_CERT_PATH=" + certificates().dir};
    const auto started = std::chrono::steady_clock::now();
    d.start();
    BOOST_TEST_MESSAGE("reaperd ready over TLS in " << std::chrono::duration_cast<std::chrono::milliseconds>(
                                                            std::chrono::steady_clock::now() - started).count()
                                                    << " ms");
    reaps_an_ended_session(d, client, test::unique_name("tls-env"));
}

BOOST_AUTO_TEST_CASE(reaperd_with_engine_tls_cert_path_reaps_over_tls) {
    Client client(tls_client_options());
    Reaperd d("", "", tls_engine().tls_address());
    add_engine_key(d, "tls_cert_path: " + certificates().dir);
    d.start();
    reaps_an_ended_session(d, client, test::unique_name("tls-config"));
}

// The files are read before any connection: no engine is needed at the address.
BOOST_AUTO_TEST_CASE(reaperd_exits_78_naming_tls_files_it_cannot_use) {
    Reaperd d("", "", "tcp://127.0.0.1:2376");
    add_engine_key(d, "tls_cert_path: " + d.dir + "/no-such-dir");
    Child from_file(d.dir, {REAPERD_PATH, "--config", d.dir + "/reaperd.yaml"});
    BOOST_TEST(from_file.wait() == 78);
    BOOST_TEST(contains(from_file.stderr_text(), "reaperd.yaml:2:18: engine.tls_cert_path: TLS CA file " + d.dir +
                                                     "/no-such-dir/ca.pem: cannot read: No such file or directory"),
               from_file.stderr_text());

    Reaperd e("", "", "tcp://127.0.0.1:2376");
    Child from_environment(e.dir, {REAPERD_PATH, "--config", e.dir + "/reaperd.yaml"},
                           {"DOCKER_TLS_VERIFY=1", "DOCKER_CERT_PATH=" + e.dir});
    BOOST_TEST(from_environment.wait() == 78);
    BOOST_TEST(contains(from_environment.stderr_text(), "reaperd: DOCKER_CERT_PATH: TLS CA file " + e.dir + "/ca.pem"),
               from_environment.stderr_text());
}

// 192.0.2.1 is TEST-NET-1: nothing answers there, and nothing is sent, since the address is
// refused before any connection.
BOOST_AUTO_TEST_CASE(reaperd_exits_78_for_plain_tcp_to_another_host) {
    const std::string fix = "use TLS (DOCKER_TLS_VERIFY=1, DOCKER_CERT_PATH) or set engine.allow_plain_tcp";
    Reaperd d("", "", "tcp://192.0.2.1:2375");
    Child from_file(d.dir, {REAPERD_PATH, "--config", d.dir + "/reaperd.yaml"});
    BOOST_TEST(from_file.wait() == 78);
    const auto file_text = from_file.stderr_text();
    BOOST_TEST(contains(file_text, "reaperd.yaml:2:9: engine.host: engine address tcp://192.0.2.1:2375: plain TCP"),
               file_text);
    BOOST_TEST(contains(file_text, fix), file_text);

    const std::string config = d.dir + "/environment.yaml";
    std::ofstream(config) << "control:\n  socket: " << d.socket << "\nstate:\n  dir: " << d.dir << "/state\n";
    Child from_environment(d.dir, {REAPERD_PATH, "--config", config}, {"DOCKER_HOST=tcp://192.0.2.1:2375"});
    BOOST_TEST(from_environment.wait() == 78);
    const auto environment_text = from_environment.stderr_text();
    BOOST_TEST(contains(environment_text, "reaperd: DOCKER_HOST: engine address tcp://192.0.2.1:2375: plain TCP"),
               environment_text);
    BOOST_TEST(contains(environment_text, fix), environment_text);
}
