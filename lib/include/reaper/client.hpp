// The Docker Engine API client: HTTP/1.1 over the engine's unix socket, or TCP with TLS (or
// plain TCP to this host).
#pragma once

#include <reaper/engine.hpp>

#include <chrono>
#include <cstdint>
#include <istream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace reaper {

// Where the engine listens, as written in DOCKER_HOST.
struct EngineAddress {
    enum class Kind { Unix, Tcp };
    Kind kind = Kind::Unix;
    std::string path;  // Unix
    std::string host;  // Tcp
    std::uint16_t port = 0;

    // Accepts "unix:///abs/path", "tcp://host:port" and a bare absolute path. Whether TCP
    // uses TLS is not part of the address (as with DOCKER_HOST): see TlsOptions.
    // Throws std::invalid_argument naming the input and what is wrong with it.
    static EngineAddress parse(std::string_view text);
    // DOCKER_HOST if set and non-empty, else unix:///var/run/docker.sock.
    static EngineAddress from_environment();
    std::string to_string() const;
    // A unix socket, or TCP to "localhost", 127.0.0.0/8 or ::1 (literally: names other than
    // localhost are not resolved to find out).
    bool is_local() const;
};

inline constexpr const char* default_engine_address = "unix:///var/run/docker.sock";

// DOCKER_API_VERSION if set and non-empty, else "" (negotiate). Throws
// std::invalid_argument when it is set but not an API version.
std::string api_version_from_environment();
// "1.44": digits, a dot, digits.
bool is_api_version(std::string_view text);

// TLS to a tcp:// engine, as the docker CLI's --tlsverify: the engine's certificate must be
// signed by `ca_file` and name the address's host (an IP address in its subjectAltName, or
// a DNS name); this client shows `cert_file` with its key `key_file`, which an engine run
// with --tlsverify requires. PEM files; the key unencrypted.
struct TlsOptions {
    std::string ca_file;
    std::string cert_file;  // "" with key_file "": no client certificate
    std::string key_file;

    // ca.pem, cert.pem and key.pem in `dir`, the docker CLI's names in DOCKER_CERT_PATH; as
    // for the CLI, cert.pem and key.pem are left out when they do not exist.
    static TlsOptions in_directory(const std::string& dir);
    // As the docker CLI reads its environment: DOCKER_TLS_VERIFY set to anything but ""
    // (even "0") turns TLS with verification on, with the files in DOCKER_CERT_PATH, else in
    // ~/.docker; unset or "": nullopt (no TLS). Throws std::invalid_argument when neither
    // DOCKER_CERT_PATH nor HOME says where the files are.
    static std::optional<TlsOptions> from_environment();

    friend bool operator==(const TlsOptions&, const TlsOptions&) = default;
};

struct ClientOptions {
    EngineAddress address;
    // TLS for a tcp:// address (nullopt: plain). The files are read when the Client is made:
    // a file that is missing, unreadable or not PEM, or a key that is not cert_file's, throws
    // std::invalid_argument from the constructor, naming the file; so does TLS for a unix
    // socket.
    std::optional<TlsOptions> tls;
    // Plain TCP to a host that is not local (EngineAddress::is_local) is refused unless this
    // is set: the Engine API is root on the engine's host, and without TLS anyone on the
    // network path can read and drive it. See check_plain_tcp().
    bool allow_plain_tcp = false;
    // Receive/send timeout set on the socket for each request. Waits and event streams
    // have their own bounds.
    std::chrono::milliseconds request_timeout{30'000};
    std::chrono::milliseconds connect_timeout{5'000};
    // API versions, negotiated as the docker CLI and docker-py do: the highest version both
    // sides speak, i.e. min(engine's ApiVersion, max_api_version), which is never below the
    // engine's MinAPIVersion when the client can speak that. max_api_version is the newest
    // version this client has been checked against (1.52: Docker 29; README, "Supported engines");
    // min_api_version the oldest (1.40: Docker 19.03). No shared version, or an engine that
    // refuses ours, throws UnsupportedVersion; the next call asks the engine again, since it
    // may have been upgraded meanwhile.
    std::string min_api_version = "1.40";
    std::string max_api_version = "1.52";
    // A version to use without negotiating ("" = negotiate), as DOCKER_API_VERSION does for
    // the docker CLI. Outside the engine's range it throws UnsupportedVersion, naming both.
    std::string pinned_api_version;
    // Idle kept-alive connections kept for reuse; more are closed after their request.
    std::size_t max_idle_connections = 4;

    // The docker CLI's environment: the address from DOCKER_HOST, the pinned version from
    // DOCKER_API_VERSION, TLS from DOCKER_TLS_VERIFY and DOCKER_CERT_PATH (each as the
    // functions above read them, and throwing as they do); the rest default.
    static ClientOptions from_environment();
};

// Throws std::invalid_argument when `options` ask for plain TCP to a host that is not local
// without allow_plain_tcp, naming the address and the fix. The Client's constructor checks
// it first; callers that report configuration errors by their source can ask before.
void check_plain_tcp(const ClientOptions& options);

// Query-string helpers, public for their unit tests.
std::string url_encode(std::string_view text);
std::string encode_filters(const Filters& filters);  // the JSON the engine wants in ?filters=
// Decodes one line of the engine's /events stream. Throws ProtocolError on anything that is
// not a JSON object; missing fields are left empty.
Event parse_event_line(const std::string& line);
// Compares dotted versions numerically: <0, 0, >0. Terminates on any input: a component
// that is not a number ends the version ("1.43-rc1" compares as 1.43, "x" as 0).
int compare_api_versions(std::string_view a, std::string_view b);

// The real Engine. Thread-safe: each call borrows a connection of its own (an idle kept-alive
// one or a new one), so calls from several threads run in parallel. A Client owns every
// connection it opens, including those of its event streams; close() shuts all of them
// down (in-flight calls fail with ClientClosed) and releases the fds; two clients never
// share a connection and there is no process-wide state (but OpenSSL's, once TLS is used).
// A TLS handshake the engine refuses, or an engine certificate that does not verify, fails
// a call with Unreachable naming the reason.
class Client final : public Engine {
public:
    // Does not connect; the first call does, and negotiates the API version then. Throws
    // std::invalid_argument for plain TCP it refuses (check_plain_tcp) and TLS options it
    // cannot use (see ClientOptions::tls).
    explicit Client(ClientOptions options);
    ~Client() override;
    Client(const Client&) = delete;
    Client& operator=(const Client&) = delete;

    // The negotiated API version ("1.41"); negotiates now if no call has yet.
    std::string api_version();
    const ClientOptions& options() const noexcept;
    // Open connections right now (idle + busy + streams): for leak tests.
    std::size_t open_connections() const;
    // Imports a root filesystem tarball as image `reference` ("name:tag"): how the test
    // harness provides its images; no session or daemon imports one, so Engine has no such call.
    void import_image(std::istream& tar, const std::string& reference);

    // The Engine calls (a Session's), and beside them what reaperd's port and tools use.
    void ping();
    VersionInfo version();
    EngineInfo info();
    std::vector<ContainerSummary> list_containers(const ListOptions& options) override;
    ContainerInfo inspect(const std::string& id) override;
    std::string create(const ContainerSpec& spec) override;
    void start(const std::string& id) override;
    void stop(const std::string& id, std::chrono::seconds grace);
    void kill(const std::string& id, const std::string& signal = "SIGKILL") override;
    void remove(const std::string& id, const RemoveOptions& options) override;
    int wait(const std::string& id, std::chrono::milliseconds timeout);
    int exec(const std::string& id, const std::vector<std::string>& cmd,
             std::chrono::milliseconds timeout) override;
    std::unique_ptr<EventStream> events(const EventsOptions& options);
    std::vector<NetworkInfo> list_networks(const Filters& filters);
    NetworkInfo inspect_network(const std::string& id);
    void remove_network(const std::string& id);
    std::vector<VolumeInfo> list_volumes(const Filters& filters);
    VolumeInfo inspect_volume(const std::string& name);
    void remove_volume(const std::string& name);
    void close() noexcept override;

    struct Impl;

private:
    std::shared_ptr<Impl> impl_;
};

}  // namespace reaper
