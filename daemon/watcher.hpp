// The engine watcher: one thread that lists every container, network and volume, then
// follows the engine's events for them, and starts over (re-list, reconcile) after any
// stream drop, engine restart, or when asked to resync. Events alone are never trusted for completeness: the
// engine replays only its last 256. It never gives up while the engine is down; it reports
// what it sees to a sink (the main loop's queue) and decides nothing. An engine outside the
// client's API versions is reported as such (not as down), and asked again with the same
// backoff: it may be upgraded or downgraded while reaperd runs.
//
// Nothing is inspected on the event path: a container is reported from its create event's
// attributes (its labels, name and image) or its row in the list, which is all ownership
// and the registry need. Under a burst the engine answers the inspect of a starting
// container only once the start is done, and inspecting before reading the next event made
// a container created under an ended session wait p50 3.3 s, p99 10 s for its reap under
// scripts/load.sh. What only an inspect gives (the log path, driver and options, for the log
// capper) is fetched when the loop asks (want_log_info), on a few threads of its own.
#pragma once

#include "engine_port.hpp"
#include "guard.hpp"  // ObjectRef

#include <reaper/engine.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <variant>
#include <vector>

namespace reaperd {

namespace watch {
struct EngineUp {};                 // a list succeeded after start-up or a loss
struct EngineDown {                 // the engine stopped answering or the stream broke
    std::string error;
};
struct EngineUnsupported {          // the engine answers, but shares no API version with us
    std::string error;
};
// A container not seen before, from its create (or start) event's attributes or its list row:
// id, name, image, labels, created, state.status. Or, with log_info, the answer to
// want_log_info(): a fresh inspect, log_path, log_driver and log_options included, sent only
// while the container is known (never after its Gone).
struct Appeared {
    reaper::ContainerInfo info;
    std::string docker_root_dir;    // the engine's data root, "" if it would not say
    bool log_info = false;
};
struct Gone {                       // a container the engine no longer has
    std::string id;
};
struct Listed {                     // a full list finished: exactly these ids exist now
    std::set<std::string> ids;
};
struct Object {                     // a network or volume, with its labels
    ObjectRef ref;
    std::string name;
    reaper::Labels labels;
};
struct ObjectAppeared {             // a network or volume just created (inspected)
    Object object;
};
struct ObjectGone {                 // a network or volume the engine no longer has
    ObjectRef ref;
};
struct ObjectsListed {              // a full list of networks or volumes: exactly these exist
    ObjectKind kind;                // (sent after the containers' Listed of the same pass)
    std::vector<Object> objects;
};
}  // namespace watch
using WatchEvent =
    std::variant<watch::EngineUp, watch::EngineDown, watch::EngineUnsupported, watch::Appeared, watch::Gone,
                 watch::Listed, watch::ObjectAppeared, watch::ObjectGone, watch::ObjectsListed>;

struct WatcherOptions {
    std::chrono::milliseconds retry_initial{1000};
    std::chrono::milliseconds retry_max{60000};
    // How long after each connection's first list the containers are listed once more (see
    // catch_up_at_); 0 = never.
    std::chrono::milliseconds catch_up_after{100};
};

class Watcher {
public:
    using Sink = std::function<void(WatchEvent)>;

    Watcher(EnginePort& engine, WatcherOptions options, Sink sink);
    ~Watcher();  // stop()
    Watcher(const Watcher&) = delete;
    Watcher& operator=(const Watcher&) = delete;

    void start();
    // Ends the current events stream so the watcher re-lists and reconciles now; while it
    // waits out its backoff after a failure, it tries again now.
    void resync();
    void set_options(WatcherOptions options);
    // Cancels the stream and joins the threads. Idempotent. Log-info lookups not started are
    // dropped; a list or inspect in flight finishes first (close the engine to cut it short,
    // as the daemon does: otherwise it lasts at most the client's timeout).
    void stop();
    // Asks for `id`'s log info: an inspect on a lookup thread, answered by an Appeared with
    // log_info set, and asked again by itself at each start event of the container (the
    // engine sets LogPath only then) and after a lookup failed, at the next list. Lookups of
    // one container run one at a time, in order, so an older answer never follows a newer
    // one; a container's answer is sent only while it is known, so never after its Gone.
    // Thread-safe; ignored for a container not known (gone already, or never seen).
    void want_log_info(const std::string& id);

    // Engine's own keys in a container event's attributes, besides the labels: Docker's
    // "name" and "image"; Podman's compat API (4.x) adds "containerExitCode" and "podId". A label
    // with one of these names is not told apart from them (its value is the engine's); the
    // session labels are reaperd's own keys (sessions.labels), so ownership is unaffected.
    static bool is_engine_attribute(const std::string& key);
    // What an event (create or start) says of its container, or nullopt when its attributes
    // do not carry the container (no "name": an engine that sends none).
    static std::optional<reaper::ContainerInfo> from_event(const reaper::Event& event);
    static reaper::ContainerInfo from_summary(const reaper::ContainerSummary& summary);

    // Lookup threads. Each waits on an inspect; the inspect of a starting container is
    // answered only when its start is done (dockerd took up to 12 s from a create to its
    // start in watcher_burst_engine_test's burst at load ~13), so one thread would serialise
    // a burst's starts again. Four keep a burst moving while the engine's API, shared with
    // the reaper pool and the sessions' own calls, gets at most four more requests at once.
    static constexpr unsigned lookup_threads = 4;

private:
    // A container's log-info lookups (guarded by mutex_): at most one queued and one running.
    struct Lookup {
        bool queued = false;
        bool running = false;
        bool again = false;  // asked while running: queue once more when it ends
    };
    struct Known {
        bool wants_log_info = false;  // want_log_info() was called
        bool lookup_failed = false;   // its last lookup met an engine error: ask at the next list
    };

    void run();
    void run_lookups();
    void queue_lookup_locked(const std::string& id);
    // Reports a container new to the watcher (nothing if it is known already).
    void appeared(reaper::ContainerInfo info);
    void appeared_locked(reaper::ContainerInfo info);  // mutex_ held
    void gone(const std::string& id);
    void container_event(const reaper::Event& event);
    void list_and_reconcile();
    // The catch-up list (catch_up_at_): reports the containers not known yet, and nothing
    // else; an engine error leaves it to the stream and the next list.
    void catch_up();
    void list_objects();
    void object_event(const reaper::Event& event);
    bool sleep_for(std::chrono::milliseconds delay);  // false when stopping

    EnginePort& engine_;
    Sink sink_;
    std::mutex mutex_;
    std::condition_variable wake_;
    WatcherOptions options_;
    bool stopping_ = false;
    bool resync_requested_ = false;
    reaper::EventStream* stream_ = nullptr;  // guarded by mutex_, for cancel()
    // Guarded by mutex_, as is every sink_ call that reports a container (Appeared, Gone,
    // Listed), so a lookup's answer and the container's Gone reach the sink in the order
    // the watcher decided them.
    std::map<std::string, Known> known_;     // ids reported as Appeared and not Gone
    std::map<std::string, Lookup> lookups_;
    std::deque<std::string> lookup_queue_;
    std::condition_variable lookup_ready_;
    // The engine's data root, from GET /info asked at each list on a lookup thread rather
    // than before the list: Podman answers /info in ~1.7 s, and a container created during
    // reaperd's start-up was known (and its log capped) only after it, 356 MB into a `yes`
    // log under a 10 MiB cap (issue 21). Only the local driver needs it: a lookup that found
    // one waits for the pass's answer (root_pending_), the others go on at once.
    std::string docker_root_dir_;
    bool root_wanted_ = false;   // a lookup thread is to ask /info
    bool root_pending_ = false;  // asked and not answered yet
    std::condition_variable root_known_;
    // When a lookup thread lists the containers once more (guarded by mutex_). A container
    // created while the first list of a connection was being answered is in neither that
    // list nor, on an engine whose events lag, the stream for a while: Podman 4.3's file
    // events backend delivered such a create ~250 ms late, while conmon wrote its `yes` log at
    // ~470 MB/s; a reaperd starting beside it first cut that log at 43-65 MB under a 10 MiB cap,
    // where one created later was cut at 10-15 MB (issue 21 point 6).
    std::optional<std::chrono::steady_clock::time_point> catch_up_at_;
    bool catching_up_ = false;                        // its list is out
    std::set<std::string> gone_during_catch_up_;      // removals the stream told meanwhile
    std::thread thread_;
    std::vector<std::thread> lookup_threads_;
};

}  // namespace reaperd
