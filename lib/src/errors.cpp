#include <reaper/engine.hpp>

namespace reaper {

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
        case EngineErrorKind::Conflict: throw Conflict(status, std::move(engine_message), what);
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
