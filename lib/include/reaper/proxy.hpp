// An engine proxy that makes one session own everything an unmodified tool creates
// (`reaperctl run --own S -- TOOL`).
//
// The proxy serves a private unix socket for the tool (its DOCKER_HOST) and passes every
// request through to the real engine unchanged, except
//   POST [/vX.Y]/containers/create, /networks/create, /volumes/create
// whose JSON body gets label_key=session added to its top-level "Labels", and a container
// create whose log driver rotates (json-file or local: the body's HostConfig.LogConfig.Type, or
// the engine's default from GET /info) and whose log options set neither max-size nor max-file
// also gets Docker's own rotation within reaperd's cap (ProxyOptions::log_rotation_cap;
// reaper/log_rotation.hpp), on Docker only: Podman (an engine whose answers carry
// Libpod-Api-Version) maps json-file to its k8s-file, where max-size makes conmon truncate the
// file to nothing and max-file does not exist, which keeps less than reaperd's cut. A body whose labels
// already give label_key another value, a body that is not a JSON object, and one over
// max_body_bytes are answered 400 {"message":"..."} as the engine words its errors, logged,
// and never sent on; the same value is fine. Everything else, reads included, goes through
// byte for byte.
//
// Framing: HTTP/1.1 with keep-alive, one engine connection per tool connection (so the
// engine sees the tool's connections as they are: a hijacked attach, a Connection: close).
// Request bodies with Content-Length or chunked; responses are relayed as they arrive, so
// events, `logs -f`, wait and stats stream; only the create bodies being rewritten are read
// whole. A 101 answer (attach, exec start, `docker run -it`, BuildKit's /session) and a body
// delimited by the engine closing (the raw-stream answer to an attach without Upgrade) switch
// the connection to a raw two-way copy; an end of input on one side is passed on to the
// other with shutdown(SHUT_WR), so `docker run -i` with piped stdin sees its EOF.
//
// Threads: one accepting thread, and two per tool connection (tool->engine and
// engine->tool); all of them block every signal, so process-directed signals reach the
// application's threads (reaperctl waits for them with a signalfd). Every descriptor is
// close-on-exec, so the tool inherits none.
#pragma once

#include <reaper/client.hpp>
#include <reaper/session.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace reaper {

struct ProxyOptions {
    EngineAddress upstream;     // the real engine (unix, or tcp without TLS)
    std::string listen_path;    // the socket to create; its directory must exist
    std::string session;        // the label's value (control::validate_session_id rules)
    std::string label_key = "reaperd.session";
    // Create bodies are read whole to add the label; a larger one is refused. The engine's
    // own create bodies are a few KiB (docker run with 100 env vars: ~6 KiB).
    std::size_t max_body_bytes = 16 * 1024 * 1024;
    // Refusals at Warning, each labelled object at Info (with its id), a connection that a
    // peer broke at Debug, anything else that ends one at Warning. Called from the proxy's
    // threads, several at a time: it must be thread-safe.
    LogSink log = stderr_log_sink();
    // Called after each create the proxy labelled and the engine accepted (stats() already
    // counts it), from the proxy's threads, several at a time: it must be thread-safe and
    // quick; what it throws is ignored. reaperctl hands stats() to its lease keeper, which
    // tells reaperd (control::LeaseKeeperOptions::proxy).
    std::function<void()> on_labelled;
    // The cap within which a container create gets Docker's own log rotation (see the top of
    // this file); 0 = none. Called at each container create, from the proxy's threads, several
    // at a time: it must be thread-safe and quick. Empty = no rotation. reaperctl answers from
    // its lease's reply (reaperd's logs.max_size and logs.rotate_at_create), with
    // default_log_cap_bytes before any reply or from a reaperd older than those fields.
    std::function<std::uint64_t()> log_rotation_cap;
};

// Counters since start(); read at any time from any thread.
struct ProxyStats {
    std::uint64_t containers = 0;  // creates labelled and answered 2xx by the engine
    std::uint64_t networks = 0;
    std::uint64_t volumes = 0;
    std::uint64_t rotated = 0;      // of those containers, the ones given log rotation
    std::uint64_t refused = 0;      // requests answered 400 by the proxy itself
    std::uint64_t connections = 0;  // tool connections accepted
    std::uint64_t open_connections = 0;
    std::uint64_t labelled() const noexcept { return containers + networks + volumes; }
};

class EngineProxy {
public:
    // Binds nothing yet. Throws std::invalid_argument for an empty listen path, session or
    // label key.
    explicit EngineProxy(ProxyOptions options);
    ~EngineProxy();  // stop()
    EngineProxy(const EngineProxy&) = delete;
    EngineProxy& operator=(const EngineProxy&) = delete;

    // Creates the socket (mode 0600; an existing file at the path is an error) and starts
    // accepting. The engine is not contacted until the first request, which gets a 502
    // {"message":...} if it cannot be reached. Throws std::system_error; std::logic_error
    // when called twice.
    void start();
    // Ends every connection (both sides are shut down, so blocked reads and writes return),
    // joins every thread, closes every descriptor and removes the socket file. Returns within
    // milliseconds whatever the connections are doing. Idempotent, never throws.
    void stop() noexcept;

    ProxyStats stats() const;
    const ProxyOptions& options() const noexcept;

    class Impl;

private:
    std::unique_ptr<Impl> impl_;
};

// ---- the pieces, public for their unit tests --------------------------------------------

enum class CreateKind { None, Container, Network, Volume };
const char* to_string(CreateKind kind);

// Which create, if any, a request is: POST to the path (query ignored, percent-escapes
// decoded, an optional /vX.Y prefix as the engine's router accepts it).
CreateKind create_kind(std::string_view method, std::string_view target);

// A create body the proxy will not pass on; what() is the message for the tool.
class LabelRefused : public std::runtime_error {
    using std::runtime_error::runtime_error;
};

// `body` with key=value added to its top-level Labels; the rest of the text is kept byte for
// byte (numbers, key order, unknown fields). The engine's JSON decoder matches field names
// case-insensitively ("labels" is Labels too), so this does; more than one such member is
// refused as ambiguous. An empty body becomes {"Labels":{key:value}} (newer engines create
// with defaults from an empty body). Throws LabelRefused when the body is not a JSON object,
// its Labels is not an object or null, or it already gives `key` another value.
std::string add_label(std::string_view body, std::string_view key, std::string_view value);

// `body` (a JSON object: what add_label returned) with max-size and max-file added to
// HostConfig.LogConfig.Config (rotation_options(cap), cap from log_cap_for(the body's Labels,
// cap_bytes)), when its log driver rotates: LogConfig.Type, or `default_driver` when that is
// absent, null or "". nullopt (the body stays as it is) when the driver does not rotate or is
// unknown (default_driver ""), the options set max-size or max-file, the cap is 0, or the
// fields are not where the engine would read them (not objects, or named twice: Go's decoder
// matches field names case-insensitively). The rest of the text is kept byte for byte.
std::optional<std::string> add_log_rotation(std::string_view body, std::string_view default_driver,
                                            std::uint64_t cap_bytes);

}  // namespace reaper
