// The engine watcher: one thread that lists every container, network and volume, then
// follows the engine's events for them, and starts over (re-list, reconcile) after any
// stream drop, engine restart, or when asked to resync. Events alone are never trusted for completeness: the
// engine replays only its last 256. It never gives up while the engine is down; it reports
// what it sees to a sink (the main loop's queue) and decides nothing. An engine outside the
// client's API versions is reported as such (not as down), and asked again with the same
// backoff: it may be upgraded or downgraded while reaperd runs.
#pragma once

#include "guard.hpp"  // ObjectRef

#include <reaper/engine.hpp>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
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
struct Appeared {                   // a container not seen before, or just started (inspect info)
    reaper::ContainerInfo info;
    std::string docker_root_dir;    // the engine's data root, "" if it would not say
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
};

class Watcher {
public:
    using Sink = std::function<void(WatchEvent)>;

    Watcher(reaper::Engine& engine, WatcherOptions options, Sink sink);
    ~Watcher();  // stop()
    Watcher(const Watcher&) = delete;
    Watcher& operator=(const Watcher&) = delete;

    void start();
    // Ends the current events stream so the watcher re-lists and reconciles now.
    void resync();
    void set_options(WatcherOptions options);
    // Cancels the stream and joins the thread. Idempotent. A list or inspect in flight
    // finishes first (close the engine to cut it short).
    void stop();

private:
    void run();
    void list_and_reconcile();
    void list_objects();
    void object_event(const reaper::Event& event);
    bool sleep_for(std::chrono::milliseconds delay);  // false when stopping

    reaper::Engine& engine_;
    Sink sink_;
    std::mutex mutex_;
    std::condition_variable wake_;
    WatcherOptions options_;
    bool stopping_ = false;
    bool resync_requested_ = false;
    reaper::EventStream* stream_ = nullptr;  // guarded by mutex_, for cancel()
    std::set<std::string> known_;            // ids reported as Appeared and not Gone
    std::string docker_root_dir_;            // from the engine's info at the last list
    std::thread thread_;
};

}  // namespace reaperd
