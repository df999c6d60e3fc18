#include <reaper/client.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>

namespace reaper {

namespace {
[[noreturn]] void bad_address(std::string_view text, const std::string& why) {
    throw std::invalid_argument("engine address \"" + std::string(text) + "\": " + why +
                                " (expected unix:///path/to/docker.sock or tcp://host:port)");
}
}  // namespace

EngineAddress EngineAddress::parse(std::string_view text) {
    EngineAddress address;
    if (text.empty()) bad_address(text, "empty");
    if (text.front() == '/') {
        address.kind = Kind::Unix;
        address.path = std::string(text);
        return address;
    }
    constexpr std::string_view unix_scheme = "unix://";
    constexpr std::string_view tcp_scheme = "tcp://";
    if (text.substr(0, unix_scheme.size()) == unix_scheme) {
        auto path = text.substr(unix_scheme.size());
        if (path.empty() || path.front() != '/') bad_address(text, "the socket path must be absolute");
        address.kind = Kind::Unix;
        address.path = std::string(path);
        return address;
    }
    if (text.substr(0, tcp_scheme.size()) == tcp_scheme) {
        auto rest = text.substr(tcp_scheme.size());
        while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
        if (rest.find('/') != std::string_view::npos) bad_address(text, "a path after host:port is not supported");
        std::string_view host;
        std::string_view port_text;
        if (!rest.empty() && rest.front() == '[') {  // [::1]:2375
            auto close = rest.find(']');
            if (close == std::string_view::npos) bad_address(text, "unterminated IPv6 address");
            host = rest.substr(1, close - 1);
            if (close + 1 >= rest.size() || rest[close + 1] != ':') bad_address(text, "missing port");
            port_text = rest.substr(close + 2);
        } else {
            auto colon = rest.rfind(':');
            if (colon == std::string_view::npos) bad_address(text, "missing port");
            host = rest.substr(0, colon);
            port_text = rest.substr(colon + 1);
        }
        if (host.empty()) bad_address(text, "missing host");
        unsigned port = 0;
        auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
        if (ec != std::errc{} || end != port_text.data() + port_text.size() || port == 0 || port > 65535) {
            bad_address(text, "port must be a number from 1 to 65535");
        }
        address.kind = Kind::Tcp;
        address.host = std::string(host);
        address.port = static_cast<std::uint16_t>(port);
        return address;
    }
    if (text.find("://") != std::string_view::npos) {
        bad_address(text, "unsupported scheme (for TLS use tcp:// with TLS options, as DOCKER_TLS_VERIFY does; "
                          "ssh is not supported)");
    }
    bad_address(text, "not an address");
}

EngineAddress EngineAddress::from_environment() {
    const char* host = std::getenv("DOCKER_HOST");
    return parse(host && *host ? host : default_engine_address);
}

std::string EngineAddress::to_string() const {
    if (kind == Kind::Unix) return "unix://" + path;
    if (host.find(':') != std::string::npos) return "tcp://[" + host + "]:" + std::to_string(port);
    return "tcp://" + host + ":" + std::to_string(port);
}

bool EngineAddress::is_local() const {
    if (kind == Kind::Unix) return true;
    std::string name = host;
    for (char& c : name) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    if (name == "localhost") return true;
    in_addr v4{};
    if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
    in6_addr v6{};
    if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
        if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
        return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
    }
    return false;
}

TlsOptions TlsOptions::in_directory(const std::string& dir) {
    namespace fs = std::filesystem;
    TlsOptions tls;
    tls.ca_file = (fs::path(dir) / "ca.pem").string();
    // The docker CLI drops a default cert.pem or key.pem that does not exist, and connects
    // without showing a certificate: an engine run with --tls (not --tlsverify) accepts that.
    std::error_code ec;
    if (auto cert = fs::path(dir) / "cert.pem"; fs::exists(cert, ec)) tls.cert_file = cert.string();
    if (auto key = fs::path(dir) / "key.pem"; fs::exists(key, ec)) tls.key_file = key.string();
    return tls;
}

std::optional<TlsOptions> TlsOptions::from_environment() {
    const char* verify = std::getenv("DOCKER_TLS_VERIFY");
    if (!verify || !*verify) return std::nullopt;
    if (const char* dir = std::getenv("DOCKER_CERT_PATH"); dir && *dir) return in_directory(dir);
    const char* home = std::getenv("HOME");
    if (!home || !*home) {
        throw std::invalid_argument(std::string("DOCKER_TLS_VERIFY=") + verify +
                                    ": neither DOCKER_CERT_PATH nor HOME is set, so there is no "
                                    "directory to read ca.pem, cert.pem and key.pem from");
    }
    return in_directory(std::string(home) + "/.docker");
}

ClientOptions ClientOptions::from_environment() {
    ClientOptions options;
    options.address = EngineAddress::from_environment();
    options.pinned_api_version = api_version_from_environment();
    options.tls = TlsOptions::from_environment();
    return options;
}

void check_plain_tcp(const ClientOptions& options) {
    if (options.tls || options.allow_plain_tcp || options.address.is_local()) return;
    throw std::invalid_argument(
        "engine address " + options.address.to_string() +
        ": plain TCP to an engine on another host is refused (anyone on the network path could "
        "read and drive it); use TLS (DOCKER_TLS_VERIFY=1, DOCKER_CERT_PATH) or set "
        "engine.allow_plain_tcp (ClientOptions::allow_plain_tcp in the library) to allow it");
}

}  // namespace reaper
