// The interface to the Docker Engine that the library's sessions are given (and that tools
// and benchmarks drive), plus the data types its calls exchange. `Client` (client.hpp) is
// the real implementation over HTTP; tests substitute a scripted fake
// (tests/support/fake_engine.hpp) to inject faults. reaperd depends on a narrower port of
// its own (daemon/engine_port.hpp); importing an image is the concrete Client's alone.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <ostream>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace reaper {

// ---- errors ---------------------------------------------------------------------------
// Every failure of an engine call is an EngineError of one of the kinds below. `status()` is
// the HTTP status (0 when no response was read) and `engine_message()` is the engine's own
// text (its JSON "message"), kept verbatim so callers can match and log it.
enum class EngineErrorKind {
    NotFound,      // 404
    Conflict,      // 409: e.g. deleting a running container, removal already in progress
    BadRequest,    // other 4xx
    Server,        // 5xx
    Unreachable,   // could not connect, or the connection broke (engine gone or restarting)
    Timeout,       // no answer within the request timeout
    Protocol,      // the engine answered something we cannot parse
    Closed,        // the client was closed (or the call was cancelled)
    Unsupported,   // client and engine share no API version (or the engine refused ours)
};

const char* to_string(EngineErrorKind kind);
std::ostream& operator<<(std::ostream& out, EngineErrorKind kind);

class EngineError : public std::runtime_error {
public:
    EngineError(EngineErrorKind kind, int status, std::string engine_message, const std::string& what);
    EngineErrorKind kind() const noexcept { return kind_; }
    int status() const noexcept { return status_; }
    const std::string& engine_message() const noexcept { return engine_message_; }

private:
    EngineErrorKind kind_;
    int status_;
    std::string engine_message_;
};

// Typed subclasses so callers can `catch (const NotFound&)`.
#define REAPER_ENGINE_ERROR(Name, Kind)                                                      \
    class Name : public EngineError {                                                        \
    public:                                                                                  \
        Name(int status, std::string engine_message, const std::string& what)                \
            : EngineError(EngineErrorKind::Kind, status, std::move(engine_message), what) {} \
    };
REAPER_ENGINE_ERROR(NotFound, NotFound)
REAPER_ENGINE_ERROR(Conflict, Conflict)
REAPER_ENGINE_ERROR(BadRequest, BadRequest)
REAPER_ENGINE_ERROR(ServerError, Server)
REAPER_ENGINE_ERROR(Unreachable, Unreachable)
REAPER_ENGINE_ERROR(Timeout, Timeout)
REAPER_ENGINE_ERROR(ProtocolError, Protocol)
REAPER_ENGINE_ERROR(ClientClosed, Closed)
REAPER_ENGINE_ERROR(UnsupportedVersion, Unsupported)
#undef REAPER_ENGINE_ERROR

// A delete refused because the engine is removing the container already (Docker's 409
// "removal of container <id> is already in progress"): the container goes away without
// another call, so a caller looks again rather than retrying. A Conflict (kind() is
// Conflict), so `catch (const Conflict&)` sites see it as before.
class RemovalInProgress : public Conflict {
public:
    using Conflict::Conflict;
};

// Throws the typed subclass matching `kind` and, for a Conflict, the engine's message: the
// one place that reads the engine's wording for a refusal (RemovalInProgress).
[[noreturn]] void throw_engine_error(EngineErrorKind kind, int status, std::string engine_message,
                                     const std::string& what);

// Maps an HTTP status to its error kind (404 NotFound, 409 Conflict, other 4xx BadRequest,
// 5xx Server); statuses below 400 have no kind and yield Protocol.
EngineErrorKind error_kind_for_status(int status);

// ---- data -----------------------------------------------------------------------------
using Labels = std::map<std::string, std::string>;
// Filters as the engine takes them: {"label": ["a=b", "c"], "status": ["running"]}.
using Filters = std::map<std::string, std::vector<std::string>>;

struct VersionInfo {
    std::string version;          // engine version, e.g. "20.10.24"
    std::string api_version;      // the highest API version the engine speaks
    std::string min_api_version;  // the lowest
    std::string os;
    std::string arch;
};

struct EngineInfo {  // GET /info: only what reaperd uses
    std::string docker_root_dir;  // "DockerRootDir": where the json-file and local logs live
};

// A container's life-cycle status, typed from the engine's word for it (State.Status of an
// inspect, State of a list row) so that callers never compare the engine's strings. Docker's
// seven words, which Podman's compat API uses too; any other (Podman's own "stopped",
// "stopping") is `unknown`.
enum class ContainerStatus { unknown, created, running, paused, restarting, removing, exited, dead };
ContainerStatus parse_container_status(std::string_view engine_word) noexcept;
const char* to_string(ContainerStatus status) noexcept;  // the engine's word; "unknown"

struct ContainerSummary {  // one row of GET /containers/json
    std::string id;
    std::vector<std::string> names;  // without the leading '/'
    std::string image;
    Labels labels;
    std::string state;   // the engine's word: "created", "running", "exited", "removing", ...
    std::string status;  // human text, e.g. "Up 3 seconds"
    std::int64_t created_unix_s = 0;

    ContainerStatus phase() const noexcept { return parse_container_status(state); }
};

struct ContainerState {
    std::string status;  // the engine's word, as in ContainerSummary::state (kept for messages)
    bool running = false;
    bool paused = false;
    bool restarting = false;
    bool dead = false;
    int pid = 0;
    int exit_code = 0;
    std::string error;
    std::string health_status;  // "", "starting", "healthy", "unhealthy"
    std::string started_at;     // RFC 3339
    std::string finished_at;

    ContainerStatus phase() const noexcept { return parse_container_status(status); }
    // The engine is removing it already: a delete would be refused (RemovalInProgress).
    bool removing() const noexcept { return phase() == ContainerStatus::removing; }
};

struct ContainerInfo {  // GET /containers/{id}/json, the fields we use
    std::string id;
    std::string name;  // without the leading '/'
    std::string image;
    std::string created;  // RFC 3339
    Labels labels;
    ContainerState state;
    std::string log_path;    // empty for drivers that write no json file
    std::string log_driver;  // HostConfig.LogConfig.Type
    std::map<std::string, std::string> log_options;
    bool auto_remove = false;
    bool has_healthcheck = false;
};

struct LogConfig {
    std::string type;  // "" = engine default
    std::map<std::string, std::string> options;  // e.g. max-size=10m, max-file=2
};

struct ContainerSpec {  // POST /containers/create
    std::string name;   // "" lets the engine choose
    std::string image;
    std::vector<std::string> cmd;
    std::vector<std::string> entrypoint;
    std::vector<std::string> env;  // "KEY=value"
    Labels labels;
    std::string network_mode = "none";
    LogConfig log_config;
    bool auto_remove = false;
    std::int64_t memory_bytes = 0;  // 0 = unlimited
    std::int64_t nano_cpus = 0;     // 0 = unlimited
    std::int64_t pids_limit = 0;    // 0 = unlimited
    // Health check: a command run by the engine (CMD form); empty = the image's.
    std::vector<std::string> healthcheck_cmd;
    std::chrono::milliseconds healthcheck_interval{0};
};

struct ListOptions {
    bool all = false;  // include stopped containers
    Filters filters;
};

struct RemoveOptions {
    bool force = false;    // kill a running container first
    bool volumes = false;  // remove its anonymous volumes
};

struct NetworkInfo {  // a row of GET /networks, or GET /networks/{id}
    std::string id;       // the full id (64 hex digits)
    std::string name;
    std::string driver;   // "bridge", "host", "null", "overlay", ...
    std::string created;  // RFC 3339
    Labels labels;
    // The ids of the containers attached to it: from an inspect only (the engine's list
    // leaves them out).
    std::vector<std::string> containers;
};

struct VolumeInfo {  // a row of GET /volumes, or GET /volumes/{name}
    std::string name;     // a volume's only id: the engine resolves nothing else
    std::string driver;
    std::string created;  // "CreatedAt", RFC 3339
    Labels labels;
};

struct Event {  // one line of GET /events
    std::string type;    // "container", "image", "network", ...
    std::string action;  // "create", "start", "die", "destroy", "health_status: healthy", ...
    std::string id;      // Actor.ID
    std::map<std::string, std::string> attributes;  // Actor.Attributes (labels, name, image...)
    std::int64_t time_nano = 0;
};

struct EventsOptions {
    Filters filters;                    // e.g. {"type": ["container"]}
    std::optional<std::int64_t> since;  // unix seconds; the engine replays at most 256
    std::optional<std::int64_t> until;  // unix seconds; the stream ends there
};

// A live events stream. next() blocks until the next event; it returns nullopt when the
// stream ended normally (cancel() was called, or `until` passed), and throws EngineError when
// the engine went away or sent garbage. cancel() may be called from any thread; a blocked
// next() returns within milliseconds.
class EventStream {
public:
    virtual ~EventStream() = default;
    virtual std::optional<Event> next() = 0;
    virtual void cancel() noexcept = 0;
};

// ---- the interface --------------------------------------------------------------------
// All calls throw EngineError on failure. Implementations are safe to call from several
// threads at once. close() is idempotent and never throws; after it every call throws
// ClientClosed and every open event stream ends.
class Engine {
public:
    virtual ~Engine() = default;

    // What a Session needs, and nothing more: reaperd makes its own calls through its port
    // (daemon/engine_port.hpp), and everything else (ping, version, events, stop, wait,
    // networks, volumes, images) is on the concrete Client.
    virtual std::vector<ContainerSummary> list_containers(const ListOptions& options) = 0;
    virtual ContainerInfo inspect(const std::string& id) = 0;
    // Returns the new container's id.
    virtual std::string create(const ContainerSpec& spec) = 0;
    virtual void start(const std::string& id) = 0;
    virtual void kill(const std::string& id, const std::string& signal = "SIGKILL") = 0;
    virtual void remove(const std::string& id, const RemoveOptions& options) = 0;
    // Runs `cmd` inside a running container and returns its exit code (readiness probes).
    virtual int exec(const std::string& id, const std::vector<std::string>& cmd,
                     std::chrono::milliseconds timeout) = 0;

    virtual void close() noexcept = 0;
};

}  // namespace reaper
