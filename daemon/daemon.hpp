// The daemon: one main loop that owns the registry and the persisted state. Every other
// thread (control server, engine watcher, reaper workers, signal thread) only posts
// messages to the loop's queue; the loop is the only one to read the clock
// (DaemonOptions::clock), asks the pure policy (policy.hpp) what to do, and does it. Every
// message and every turn gets the `now` the loop read once for its batch.
//
// status_json() returns this object (stable; reaperctl formats it):
//   {"engine": "up"|"slow"|"down"|"starting"|"unsupported", "engine_error": "..." (down and
//    unsupported only), "ready": bool, "dry_run": bool,
//    "engine_pace": {"limit": n (removal attempts allowed in flight now), "max": n
//                    (reaper.concurrency), "in_flight": n, "timeouts": n (within the last
//                    10 s), "timeouts_total": n, "latency_ms": n (smoothed),
//                    "latency_max_ms": n (the slowest answer within the last 10 s),
//                    "slow_since": RFC 3339 or null},
//    "sessions": [{"id", "state": "leased"|"grace"|"ended"|"unclaimed", "leases": n,
//                  "containers": n, "networks": n, "volumes": n,
//                  "deadline": RFC 3339 or null, "deadline_in_ms": n or null,
//                  "end_reason": "..." (ended only), "proxy": bool (a lease of it came with a
//                  labelling proxy), "containers_labelled", "networks_labelled",
//                  "volumes_labelled": n (what its proxies labelled; proxy only)}],
//    "ended_sessions": n (every tombstone), "ended_listed": n (how many "sessions" shows),
//    "tracked_containers": n, "pending_reaps": n,
//    "pending_listed": n (how many "pending" shows),
//    "pending": [{"container", "name", "session", "reason", "failures", "in_flight"}],
//    "tracked_networks": n, "tracked_volumes": n,     (session-owned)
//    "pending_network_reaps": n, "pending_volume_reaps": n,
//    "pending_objects_listed": n (how many "pending_objects" shows),
//    "pending_objects": [{"kind": "network"|"volume", "id", "name", "session", "failures",
//                         "in_flight"}],
//    "counters": {"reaps_done", "reaps_failed", "engine_reconnects", "log_bytes_dropped",
//                 "log_unopenable" (logs in scope it cannot open now),
//                 "log_cut_fallbacks" (log cuts that truncated instead of punching),
//                 "networks_reaped", "volumes_reaped",
//                 "actions": {"<kind>": n},
//                 "guard": {"<outcome>": n}}}   (guard.hpp: what the door made of each call)
// "sessions" lists every live session, then the newest ended ones (StatusQuery::limit, by
// default reaper::control::status_default_newest_ended); with StatusQuery::ended, only ended
// sessions, newest first (by default status_default_ended_limit of them); with
// StatusQuery::pending, no session.
// "pending" lists the reaps queued longest ago first, "pending_objects" the removals next to
// be attempted first: status_default_pending_listed of each, or with StatusQuery::pending up
// to its limit (by default status_default_pending_limit).
// "slow": the engine answers the watcher, but a removal attempt timed out or answered slowly
// within the last 10 s, or one has been in flight that long (reaper.hpp RemovalPace).
// A session's deadline: grace -> when it ends; ended -> when its tombstone expires;
// unclaimed -> when unclaimed_grace ends it (if set); leased -> null.
#pragma once

#include "config.hpp"
#include "control_server.hpp"
#include "engine_port.hpp"
#include "guard.hpp"
#include "metrics.hpp"
#include "metrics_http.hpp"
#include "policy.hpp"
#include "reaper.hpp"
#include "registry.hpp"
#include "state.hpp"
#include "watcher.hpp"

#include <reaper/engine.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>

namespace reaperd {

class LogCapper;

struct DaemonOptions {
    std::string config_path;      // re-read on SIGHUP; "" = reload keeps the config
    Config config_defaults;       // what config_path's missing keys mean (load_config)
    std::string engine_address;   // for log records
    bool handle_signals = true;   // SIGTERM/SIGINT stop, SIGHUP reloads
    bool control_server = true;   // serve config.control.socket (and metrics.listen, if set)
    bool log_caps = true;         // run the log capper (logcap/logcap.hpp)
    // How long a stop waits for removals in flight before saving state and exiting (real
    // time, whatever `clock` says).
    std::chrono::milliseconds stop_timeout{std::chrono::seconds{20}};
    // The loop's only source of `now`: every deadline (lease grace, retries, tombstones,
    // resync) is decided against it. A test passes a clock it moves forward itself, then
    // calls Daemon::settle(), instead of sleeping through a grace. Called on the loop's
    // thread only. steady_now() never steps (registry.hpp, Clock).
    std::function<TimePoint()> clock = &steady_now;
    // The wall clock, read beside `clock` to convert at the edges (the engine's timestamps,
    // the state file, status). A test that moves `clock` moves this one with it.
    std::function<TimePoint()> wall_clock = &Clock::now;
};

class Daemon final : public ControlHandler {
public:
    // `engine` must outlive the daemon; run() closes it when it returns.
    Daemon(Config config, EnginePort& engine, DaemonOptions options);
    ~Daemon() override;
    Daemon(const Daemon&) = delete;
    Daemon& operator=(const Daemon&) = delete;

    // Loads the state, starts every thread and turns the loop until a stop; then finishes
    // removals in flight (bounded), saves the state and returns the exit code (0). Throws
    // std::runtime_error at start-up (state dir, control socket) for main to map.
    int run();
    void request_stop();    // thread-safe, like SIGTERM
    void request_reload();  // thread-safe, like SIGHUP

    // For tests that drive `DaemonOptions::clock`: wakes the loop and waits until it has run
    // every message posted before this call, then a turn at the clock's time after them, and
    // was left with nothing queued and no removal in flight (the reaper pool's results come
    // back as messages, so they are in). Returns false if that did not happen within `limit`
    // (real time), e.g. the loop is not running or the engine keeps a removal busy.
    // Thread-safe; changes nothing the loop would not have done on its own wake-up.
    bool settle(std::chrono::milliseconds limit = std::chrono::seconds{30});

    // ControlHandler: thread-safe; each call is posted to the loop (end, session and orphan
    // wait for its answer).
    void lease_opened(const std::string& session, std::uint64_t connection_id) override;
    void lease_closed(const std::string& session, std::uint64_t connection_id) override;
    void proxy_reported(const std::string& session, std::uint64_t connection_id,
                        const ProxyReport& report) override;
    // Ends the session and queues its reaps at once, so the reply can say how many.
    reaper::control::Reply end_session(const std::string& session) override;
    // What is left of the session: its containers (known or pending a reap), networks and
    // volumes; `ready` once the engine was listed, so that 0 means gone.
    reaper::control::Reply session_report(const std::string& session) override;
    // Pins the report on the calling thread (an inspect: a name or id prefix becomes the full
    // id, checked for ownership and for `session`; throws Refused naming the problem), then
    // queues the reap of that id on the loop. Every attempt acts on that id only.
    reaper::control::Reply orphan_reported(const std::string& container,
                                           const std::string& session) override;
    std::string status_json(const reaper::control::StatusQuery& query = {}) override;
    std::string metrics_text() override;
    void request_refused(const std::string& reason) override;  // counted in metrics_

private:
    using Message = std::function<void(TimePoint now)>;
    void post(Message message);
    // Runs `fn` on the loop and waits for its answer (control replies).
    std::string ask(std::function<std::string(TimePoint)> fn);

    static PersistedState load_state_retrying(const StateStore& store, Clock::duration wall_offset);
    void start_up(TimePoint now);
    void turn(TimePoint now);
    void shut_down();
    void reload(TimePoint now);
    void signal_thread();
    void stop_signal_thread();  // idempotent

    void on_watch(const WatchEvent& event, TimePoint now);
    void on_reap_result(const ReapResult& result, TimePoint now);
    void on_object_result(const ObjectRef& object, const GuardResult& result, TimePoint now);
    // Counts one more failed removal attempt and sets when the next one is due (the
    // jittered backoff of policy.hpp retry_delay); returns the delay, for the log.
    Duration schedule_retry(unsigned& failures, TimePoint& next_attempt, TimePoint now);
    struct PinnedOrphan {
        std::string container;  // the full id
        std::string name;
        std::string session;  // its session label's value (as reported, if not inspected yet)
        bool inspected = false;  // false: a full id queued while the engine did not answer
    };
    PinnedOrphan pin_orphan(const std::string& reference, const std::string& session);
    void queue_orphan(const PinnedOrphan& orphan, TimePoint now);
    void container_appeared(const watch::Appeared& appeared, TimePoint now);
    void container_gone(const std::string& id);
    void apply_decisions(TimePoint now);
    // Submits due attempts, oldest due first, while the pace allows one more in flight.
    void submit_attempts(const Decision& d, TimePoint now);
    // Feeds an attempt's end to the pace; an answer after a silence starts the catch-up.
    void pace_result(const ReapResult& result, TimePoint now);
    // The engine answers again after it answered nothing: relist now (not at the next
    // resync) and bring forward retries that backed off meanwhile.
    void catch_up(TimePoint now);
    // Logs (and publishes) a change of the engine's pace.
    void note_pace(TimePoint now);
    void save_state_if_dirty();
    void publish_status();

    ControlServerLimits control_limits() const;
    LeaseTerms lease_terms() const;  // what each lease reply says of the log caps
    std::string render_status(TimePoint now, const reaper::control::StatusQuery& query) const;
    // The wall clock's lead over the loop's clock, read now (registry.hpp, Clock).
    Clock::duration wall_offset() const;
    std::string render_metrics() const;
    std::map<std::string, std::uint64_t> capper_actions() const;  // log-cap actions by kind
    std::map<std::string, std::uint64_t> refusals() const;        // the door's, by reason
    std::string status_line() const;

    Config config_;
    EnginePort& engine_;
    // The one door for every stop, kill and remove (the reaper's, the capper's); the loop
    // installs config_ into it at each reload.
    Guard guard_;
    DaemonOptions options_;
    Registry registry_;
    Metrics metrics_;
    std::unique_ptr<StateStore> state_;
    std::unique_ptr<ReaperPool> pool_;
    std::unique_ptr<Watcher> watcher_;
    std::unique_ptr<ControlServer> control_;
    std::unique_ptr<LogCapper> capper_;
    std::unique_ptr<MetricsHttpServer> metrics_http_;

    // "unsupported": the engine answers but shares no API version with reaperd (pinned
    // outside its range, or too old or too new); nothing is reaped until that changes.
    enum class EngineState { starting, up, down, unsupported } engine_state_ = EngineState::starting;
    static const char* engine_state_name(EngineState state);
    std::string engine_error_;  // why the engine is down or unsupported
    bool ready_ = false;
    bool dirty_ = false;
    bool state_save_failing_ = false;
    std::string last_status_line_;
    std::size_t in_flight_ = 0;
    RemovalPace pace_;
    EnginePace last_pace_ = EnginePace::normal;  // as last logged; status shows this one
    std::optional<TimePoint> slow_since_;
    TimePoint next_resync_{};
    TimePoint next_watchdog_{};
    std::optional<std::chrono::milliseconds> watchdog_interval_;

    std::mutex queue_mutex_;
    std::condition_variable queue_cv_;
    std::deque<Message> queue_;
    bool stop_requested_ = false;  // guarded by queue_mutex_
    // For settle(), guarded by queue_mutex_: messages posted so far, and how many of them the
    // loop had run when a turn last left it idle (nothing queued, nothing in flight).
    std::uint64_t posted_ = 0;
    std::uint64_t settled_through_ = 0;
    std::condition_variable settled_cv_;
    std::atomic<bool> loop_running_{false};
    std::atomic<bool> signals_done_{false};
    std::thread signal_thread_;
    std::minstd_rand random_{std::random_device{}()};
};

}  // namespace reaperd
