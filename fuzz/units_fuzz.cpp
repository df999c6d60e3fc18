// The small parsers that take text from config files, labels on other people's containers,
// DOCKER_HOST, DOCKER_API_VERSION and the engine's timestamps and API versions. The promise: a value or std::invalid_argument
// (ProtocolViolation for ids), nothing else; a bad label falls back to the default; what the
// formatters write parses back; no container id can place a log path outside the engine's
// root.
#include "check.hpp"

#include "config.hpp"
#include "engine_port.hpp"
#include "logcap/logcap_policy.hpp"
#include "registry.hpp"

#include <reaper/client.hpp>
#include <reaper/control.hpp>
#include <reaper/template.hpp>
#include <reaper/units.hpp>

#include <limits>
#include <stdexcept>

namespace {

void durations_and_sizes(const std::string& text) {
    try {
        const auto d = reaper::parse_duration(text);
        FUZZ_CHECK(d.count() >= 0 && d <= reaper::max_duration);
        FUZZ_CHECK(reaper::parse_duration(reaper::format_duration(d)) == d);
    } catch (const std::invalid_argument&) {
    }
    try {
        const auto bytes = reaper::parse_size(text);
        FUZZ_CHECK(reaper::parse_size(reaper::format_size(bytes)) == bytes);
    } catch (const std::invalid_argument&) {
    }
    try {
        const auto bytes = reaper::parse_docker_size(text);
        FUZZ_CHECK(bytes <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()));
    } catch (const std::invalid_argument&) {
    }
    const std::size_t bad = reaper::invalid_utf8_at(text);
    FUZZ_CHECK(bad == std::string::npos || bad < text.size());
    if (bad != std::string::npos) FUZZ_CHECK(reaper::valid_utf8(text.substr(0, bad)));
}

void engine_address(const std::string& text) {
    reaper::EngineAddress address;
    try {
        address = reaper::EngineAddress::parse(text);
    } catch (const std::invalid_argument&) {
        return;
    }
    const std::string written = address.to_string();
    if (address.kind == reaper::EngineAddress::Kind::Unix) {
        FUZZ_CHECK(!address.path.empty() && address.path.front() == '/');
        FUZZ_CHECK(reaper::EngineAddress::parse(written).path == address.path);
    } else {
        FUZZ_CHECK(!address.host.empty() && address.port != 0);
    }
}

void labels(const std::string& text) {
    (void)reaperd::label_key_valid(text);

    constexpr std::uint64_t default_cap = std::uint64_t{1} << 30;
    const auto cap = reaperd::logcap::resolve_cap({{reaperd::logcap::max_size_label, text}}, default_cap);
    if (cap.bad_label) FUZZ_CHECK(cap.cap_bytes == default_cap && !cap.exempt);
    if (cap.exempt) FUZZ_CHECK(cap.cap_bytes == 0);

    // A container labelled by someone else entirely: the registry must take it in whatever
    // its labels and creation time say.
    reaperd::Registry registry;
    reaper::ContainerInfo info;
    info.id = text;
    info.name = "/fuzzed";
    info.created = text;
    info.labels = {{"reaperd.session", text}, {reaperd::max_age_label, text}};
    const auto now = reaperd::Clock::now();
    const auto warning = registry.upsert_container(info, reaperd::SessionsConfig{}, now);
    const auto& known = registry.containers.at(text);
    FUZZ_CHECK(warning.has_value() != known.max_age.has_value());
    FUZZ_CHECK(known.session == text);
    FUZZ_CHECK(registry.sessions.count(text) == 1);
}

void timestamps(const std::string& text) {
    const auto t = reaper::parse_rfc3339(text);
    if (!t) return;
    const std::string written = reaperd::format_rfc3339(*t);
    // Years 0000-9999 only: the format has four digits for the year.
    if (written.size() != 24 || written.front() == '-') return;
    const auto again = reaper::parse_rfc3339(written);
    FUZZ_CHECK(again && *again == std::chrono::floor<std::chrono::milliseconds>(*t));
}

void log_paths(const std::string& text) {
    const std::string root = "/var/lib/docker";
    for (const char* driver : {"json-file", "local"}) {
        if (const auto files = reaperd::locate_log(text, driver, "", root)) {
            FUZZ_CHECK(files->dir.rfind(root + "/containers/", 0) == 0);
            FUZZ_CHECK(files->dir.find("..") == std::string::npos);
            FUZZ_CHECK(files->live_name.find('/') == std::string::npos);
        }
    }
    if (const auto files = reaperd::locate_log("", "json-file", text, root)) {
        FUZZ_CHECK(!files->live_name.empty() && files->live_name.find('/') == std::string::npos);
        FUZZ_CHECK(text.rfind(files->dir, 0) == 0);
        const std::string tail = "/" + files->live_name;
        FUZZ_CHECK(text.size() >= tail.size() && text.compare(text.size() - tail.size(), tail.size(), tail) == 0);
    }
    (void)reaperd::is_rotation(text, "0123abcd-json.log");
}

// API versions come from the engine's /version, DOCKER_API_VERSION and engine.api_version.
// The comparison runs under the client's negotiation lock: a hang there hangs every engine
// call (issue 10: "1.43-rc1" once looped forever), so -timeout catches the worst bug here.
void api_versions(const std::string& text) {
    for (const char* other : {"1.52", "1.40", "", text.c_str()}) {
        const int forward = reaper::compare_api_versions(text, other);
        const int backward = reaper::compare_api_versions(other, text);
        FUZZ_CHECK((forward < 0) == (backward > 0) && (forward == 0) == (backward == 0));
    }
    if (reaper::is_api_version(text)) {
        FUZZ_CHECK(text.find('.') != std::string::npos);
        FUZZ_CHECK(reaper::compare_api_versions(text + ".0", text) == 0);
    }
}

void control_ids(const std::string& text) {
    try {
        reaper::control::validate_session_id(text);
    } catch (const reaper::control::ProtocolViolation&) {
    }
    try {
        reaper::control::validate_container(text);
    } catch (const reaper::control::ProtocolViolation&) {
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string text = fuzz_text(data, size);
    durations_and_sizes(text);
    engine_address(text);
    labels(text);
    timestamps(text);
    log_paths(text);
    control_ids(text);
    api_versions(text);
    return 0;
}
