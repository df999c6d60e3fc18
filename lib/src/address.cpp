#include <reaper/client.hpp>

#include <charconv>
#include <cstdlib>
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
        bad_address(text, "unsupported scheme (TLS and ssh are not supported)");
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

}  // namespace reaper
