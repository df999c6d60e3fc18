// The one door through which reaperd stops, kills or removes a container, and removes a
// network or a volume. The reaper, the log capper and anything added later call
// Guard::act(); nothing else in reaperd sends a destructive call to the engine (README,
// "What can remove a container").
//
// What the door guarantees, for every call:
// - A fresh inspect of the container (network, volume) by the full id the caller pinned; a
//   name or an id prefix is refused (a name can be reused by another container at any
//   time). A volume's name is its only id: it is pinned by that exact name.
// - It carries a label in sessions.labels of the config the daemon's loop last
//   installed (configure(); a reload reaches every caller at once, as they share the door).
// - When the caller names a session, its session label equals it.
// - When the caller says its session is alive, nothing is done.
// - A network with containers still attached is not removed (a failure, retried).
// - reaper.dry_run: logged and counted, no call.
// - Only then the call, by the inspected full id.
// Every outcome is a value (Outcome); refusals and dry runs are logged here, once, so
// callers only log what they did.
//
// Who may call: any thread; act() blocks on the engine (an inspect and at most one
// destructive call). configure() may race with act(): an act already past its snapshot
// finishes under the config it started with; the next one sees the new config.
#pragma once

#include "config.hpp"
#include "engine_port.hpp"
#include "log.hpp"
#include "vocabulary.hpp"

#include <reaper/engine.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace reaperd {

// Where the door and the log capper write their records (log() in reaperd; tests collect them).
using LogSink = std::function<void(Priority, std::string_view message_id, std::string_view message,
                                   std::vector<LogField> fields)>;

// What the door checks against: the parts of the daemon's config that decide ownership
// and dry run.
struct GuardConfig {
    std::vector<std::string> labels{"reaperd.session"};  // sessions.labels
    bool dry_run = false;                                 // reaper.dry_run

    static GuardConfig from(const Config& config);
};

enum class ContainerAct { remove, stop, kill };
std::string_view to_string(ContainerAct act) noexcept;  // "remove", "stop", "kill"

// What the door removes besides containers: a session's labelled networks and volumes.
enum class ObjectKind { network, volume };
std::string_view to_string(ObjectKind kind) noexcept;  // "network", "volume"

// A network or a volume, by what pins it: a network's full id, a volume's name (its only id;
// the engine resolves nothing else for volumes).
struct ObjectRef {
    ObjectKind kind = ObjectKind::network;
    std::string id;

    friend auto operator<=>(const ObjectRef&, const ObjectRef&) = default;
};

// What the caller knows about the container it means to act on.
struct Expectation {
    // The container's session label must have this value (an orphan report's --session, a
    // reap for session S). nullopt: any session will do (the log capper acts on size).
    std::optional<std::string> session;
    // The caller knows the session is alive (leased, or in its lease grace): refuse.
    bool session_alive = false;
    // For an act because `session` ended: the leases opened on it that the caller had seen
    // when it judged the session not alive. The door counts lease opens as the control
    // server accepts them (Guard::lease_opening), before the loop hears of them; if it has
    // counted more by the time it would act, the session came alive meanwhile: refuse. A
    // removal already sent when the lease comes is not undone (nothing can undo it).
    std::optional<std::uint64_t> leases_opened;

    friend bool operator==(const Expectation&, const Expectation&) = default;
};

struct GuardRequest {
    std::string container;  // the full id, pinned when the caller first learned of it
    ContainerAct act = ContainerAct::remove;
    Expectation expect;
    ActReason reason;  // why the caller acts (a reap's, a log cap's): REASON= of its records
    std::chrono::seconds stop_grace{10};  // stop: how long before the engine kills
};

struct ObjectRequest {  // remove a network or a volume
    ObjectRef object;     // pinned when the caller first learned of it (a list or an event)
    Expectation expect;
    ReapReason reason = ReapReason::session_ended;  // REASON= of its records
};

// A fresh inspect of a network or volume, as the door judges it.
struct InspectedObject {
    std::string id;  // a network's full id; a volume's name
    std::string name;
    reaper::Labels labels;
    std::size_t attached = 0;  // a network's attached containers: the engine would refuse

    static InspectedObject of(const reaper::NetworkInfo& network);
    static InspectedObject of(const reaper::VolumeInfo& volume);
};

enum class Outcome {
    acted,                  // the call was sent and succeeded (judge(): send it)
    gone,                   // 404 at inspect or at the call: nothing to do any more
    removing,               // the engine is removing it already: look again later
    not_running,            // stop/kill of a container that is not running: nothing to do
    refused_not_pinned,     // the reference is not the container's full id
    refused_not_owned,      // no label in sessions.labels
    refused_other_session,  // its session label names another session than expected
    refused_session_alive,  // the caller says its session is alive
    dry_run,                // would have acted; reaper.dry_run is on
    failed,                 // the inspect or the call failed, or a network still has
                            // containers attached: retry later
};
inline constexpr std::size_t outcome_count = 10;
std::string_view to_string(Outcome outcome) noexcept;  // "acted", "refused_not_owned", ...
bool is_refusal(Outcome outcome) noexcept;

struct GuardResult {
    Outcome outcome = Outcome::failed;
    std::string error;  // failed: the engine's error text
    // failed because the engine did not answer the inspect or the call within its request
    // timeout (reaper::Timeout): whether it acted is unknown. A caller that only retries
    // (the log capper) sees a failure; the reaper counts it as unknown, not failed, and its
    // next attempt's fresh inspect finds out (gone means done).
    bool unanswered = false;
    // From the inspect, when there was one: its name and its session under the config
    // used (nullopt: not session-owned).
    std::string name;
    std::optional<std::string> session;
};

// THE OWNERSHIP RULE, in one place: a container is session-owned iff it carries one of
// `label_keys`; the first configured key present names its session. Returns the session id,
// or nullopt for a container reaperd must never stop, kill or remove.
std::optional<std::string> owning_session(const reaper::Labels& labels,
                                          const std::vector<std::string>& label_keys);

// The ownership half of the door, also used to accept an orphan report: nullopt when the
// labels make the container owned (by `expected_session`, if given), else the refusal.
std::optional<Outcome> ownership_refusal(const reaper::Labels& labels, const GuardConfig& config,
                                         const std::optional<std::string>& expected_session);

// The door's decision, pure: `inspected` is the fresh inspect (nullopt: 404). Returns
// Outcome::acted when the call is to be sent, else the outcome without a call.
Outcome judge(const std::optional<reaper::ContainerInfo>& inspected, const GuardRequest& request,
              const GuardConfig& config);

// The same decision for a network or volume: pinned (a network by its full id, a volume by
// its exact name), owned, of the expected session, not alive, no container attached, dry run.
Outcome judge(const std::optional<InspectedObject>& inspected, const ObjectRequest& request,
              const GuardConfig& config);

// The journal fields naming a network (NETWORK_ID, NETWORK_NAME) or volume (VOLUME_NAME).
std::vector<LogField> object_fields(const ObjectRef& object, const std::string& name);
// "network web_default (0123456789ab)", "volume data": for messages.
std::string describe(const ObjectRef& object, const std::string& name);

// True for the engine's full container id: 64 lowercase hex digits. Only such an id pins
// one container: the engine also resolves names and unique id prefixes.
bool is_full_container_id(std::string_view reference) noexcept;

// "<kind> <status>: <engine message>", for logs and replies.
std::string describe(const reaper::EngineError& error);

class Guard {
public:
    Guard(EnginePort& engine, GuardConfig config, LogSink sink = default_sink());
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

    // Installs the config every later act() checks against (the daemon's loop, at start and
    // on each reload). Thread-safe.
    void configure(GuardConfig config);
    std::shared_ptr<const GuardConfig> config() const;

    // Inspects, judges and, only when judge() says so, sends the call. Never throws.
    GuardResult act(const GuardRequest& request);
    // The same for a network or volume: inspect, judge, remove by the inspected id.
    GuardResult act(const ObjectRequest& request);

    // A lease on `session` is being opened (called by the control server's thread before the
    // lease is acknowledged, and before the loop learns of it). Thread-safe.
    void lease_opening(const std::string& session);
    // The loop forgot `session` (an expired tombstone, an idle record): so does the door.
    void forget_session(const std::string& session);

    // How many acts ended in each outcome since the door was made; only non-zero ones. Those
    // the engine did not answer in time count as "unanswered", not "failed".
    std::map<std::string, std::uint64_t> counts() const;

private:
    static LogSink default_sink();
    void call(const std::string& id, const GuardRequest& request);
    void record(const GuardRequest& request, const GuardResult& result, const GuardConfig& config);
    void record(const ObjectRequest& request, const GuardResult& result, const GuardConfig& config);
    // True when more leases were opened on the expected session than the caller had seen.
    bool came_alive(const Expectation& expect) const;

    EnginePort& engine_;
    LogSink sink_;
    mutable std::mutex mutex_;
    std::shared_ptr<const GuardConfig> config_;  // guarded by mutex_
    std::map<std::string, std::uint64_t> leases_opened_;  // by session; guarded by mutex_
    void count(const GuardResult& result);
    std::array<std::atomic<std::uint64_t>, outcome_count> counts_{};
    std::atomic<std::uint64_t> unanswered_{0};
};

}  // namespace reaperd
