#include <reaper/engine.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <utility>

namespace reaper {

namespace {

// Docker's words for a delete of a container it is removing already: "removal of container
// <name> is already in progress" (409, daemon/delete.go), matched case-blind on the phrase
// so that an engine that rewords the start still counts.
bool is_removal_in_progress(std::string text) {
    std::transform(text.begin(), text.end(), text.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return text.find("already in progress") != std::string::npos;
}

// The engine's words for each status, in one table for both directions.
constexpr std::array<std::pair<ContainerStatus, std::string_view>, 7> container_status_words{{
    {ContainerStatus::created, "created"},
    {ContainerStatus::running, "running"},
    {ContainerStatus::paused, "paused"},
    {ContainerStatus::restarting, "restarting"},
    {ContainerStatus::removing, "removing"},
    {ContainerStatus::exited, "exited"},
    {ContainerStatus::dead, "dead"},
}};

}  // namespace

ContainerStatus parse_container_status(std::string_view engine_word) noexcept {
    for (const auto& [status, word] : container_status_words)
        if (word == engine_word) return status;
    return ContainerStatus::unknown;
}

const char* to_string(ContainerStatus status) noexcept {
    for (const auto& [known, word] : container_status_words)
        if (known == status) return word.data();
    return "unknown";
}

const char* to_string(EngineErrorKind kind) {
    switch (kind) {
        case EngineErrorKind::NotFound: return "not found";
        case EngineErrorKind::Conflict: return "conflict";
        case EngineErrorKind::BadRequest: return "bad request";
        case EngineErrorKind::Server: return "engine error";
        case EngineErrorKind::Unreachable: return "engine unreachable";
        case EngineErrorKind::Timeout: return "timeout";
        case EngineErrorKind::Protocol: return "protocol error";
        case EngineErrorKind::Closed: return "client closed";
        case EngineErrorKind::Unsupported: return "unsupported API version";
    }
    return "unknown";
}

std::ostream& operator<<(std::ostream& out, EngineErrorKind kind) { return out << to_string(kind); }

EngineError::EngineError(EngineErrorKind kind, int status, std::string engine_message,
                         const std::string& what)
    : std::runtime_error(what), kind_(kind), status_(status), engine_message_(std::move(engine_message)) {}

void throw_engine_error(EngineErrorKind kind, int status, std::string engine_message,
                        const std::string& what) {
    switch (kind) {
        case EngineErrorKind::NotFound: throw NotFound(status, std::move(engine_message), what);
        case EngineErrorKind::Conflict:
            if (is_removal_in_progress(engine_message))
                throw RemovalInProgress(status, std::move(engine_message), what);
            throw Conflict(status, std::move(engine_message), what);
        case EngineErrorKind::BadRequest: throw BadRequest(status, std::move(engine_message), what);
        case EngineErrorKind::Server: throw ServerError(status, std::move(engine_message), what);
        case EngineErrorKind::Unreachable: throw Unreachable(status, std::move(engine_message), what);
        case EngineErrorKind::Timeout: throw Timeout(status, std::move(engine_message), what);
        case EngineErrorKind::Protocol: throw ProtocolError(status, std::move(engine_message), what);
        case EngineErrorKind::Closed: throw ClientClosed(status, std::move(engine_message), what);
        case EngineErrorKind::Unsupported: throw UnsupportedVersion(status, std::move(engine_message), what);
    }
    throw ProtocolError(status, std::move(engine_message), what);
}

EngineErrorKind error_kind_for_status(int status) {
    if (status == 404) return EngineErrorKind::NotFound;
    if (status == 409) return EngineErrorKind::Conflict;
    if (status >= 400 && status < 500) return EngineErrorKind::BadRequest;
    if (status >= 500) return EngineErrorKind::Server;
    return EngineErrorKind::Protocol;
}

}  // namespace reaper
