// A Session: one engine client of its own plus the container it opened, cleaned up whatever
// happens.
//
//   reaper::Session session;                    // acquires nothing yet
//   session.create(spec);                        // or create_from_template(...), attach(...)
//   session.engine().exec(session.container_id(), {"echo", "hi"}, 5s);
//   session.close();                             // or let the destructor do it
//
// Guarantees:
// - Opening acquires the engine client from the factory, then starts keeping a reaperd
//   lease for the session id (see "reaperd lease" below), then creates/attaches and waits
//   until the container is ready. If any step after acquiring the client fails, the open
//   cleans up before the exception leaves: a container this open created is force-removed
//   (or, failing that, reported to reaperd as an orphan and logged), an attached container
//   is never touched, the lease is released, the client is closed exactly once, and the
//   object holds no client and no container. The ORIGINAL exception is rethrown unchanged
//   (same type and message); a cleanup failure never replaces it: it is logged through
//   SessionOptions::log (with the exception in LogRecord::error) and kept in
//   last_cleanup_error().
// - A failed open removes only what that open made: the container whose id its create
//   returned or, when the create returned none (its answer may have been lost: a timeout, a
//   broken connection), the container carrying this open's marker label (open_marker_label =
//   128 random bits in hex, set on create), if there is one. Never anything found by the
//   session label alone: several Sessions may share a session id (tools under one
//   `reaperctl run S` all get it as $REAPERD_SESSION).
// - close() and the destructor never throw and are idempotent. With delete-on-exit (default
//   for a created container, off for an attached one) the container is removed; if the engine
//   refuses (409, 5xx, ...), it is killed and force-removed, retried until
//   SessionOptions::teardown_budget is spent; if it is still there, it is reported to reaperd
//   as an orphan (when reachable) and logged. Then the lease is released and the client
//   closed, always, whatever happened before.
// - Every container a Session creates carries the session label (SessionOptions::label_key =
//   session id) from its creation on, so reaperd can find it even if this process dies while
//   opening; and, with the json-file or local driver and no max-size or max-file of the spec's
//   own, Docker's own rotation within reaperd's cap (SessionOptions::rotate_logs; the rule is
//   reaper/log_rotation.hpp's), so its log never needs reaperd's cut.
// - reaperd lease: while open (use_daemon), the session keeps a lease on its id through a
//   control::LeaseKeeper, one background thread per Session: when reaperd stops or restarts
//   (SIGTERM, SIGKILL, an upgrade) it reconnects after 100 ms, then with doubling waits
//   capped at 1 s, so the lease is back within about a second of reaperd answering, inside
//   any lease_grace of 3 s or more; a Session opened while reaperd is down takes the lease
//   when reaperd appears. holds_lease() is true only while the lease's connection is open.
//   Closing stops that thread (within 50 ms, also in the middle of an attempt) and closes
//   its descriptors.
// - Sessions share nothing: many may live in the threads of one process. One Session object
//   is not meant to be used from several threads at once.
#pragma once

#include <reaper/client.hpp>
#include <reaper/engine.hpp>
#include <reaper/template.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace reaper {

namespace control {
class LeaseKeeper;
}

// The label a created container carries to tell which open made it (128 random bits in hex,
// new for every open); a failed open looks for it when its create's answer was lost. A spec's
// own value for this key is replaced.
inline constexpr const char* open_marker_label = "reaperd.open";

// ---- logging ----------------------------------------------------------------------------
enum class LogLevel { Debug, Info, Warning, Error };
const char* to_string(LogLevel level);

struct LogRecord {
    LogLevel level = LogLevel::Info;
    std::string session_id;
    std::string container_id;  // "" when none is concerned
    std::string message;
    std::exception_ptr error;  // the failure behind the record, when there is one
};

// Receives the library's log records. Called from the thread that runs the Session call, and
// from the Session's lease keeper thread when the lease is lost, failing or taken again; a
// Session makes one call at a time, so a sink used by one Session needs no lock of its own,
// but a sink shared by several Sessions must be thread-safe. Exceptions it throws are
// swallowed.
using LogSink = std::function<void(const LogRecord&)>;

// A sink writing one line per record at or above `min_level` to stderr (one write() each,
// so lines of concurrent sessions do not interleave), its text as terminal_safe (units.hpp)
// shows it. The default sink is
// stderr_log_sink(LogLevel::Warning).
LogSink stderr_log_sink(LogLevel min_level = LogLevel::Warning);

// ---- options ----------------------------------------------------------------------------
using EngineFactory = std::function<std::unique_ptr<Engine>()>;

// A factory making a fresh reaper::Client with `options` on every call.
EngineFactory client_factory(ClientOptions options);

struct SessionOptions {
    // "" = a fresh random id ("s-" + 16 hex digits). Must pass control::validate_session_id.
    std::string session_id;
    // Makes the session's own engine client; empty = client_factory() with the docker CLI's
    // environment (ClientOptions::from_environment(): DOCKER_HOST, DOCKER_API_VERSION,
    // DOCKER_TLS_VERIFY, DOCKER_CERT_PATH).
    EngineFactory engine_factory;

    // Label put on every created container: label_key=<session id>.
    std::string label_key = "reaperd.session";
    // The driver of created containers whose spec names none.
    std::string log_driver = "json-file";
    // Docker's own rotation for created containers whose driver is json-file or local and
    // whose spec sets neither max-size nor max-file (a spec that sets either keeps all its
    // options as given): max-size = half the cap, max-file = 2 (log_rotation_options()).
    bool rotate_logs = true;
    // The cap the rotation keeps within. Unset: what reaperd said in the reply to the lease
    // held when the container is created (its logs.max_size; 0, caps off, sets no rotation),
    // else default_log_cap_bytes (reaperd's default) when there is no lease or the daemon is
    // older than that reply field. A spec's reaperd.log-max-size label wins over both, as it
    // does in reaperd.
    std::optional<std::uint64_t> log_cap_bytes;

    // Talk to reaperd: keep a lease from open to close, report orphans at teardown. An
    // unreachable daemon is not an error (logged at Info); the lease is taken when it answers.
    bool use_daemon = true;
    std::string control_socket;  // "" = control::socket_path_from_environment()
    std::chrono::milliseconds control_timeout{2000};

    // Readiness: running, healthy when the container has a health check, and
    // `readiness_probe` (if not empty) exiting 0 in it (once), all within ready_timeout.
    std::chrono::milliseconds ready_timeout{30'000};
    std::chrono::milliseconds ready_poll_interval{100};
    std::vector<std::string> readiness_probe;
    std::chrono::milliseconds probe_timeout{5'000};  // one probe run
    // Once all of the above hold, the container must still run this much later: a process
    // that dies right after starting shows "running" for a moment. 0 = ready at once.
    std::chrono::milliseconds ready_settle{300};

    // Unset: true for a created container, false for an attached one.
    std::optional<bool> delete_on_exit;
    // Total time teardown (and a failed open's cleanup) may spend removing a container.
    std::chrono::milliseconds teardown_budget{5'000};

    LogSink log = stderr_log_sink();
};

// ---- errors -----------------------------------------------------------------------------
// The container did not become ready: it stopped, turned unhealthy, or the timeout passed.
class NotReady : public std::runtime_error {
    using std::runtime_error::runtime_error;
};

// ---- teardown outcome -------------------------------------------------------------------
struct TeardownResult {
    enum class Container {
        None,      // the session had no container (never opened, or already closed)
        Removed,   // deleted (or found already gone)
        Kept,      // delete-on-exit was off
        Orphaned,  // still there after the budget; see orphan_reported
    };
    Container container = Container::None;
    std::string container_id;
    bool forced = false;           // the plain delete was refused and force was used
    bool orphan_reported = false;  // reaperd accepted the orphan report
};
const char* to_string(TeardownResult::Container outcome);

// ---- the session ------------------------------------------------------------------------
class Session {
public:
    // Holds nothing and connects nowhere until an open call. Throws std::invalid_argument for
    // a bad session id or label key, or a bad DOCKER_HOST, DOCKER_API_VERSION or TLS files
    // when no engine_factory is given.
    explicit Session(SessionOptions options = {});
    ~Session();  // close()
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;

    // Open calls. A Session opens once: a second open call (also after a failed one) throws
    // std::logic_error. On failure, see the guarantees at the top of this file.
    //
    // Creates a container from `spec` (plus the session label and log caps) and starts it.
    // Throws std::invalid_argument, before acquiring anything, if the spec already carries
    // the session label key with another value or has no image.
    void create(const ContainerSpec& spec);
    // Like create(), from a template; its readiness probe and timeout take precedence over
    // the options'.
    void create_from_template(const SessionTemplate& tmpl);
    // Looks `name` up first (std::out_of_range when unknown, before acquiring anything).
    void create_from_template(const TemplateLibrary& templates, const std::string& name);
    // Attaches to an existing container by id or name; it must be running (and become
    // ready). Never deleted unless delete_on_exit is set to true.
    void attach(const std::string& id_or_name);

    // Tears down as described above. Never throws; later calls return the first result.
    TeardownResult close() noexcept;

    const std::string& id() const noexcept { return session_id_; }
    bool is_open() const noexcept { return engine_ != nullptr; }
    // The container's full id; "" when not open.
    const std::string& container_id() const noexcept { return container_id_; }
    bool created_container() const noexcept { return created_; }
    // The session's own client. Throws std::logic_error when not open.
    Engine& engine();
    // True while this session's reaperd lease is held and its connection open, checked at
    // the call: false before open, while reaperd is away, and after close.
    bool holds_lease() const;

    bool delete_on_exit() const noexcept { return delete_on_exit_; }
    void set_delete_on_exit(bool value) noexcept { delete_on_exit_ = value; }

    // The last failure during a failed open's cleanup or a teardown (null when none).
    std::exception_ptr last_cleanup_error() const noexcept { return last_cleanup_error_; }
    // The result of close(), once it ran.
    const std::optional<TeardownResult>& teardown_result() const noexcept { return teardown_; }

private:
    enum class Phase { Fresh, Open, Closed };

    // Acquires the client, then runs `steps`; on any failure cleans up and rethrows.
    void open_with(const std::function<void()>& steps);
    void open_created(const ContainerSpec& spec, const std::vector<std::string>& probe,
                      std::chrono::milliseconds ready_timeout);
    void acquire_lease();
    // The log options `spec` gets: its own, or Docker's rotation within the cap (see
    // SessionOptions::rotate_logs).
    void add_log_rotation(ContainerSpec& spec) const;
    void wait_ready(const std::vector<std::string>& probe, std::chrono::milliseconds timeout);
    void cleanup_failed_open() noexcept;
    void remove_container(TeardownResult& result, bool force_first) noexcept;
    void remove_after_failed_create(TeardownResult& result) noexcept;
    void report_orphan(TeardownResult& result) noexcept;
    void release_lease_and_client() noexcept;
    void log(LogLevel level, std::string message, std::exception_ptr error = nullptr) const noexcept;
    // The one door to the sink, for both threads.
    void emit(LogRecord record) const noexcept;

    SessionOptions options_;
    std::string session_id_;
    Phase phase_ = Phase::Fresh;
    std::unique_ptr<Engine> engine_;
    std::unique_ptr<control::LeaseKeeper> lease_keeper_;
    mutable std::mutex log_mutex_;  // one sink call at a time (the keeper thread logs too)
    std::string open_marker_;       // this open's open_marker_label value
    std::string container_id_;
    bool created_ = false;
    bool delete_on_exit_ = true;
    std::exception_ptr last_cleanup_error_;
    std::optional<TeardownResult> teardown_;
};

// A random session id: "s-" followed by 16 hex digits.
std::string make_session_id();

}  // namespace reaper
