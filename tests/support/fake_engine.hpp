// The one scripted, in-memory engine of the unit tests: both the library's Engine (what a
// Session calls, through connection()) and reaperd's port (EnginePort), over containers,
// networks and volumes kept in maps. Faults come from a table, queued per call and object
// (409, 500, removal in progress, timeout, unreachable); what a table cannot say (a
// container that changes between two calls, a non-engine exception, a fault with the
// engine's own text) is a hook run before a call. Event streams are fed by the test (and can be broken). Every call is
// recorded, destructive ones by id, so tests can assert what was, and was never, touched.
// It answers as Docker does: ids, names and unique prefixes resolve, a stop or kill leaves
// the container exited, and a plain delete of a running one is a 409.
#pragma once

#include "engine_port.hpp"

#include <reaper/engine.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace reaper::test {

struct Fault {
    reaper::EngineErrorKind kind;
    int status = 0;
    std::string message;
};

inline Fault conflict_running() {
    return {reaper::EngineErrorKind::Conflict, 409,
            "You cannot remove a running container. Stop the container before attempting "
            "removal or force remove"};
}
inline Fault removal_in_progress() {
    return {reaper::EngineErrorKind::Conflict, 409,
            "removal of container abc is already in progress"};
}
inline Fault server_error() {
    return {reaper::EngineErrorKind::Server, 500, "driver failed to remove root filesystem"};
}
inline Fault timeout() { return {reaper::EngineErrorKind::Timeout, 0, ""}; }
inline Fault unreachable() { return {reaper::EngineErrorKind::Unreachable, 0, ""}; }

class FakeEngine final : public reaper::Engine, public reaperd::EnginePort {
public:
    class Stream final : public reaper::EventStream {
    public:
        explicit Stream(FakeEngine& engine) : engine_(engine) {}  // caller holds the lock
        ~Stream() override {
            std::lock_guard lock(engine_.mutex_);
            engine_.streams_.erase(this);
        }
        std::optional<reaper::Event> next() override {
            std::unique_lock lock(engine_.mutex_);
            engine_.changed_.wait(lock, [&] {
                return cancelled_ || broken_ || engine_.closed_ || !queue_.empty();
            });
            if (broken_) {
                broken_ = false;
                cancelled_ = true;
                throw reaper::Unreachable(0, "", "events stream broke");
            }
            if (cancelled_ || engine_.closed_) return std::nullopt;
            auto event = queue_.front();
            queue_.pop_front();
            return event;
        }
        void cancel() noexcept override {
            std::lock_guard lock(engine_.mutex_);
            cancelled_ = true;
            engine_.changed_.notify_all();
        }

    private:
        friend class FakeEngine;
        FakeEngine& engine_;
        std::deque<reaper::Event> queue_;
        bool cancelled_ = false;
        bool broken_ = false;
        reaper::Filters filters_;  // "type" and "event" are applied, as the engine does
        bool wants(const reaper::Event& event) const {
            for (const auto& [key, values] : filters_) {
                if (key != "type" && key != "event") continue;
                const std::string& value = key == "type" ? event.type : event.action;
                if (std::find(values.begin(), values.end(), value) == values.end()) return false;
            }
            return true;
        }
    };

    ~FakeEngine() override { close(); }

    // ---- scripting -------------------------------------------------------------------
    // Adds a container and sends its create event to open streams.
    std::string docker_root_dir = "/var/lib/docker";  // what info() answers
    bool attributes_in_events = true;  // false: events as an engine that sends none

    void add(const std::string& id, reaper::Labels labels, const std::string& status = "running",
             const std::string& created = "2026-01-01T00:00:00Z") {
        std::lock_guard lock(mutex_);
        reaper::ContainerInfo info;
        info.id = id;
        info.name = "name-" + id;
        info.created = created;
        info.labels = std::move(labels);
        info.state.status = status;
        info.state.running = status == "running";
        containers_[id] = info;
        broadcast({"container", "create", id, attributes(info), 1767225600000000000});
    }
    // Starts a container as `docker start` does: running, with its LogPath, and a start event.
    void start_container(const std::string& id, const std::string& log_path) {
        std::lock_guard lock(mutex_);
        auto& info = containers_.at(id);
        info.state.status = "running";
        info.state.running = true;
        info.log_path = log_path;
        info.log_driver = "json-file";
        broadcast({"container", "start", id, attributes(info), 1767225601000000000});
    }
    // Inspects of `id` answer what they found only once released (or the engine closes): a
    // slow engine, whose answer is in flight while the container changes.
    void hold_inspects(const std::string& id) {
        std::lock_guard lock(mutex_);
        held_.insert(id);
    }
    void release_inspects() {
        std::lock_guard lock(mutex_);
        held_.clear();
        changed_.notify_all();
    }
    std::size_t held_inspects() const {  // inspects waiting for release_inspects()
        std::lock_guard lock(mutex_);
        return holding_;
    }
    // Adds a container the event streams never hear about (it shows up only in a list).
    void add_silently(const std::string& id, reaper::Labels labels) {
        std::lock_guard lock(mutex_);
        reaper::ContainerInfo info;
        info.id = id;
        info.name = "name-" + id;
        info.created = "2026-01-01T00:00:00Z";
        info.labels = std::move(labels);
        info.state.status = "running";
        containers_[id] = info;
    }
    // Names it as `docker create --name` would (a name is what an orphan report may give).
    void rename(const std::string& id, const std::string& name) {
        std::lock_guard lock(mutex_);
        containers_.at(id).name = name;
    }
    // Removes a container the event streams never hear about (removed behind reaperd's
    // back while its events were lost: only an inspect or a list can tell).
    void drop_silently(const std::string& id) {
        std::lock_guard lock(mutex_);
        containers_.erase(id);
    }
    // `action`: Docker's "destroy", or Podman's "remove".
    void drop(const std::string& id, const std::string& action = "destroy") {
        std::lock_guard lock(mutex_);
        containers_.erase(id);
        broadcast({"container", action, id, {}, 0});
    }
    // Adds a network (its name "net-<id>" unless given), attached to `containers`, and sends
    // its create event. A remove is refused while any container is attached (Docker's 403).
    void add_network(const std::string& id, reaper::Labels labels,
                     std::vector<std::string> containers = {}, const std::string& name = "") {
        std::lock_guard lock(mutex_);
        reaper::NetworkInfo n;
        n.id = id;
        n.name = name.empty() ? "net-" + id : name;
        n.driver = "bridge";
        n.labels = std::move(labels);
        n.containers = std::move(containers);
        networks_[id] = n;
        broadcast({"network", "create", id, {}, 0});
    }
    void detach_all(const std::string& network) {
        std::lock_guard lock(mutex_);
        networks_.at(network).containers.clear();
    }
    // Adds a volume and sends its create event; `in_use` makes a remove answer 409.
    void add_volume(const std::string& name, reaper::Labels labels, bool in_use = false) {
        std::lock_guard lock(mutex_);
        reaper::VolumeInfo v;
        v.name = name;
        v.driver = "local";
        v.labels = std::move(labels);
        volumes_[name] = v;
        if (in_use) volumes_in_use_.insert(name); else volumes_in_use_.erase(name);
        broadcast({"volume", "create", name, {}, 0});
    }
    void set_volume_in_use(const std::string& name, bool in_use) {
        std::lock_guard lock(mutex_);
        if (in_use) volumes_in_use_.insert(name); else volumes_in_use_.erase(name);
    }
    // Replaces a volume behind reaperd's back (no events): a reused name.
    void replace_volume_silently(const std::string& name, reaper::Labels labels) {
        std::lock_guard lock(mutex_);
        volumes_[name].labels = std::move(labels);
    }
    bool has_network(const std::string& id) const {
        std::lock_guard lock(mutex_);
        return networks_.count(id) > 0;
    }
    bool has_volume(const std::string& name) const {
        std::lock_guard lock(mutex_);
        return volumes_.count(name) > 0;
    }
    // The next calls of `op` (a method's name; "list" for list_containers) on `id` ("" =
    // any) fail with these faults, in order.
    void fail(const std::string& op, const std::string& id, std::vector<Fault> faults) {
        std::lock_guard lock(mutex_);
        auto& queue = faults_[op + "/" + id];
        for (auto& f : faults) queue.push_back(std::move(f));
    }
    void clear_faults() {
        std::lock_guard lock(mutex_);
        faults_.clear();
        hooks_.clear();
        every_hooks_.clear();
    }
    // While down, every call fails Unreachable and open streams break.
    void set_down(bool down) {
        std::lock_guard lock(mutex_);
        down_ = down;
        if (down)
            for (auto* s : streams_) s->broken_ = true;
        changed_.notify_all();
    }
    void break_streams() {
        std::lock_guard lock(mutex_);
        for (auto* s : streams_) s->broken_ = true;
        changed_.notify_all();
    }

    bool exists(const std::string& id) const {
        std::lock_guard lock(mutex_);
        return containers_.count(id) > 0;
    }
    std::vector<std::string> removed() const {
        std::lock_guard lock(mutex_);
        return removed_;
    }
    // Every destructive call (remove/stop/kill, and network and volume removes) ever made,
    // by id (a volume by name), successful or not.
    std::vector<std::string> destructive_calls() const {
        std::lock_guard lock(mutex_);
        return destructive_calls_;
    }
    int calls(const std::string& op) const {
        std::lock_guard lock(mutex_);
        auto it = call_counts_.find(op);
        return it == call_counts_.end() ? 0 : it->second;
    }
    struct Call {
        std::string op;  // as fail() names it: "inspect", "stop", "remove", "list", ...
        std::string id;  // the reference the caller gave; "" for a call on no object
        bool force = false;  // a remove's RemoveOptions::force
    };
    // Removes so far with (or without) force.
    int removes(bool force) const {
        std::lock_guard lock(mutex_);
        return static_cast<int>(std::count_if(call_log_.begin(), call_log_.end(), [&](const Call& call) {
            return call.op == "remove" && call.force == force;
        }));
    }
    // Every call so far, in order.
    std::vector<Call> calls() const {
        std::lock_guard lock(mutex_);
        return call_log_;
    }
    std::size_t open_streams() const {
        std::lock_guard lock(mutex_);
        return streams_.size();
    }

    // ---- scripting what a Session meets -----------------------------------------------
    // Adds a running container named `name`, as `docker run -d --name` leaves it (for attach),
    // and returns its id.
    std::string add_running(const std::string& name, reaper::Labels labels = {}) {
        std::string id;
        {
            std::lock_guard lock(mutex_);
            id = next_id_locked();
        }
        add(id, std::move(labels));
        rename(id, name);
        return id;
    }
    // Started containers exit at once with `exit_code` instead of running.
    void exit_at_start(int exit_code) {
        std::lock_guard lock(mutex_);
        exit_at_start_ = exit_code;
    }
    // Started containers have a health check in this status ("" = none).
    void set_health(const std::string& status) {
        std::lock_guard lock(mutex_);
        health_status_ = status;
    }
    // Execs answer `results` in order, then `otherwise`.
    void script_exec(std::deque<int> results, int otherwise = 0) {
        std::lock_guard lock(mutex_);
        exec_results_ = std::move(results);
        exec_otherwise_ = otherwise;
    }
    // The next `count` creates make their container, then time out: the answer was lost.
    void lose_create_answers(int count) {
        std::lock_guard lock(mutex_);
        lost_create_answers_ = count;
    }
    // The next call of `op` runs `hook` first, without the fake's lock (so it may script the
    // fake); what it throws is the call's answer. Hooks queue, one per call.
    void before(const std::string& op, std::function<void()> hook) {
        std::lock_guard lock(mutex_);
        hooks_[op].push_back(std::move(hook));
    }
    // Every call of `op` with no queued hook left runs `hook` first, until clear_faults().
    void before_every(const std::string& op, std::function<void()> hook) {
        std::lock_guard lock(mutex_);
        every_hooks_[op] = std::move(hook);
    }
    // Changes every container as the engine would behind the caller's back.
    void update_containers(const std::function<void(reaper::ContainerInfo&)>& change) {
        std::lock_guard lock(mutex_);
        for (auto& [id, info] : containers_) change(info);
    }
    reaper::ContainerInfo container(const std::string& id) const {
        std::lock_guard lock(mutex_);
        return containers_.at(id);
    }
    // What create() was given for `id`.
    reaper::ContainerSpec spec(const std::string& id) const {
        std::lock_guard lock(mutex_);
        return specs_.at(id);
    }
    std::size_t container_count() const {
        std::lock_guard lock(mutex_);
        return containers_.size();
    }
    // A handle a Session can own (SessionOptions::engine_factory): every call goes to this
    // fake, which must outlive it; its close() is counted (close_calls()) and ends that
    // handle only, whose later calls throw ClientClosed.
    std::unique_ptr<reaper::Engine> connection();
    int close_calls() const {
        std::lock_guard lock(mutex_);
        return close_calls_;
    }

    // ---- Engine and EnginePort -------------------------------------------------------
    reaper::EngineInfo info() override {
        check("info", "");
        return {docker_root_dir};
    }
    // `all` and "label" filters ("key" or "key=value", ANDed) apply as the engine applies them.
    std::vector<reaper::ContainerSummary> list_containers(const reaper::ListOptions& options) override {
        enter("list", "");
        std::lock_guard lock(mutex_);
        check_locked("list", "");
        std::vector<reaper::ContainerSummary> out;
        for (const auto& [id, info] : containers_) {
            if (!options.all && !info.state.running) continue;
            if (!has_labels(info.labels, options.filters)) continue;
            reaper::ContainerSummary s;
            s.id = id;
            s.names = {info.name};
            s.image = info.image;
            s.labels = info.labels;
            s.state = info.state.status;
            out.push_back(s);
        }
        return out;
    }
    // Resolves `reference` as the engine does: the exact id, else a name, else an id prefix
    // that only one container has (one that several have is a 500, as dockerd answers it).
    reaper::ContainerInfo inspect(const std::string& reference) override {
        enter("inspect", reference);
        std::unique_lock lock(mutex_);
        check_locked("inspect", reference);
        if (auto it = containers_.find(reference); it != containers_.end()) {
            auto answer = it->second;
            if (held_.count(reference)) {
                ++holding_;
                changed_.wait(lock, [&] { return !held_.count(reference) || closed_; });
                --holding_;
                if (closed_) throw reaper::ClientClosed(0, "", "closed");
            }
            return answer;
        }
        return find_locked(reference);
    }
    std::string create(const reaper::ContainerSpec& spec) override {
        enter("create", "");
        std::lock_guard lock(mutex_);
        check_locked("create", "");
        reaper::ContainerInfo info;
        info.id = next_id_locked();
        info.name = spec.name.empty() ? "fake_" + info.id.substr(0, 6) : spec.name;
        info.image = spec.image;
        info.labels = spec.labels;
        info.state.status = "created";
        info.log_driver = spec.log_config.type;
        info.log_options = spec.log_config.options;
        containers_[info.id] = info;
        specs_[info.id] = spec;
        broadcast({"container", "create", info.id, attributes(info), 1767225600000000000});
        if (lost_create_answers_ > 0) {
            --lost_create_answers_;
            throw reaper::Timeout(0, "", "create: timed out");
        }
        return info.id;
    }
    void start(const std::string& reference) override {
        enter("start", reference);
        std::lock_guard lock(mutex_);
        check_locked("start", reference);
        auto& info = find_locked(reference);
        info.state.running = !exit_at_start_;
        info.state.status = exit_at_start_ ? "exited" : "running";
        info.state.exit_code = exit_at_start_.value_or(0);
        info.has_healthcheck = !health_status_.empty();
        info.state.health_status = health_status_;
        broadcast({"container", "start", info.id, attributes(info), 1767225601000000000});
    }
    void stop(const std::string& id, std::chrono::seconds) override { halt("stop", id); }
    void kill(const std::string& id, const std::string&) override { halt("kill", id); }
    void remove(const std::string& id, const reaper::RemoveOptions& options) override {
        enter("remove", id, options.force);
        std::lock_guard lock(mutex_);
        destructive_calls_.push_back(id);
        check_locked("remove", id, options.force);
        auto it = containers_.find(id);
        if (it == containers_.end()) throw reaper::NotFound(404, "No such container: " + id, id);
        if (it->second.state.running && !options.force)
            throw reaper::Conflict(409, conflict_running().message, id);
        containers_.erase(it);
        removed_.push_back(id);
        broadcast({"container", "destroy", id, {}, 0});
    }
    int exec(const std::string& reference, const std::vector<std::string>&, std::chrono::milliseconds) override {
        enter("exec", reference);
        std::lock_guard lock(mutex_);
        check_locked("exec", reference);
        find_locked(reference);
        if (exec_results_.empty()) return exec_otherwise_;
        int result = exec_results_.front();
        exec_results_.pop_front();
        return result;
    }
    std::unique_ptr<reaper::EventStream> events(const reaper::EventsOptions& options) override {
        enter("events", "");
        std::lock_guard lock(mutex_);
        check_locked("events", "");
        auto stream = std::make_unique<Stream>(*this);
        stream->filters_ = options.filters;
        streams_.insert(stream.get());
        return stream;
    }
    // Networks and volumes: ops "list_networks", "inspect_network", "remove_network",
    // "list_volumes", "inspect_volume", "remove_volume" for fail(). Filters are ignored.
    std::vector<reaper::NetworkInfo> list_networks(const reaper::Filters&) override {
        enter("list_networks", "");
        std::lock_guard lock(mutex_);
        check_locked("list_networks", "");
        std::vector<reaper::NetworkInfo> out;
        for (const auto& [id, n] : networks_) {
            out.push_back(n);
            out.back().containers.clear();  // as the engine's list
        }
        return out;
    }
    // Resolves as the engine does: the full id, a name, or an id prefix.
    reaper::NetworkInfo inspect_network(const std::string& reference) override {
        enter("inspect_network", reference);
        std::lock_guard lock(mutex_);
        check_locked("inspect_network", reference);
        if (auto it = networks_.find(reference); it != networks_.end()) return it->second;
        for (const auto& [id, n] : networks_)
            if (n.name == reference || id.rfind(reference, 0) == 0) return n;
        throw reaper::NotFound(404, "network " + reference + " not found", reference);
    }
    void remove_network(const std::string& id) override {
        enter("remove_network", id);
        std::lock_guard lock(mutex_);
        destructive_calls_.push_back(id);
        check_locked("remove_network", id);
        auto it = networks_.find(id);
        if (it == networks_.end()) throw reaper::NotFound(404, "network " + id + " not found", id);
        if (!it->second.containers.empty())
            throw reaper::BadRequest(403, "error while removing network: network " + it->second.name +
                                              " id " + id + " has active endpoints", id);
        networks_.erase(it);
        removed_.push_back(id);
        broadcast({"network", "destroy", id, {}, 0});
    }
    std::vector<reaper::VolumeInfo> list_volumes(const reaper::Filters&) override {
        enter("list_volumes", "");
        std::lock_guard lock(mutex_);
        check_locked("list_volumes", "");
        std::vector<reaper::VolumeInfo> out;
        for (const auto& [name, v] : volumes_) out.push_back(v);
        return out;
    }
    reaper::VolumeInfo inspect_volume(const std::string& name) override {
        enter("inspect_volume", name);
        std::lock_guard lock(mutex_);
        check_locked("inspect_volume", name);
        if (auto it = volumes_.find(name); it != volumes_.end()) return it->second;
        throw reaper::NotFound(404, "get " + name + ": no such volume", name);
    }
    void remove_volume(const std::string& name) override {
        enter("remove_volume", name);
        std::lock_guard lock(mutex_);
        destructive_calls_.push_back(name);
        check_locked("remove_volume", name);
        auto it = volumes_.find(name);
        if (it == volumes_.end()) throw reaper::NotFound(404, "get " + name + ": no such volume", name);
        if (volumes_in_use_.count(name))
            throw reaper::Conflict(409, "remove " + name + ": volume is in use - [abc]", name);
        volumes_.erase(it);
        removed_.push_back(name);
        broadcast({"volume", "destroy", name, {}, 0});
    }
    void close() noexcept override {
        std::lock_guard lock(mutex_);
        closed_ = true;
        changed_.notify_all();
    }

private:
    class Connection;

    // A container event's attributes as Docker sends them: the labels, the name and the image.
    std::map<std::string, std::string> attributes(const reaper::ContainerInfo& info) const {
        if (!attributes_in_events) return {};
        auto out = info.labels;
        out["name"] = info.name;
        out["image"] = "busybox";
        return out;
    }
    void broadcast(const reaper::Event& event) {
        for (auto* s : streams_)
            if (s->wants(event)) s->queue_.push_back(event);
        changed_.notify_all();
    }
    void check(const std::string& op, const std::string& id) {
        enter(op, id);
        std::lock_guard lock(mutex_);
        check_locked(op, id);
    }
    // Runs the next hook queued for `op`, else its every-call hook, if any. A call its hook
    // answered is recorded all the same.
    void enter(const std::string& op, const std::string& id, bool force = false) {
        std::function<void()> hook;
        {
            std::lock_guard lock(mutex_);
            if (auto it = hooks_.find(op); it != hooks_.end() && !it->second.empty()) {
                hook = std::move(it->second.front());
                it->second.pop_front();
            } else if (auto every = every_hooks_.find(op); every != every_hooks_.end()) {
                hook = every->second;
            }
        }
        if (!hook) return;
        try {
            hook();
        } catch (...) {
            std::lock_guard lock(mutex_);
            record_locked(op, id, force);
            throw;
        }
    }
    void record_locked(const std::string& op, const std::string& id, bool force) {
        ++call_counts_[op];
        call_log_.push_back({op, id, force});
    }
    void check_locked(const std::string& op, const std::string& id, bool force = false) {
        record_locked(op, id, force);
        if (closed_) throw reaper::ClientClosed(0, "", "closed");
        if (down_) throw reaper::Unreachable(0, "", "engine unreachable");
        for (const std::string& key : {op + "/" + id, op + "/"}) {
            auto it = faults_.find(key);
            if (it == faults_.end() || it->second.empty()) continue;
            Fault f = it->second.front();
            it->second.pop_front();
            reaper::throw_engine_error(f.kind, f.status, f.message, op + " " + id + ": injected");
        }
    }
    reaper::ContainerInfo& find_locked(const std::string& reference) {
        if (auto it = containers_.find(reference); it != containers_.end()) return it->second;
        for (auto& [id, info] : containers_)
            if (info.name == reference) return info;
        reaper::ContainerInfo* match = nullptr;
        for (auto& [id, info] : containers_) {
            if (id.rfind(reference, 0) != 0) continue;
            if (match)
                throw reaper::ServerError(500, "multiple IDs found with provided prefix: " + reference,
                                          "inspect " + reference);
            match = &info;
        }
        if (!match) throw reaper::NotFound(404, "No such container: " + reference, reference);
        return *match;
    }
    // Ids as the engine makes them: 64 hex digits.
    std::string next_id_locked() {
        char id[65];
        std::snprintf(id, sizeof id, "%064x", next_id_++);
        return id;
    }
    static bool has_labels(const reaper::Labels& labels, const reaper::Filters& filters) {
        auto wanted = filters.find("label");
        if (wanted == filters.end()) return true;
        for (const auto& want : wanted->second) {
            auto eq = want.find('=');
            auto it = labels.find(want.substr(0, eq));
            if (it == labels.end()) return false;
            if (eq != std::string::npos && it->second != want.substr(eq + 1)) return false;
        }
        return true;
    }
    // A stop or kill: the container is exited after it, as after the engine's; one it does
    // not hold is left to the caller's inspect to find gone.
    void halt(const std::string& op, const std::string& id) {
        enter(op, id);
        std::lock_guard lock(mutex_);
        destructive_calls_.push_back(id);
        check_locked(op, id);
        if (auto it = containers_.find(id); it != containers_.end()) {
            it->second.state.status = "exited";
            it->second.state.running = false;
        }
    }

    mutable std::mutex mutex_;
    std::condition_variable changed_;
    std::map<std::string, reaper::ContainerInfo> containers_;
    std::map<std::string, reaper::NetworkInfo> networks_;
    std::map<std::string, reaper::VolumeInfo> volumes_;
    std::set<std::string> volumes_in_use_;
    std::map<std::string, std::deque<Fault>> faults_;
    std::map<std::string, std::deque<std::function<void()>>> hooks_;
    std::map<std::string, std::function<void()>> every_hooks_;
    std::map<std::string, reaper::ContainerSpec> specs_;
    std::optional<int> exit_at_start_;
    std::string health_status_;
    std::deque<int> exec_results_;
    int exec_otherwise_ = 0;
    int lost_create_answers_ = 0;
    int next_id_ = 1;
    int close_calls_ = 0;
    std::set<Stream*> streams_;
    std::vector<std::string> removed_;
    std::vector<std::string> destructive_calls_;
    std::map<std::string, int> call_counts_;
    std::vector<Call> call_log_;
    std::set<std::string> held_;
    std::size_t holding_ = 0;
    bool down_ = false;
    bool closed_ = false;
};

class FakeEngine::Connection final : public reaper::Engine {
public:
    explicit Connection(FakeEngine& engine) : engine_(engine) {}

    std::vector<reaper::ContainerSummary> list_containers(const reaper::ListOptions& options) override {
        return open().list_containers(options);
    }
    reaper::ContainerInfo inspect(const std::string& id) override { return open().inspect(id); }
    std::string create(const reaper::ContainerSpec& spec) override { return open().create(spec); }
    void start(const std::string& id) override { open().start(id); }
    void kill(const std::string& id, const std::string& signal) override { open().kill(id, signal); }
    void remove(const std::string& id, const reaper::RemoveOptions& options) override { open().remove(id, options); }
    int exec(const std::string& id, const std::vector<std::string>& cmd, std::chrono::milliseconds timeout) override {
        return open().exec(id, cmd, timeout);
    }
    void close() noexcept override {
        closed_ = true;
        std::lock_guard lock(engine_.mutex_);
        ++engine_.close_calls_;
        engine_.record_locked("close", "", false);
    }

private:
    FakeEngine& open() {
        if (closed_) throw reaper::ClientClosed(0, "", "closed");
        return engine_;
    }
    FakeEngine& engine_;
    std::atomic<bool> closed_{false};
};

inline std::unique_ptr<reaper::Engine> FakeEngine::connection() { return std::make_unique<Connection>(*this); }

}  // namespace reaper::test
