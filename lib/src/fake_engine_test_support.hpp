// A scripted, in-memory Engine for unit tests: it keeps containers in a map, records every
// call, counts close() calls, and lets a test inject faults per method ("next call to remove
// throws Conflict", "every call to exec returns 1").
#pragma once

#include <reaper/engine.hpp>

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace reaper::test {

class FakeEngine final : public Engine {
public:
    struct Container {
        ContainerSpec spec;
        ContainerInfo info;
    };
    // Runs before a method's default behaviour; it may throw to inject a fault.
    using Fault = std::function<void()>;

    // Shared so a test can inspect the fake after the Session destroyed it.
    struct State {
        std::mutex mutex;
        std::map<std::string, Container> containers;
        std::vector<std::string> calls;  // "create", "remove force=1 <id>", ...
        std::map<std::string, std::deque<Fault>> next_faults;  // consumed one per call
        std::map<std::string, Fault> always_faults;             // every call
        int close_calls = 0;
        bool closed = false;
        int next_id = 1;
        // What a started container does: keep running, or exit at once with exit_code.
        bool exits_at_once = false;
        int exit_code = 0;
        // Health: "" = no health check; else the status inspect reports.
        std::string health_status;
        std::deque<int> exec_results;  // popped per exec; empty = 0
        int exec_default = 0;
        // The next N creates make their container, then throw Timeout: the answer was lost.
        int lose_create_answers = 0;

        int count(const std::string& prefix) {
            std::lock_guard lock(mutex);
            int n = 0;
            for (const auto& call : calls) n += call.rfind(prefix, 0) == 0;
            return n;
        }
        bool has_container(const std::string& id) {
            std::lock_guard lock(mutex);
            return containers.count(id) != 0;
        }
    };

    explicit FakeEngine(std::shared_ptr<State> state) : state_(std::move(state)) {}

    // Adds a running container (for attach) and returns its id.
    static std::string add_running(State& state, const std::string& name, Labels labels = {}) {
        std::lock_guard lock(state.mutex);
        auto id = make_id(state);
        Container c;
        c.info.id = id;
        c.info.name = name;
        c.info.labels = std::move(labels);
        c.info.state.status = "running";
        c.info.state.running = true;
        state.containers[id] = c;
        return id;
    }

    void ping() override { enter("ping"); }
    VersionInfo version() override {
        enter("version");
        return {"20.10.24", "1.41", "1.12", "linux", "amd64"};
    }
    EngineInfo info() override {
        enter("info");
        return {"/var/lib/docker"};
    }
    std::vector<ContainerSummary> list_containers(const ListOptions& options) override {
        enter("list");
        std::lock_guard lock(state_->mutex);
        std::vector<ContainerSummary> out;
        for (const auto& [id, c] : state_->containers) {
            bool match = options.all || c.info.state.running;
            if (auto f = options.filters.find("label"); f != options.filters.end())
                for (const auto& want : f->second) {
                    auto eq = want.find('=');
                    auto key = want.substr(0, eq);
                    auto it = c.info.labels.find(key);
                    if (it == c.info.labels.end() || (eq != std::string::npos && it->second != want.substr(eq + 1)))
                        match = false;
                }
            if (match) out.push_back({id, {c.info.name}, c.info.image, c.info.labels, c.info.state.status, "", 0});
        }
        return out;
    }
    ContainerInfo inspect(const std::string& id) override {
        enter("inspect " + id);
        std::lock_guard lock(state_->mutex);
        return find(id).info;
    }
    std::string create(const ContainerSpec& spec) override {
        enter("create");
        std::lock_guard lock(state_->mutex);
        auto id = make_id(*state_);
        Container c;
        c.spec = spec;
        c.info.id = id;
        c.info.name = spec.name.empty() ? "fake_" + id.substr(0, 6) : spec.name;
        c.info.image = spec.image;
        c.info.labels = spec.labels;
        c.info.state.status = "created";
        c.info.log_driver = spec.log_config.type;
        c.info.log_options = spec.log_config.options;
        state_->containers[id] = c;
        if (state_->lose_create_answers > 0) {
            --state_->lose_create_answers;
            throw Timeout(0, "", "create: timed out");
        }
        return id;
    }
    void start(const std::string& id) override {
        enter("start " + id);
        std::lock_guard lock(state_->mutex);
        auto& c = find(id);
        if (state_->exits_at_once) {
            c.info.state.status = "exited";
            c.info.state.running = false;
            c.info.state.exit_code = state_->exit_code;
        } else {
            c.info.state.status = "running";
            c.info.state.running = true;
        }
        c.info.has_healthcheck = !state_->health_status.empty();
        c.info.state.health_status = state_->health_status;
    }
    void stop(const std::string& id, std::chrono::seconds) override {
        enter("stop " + id);
        halt(id);
    }
    void kill(const std::string& id, const std::string&) override {
        enter("kill " + id);
        std::lock_guard lock(state_->mutex);
        auto& c = find(id);
        if (!c.info.state.running) throw Conflict(409, "container is not running", "kill: 409");
        c.info.state.running = false;
        c.info.state.status = "exited";
    }
    void remove(const std::string& id, const RemoveOptions& options) override {
        enter(std::string("remove force=") + (options.force ? "1 " : "0 ") + id);
        std::lock_guard lock(state_->mutex);
        auto& c = find(id);
        if (c.info.state.running && !options.force)
            throw Conflict(409, "You cannot remove a running container", "remove: 409");
        state_->containers.erase(id);
    }
    int wait(const std::string& id, std::chrono::milliseconds) override {
        enter("wait " + id);
        return 0;
    }
    int exec(const std::string& id, const std::vector<std::string>&, std::chrono::milliseconds) override {
        enter("exec " + id);
        std::lock_guard lock(state_->mutex);
        find(id);
        if (state_->exec_results.empty()) return state_->exec_default;
        int result = state_->exec_results.front();
        state_->exec_results.pop_front();
        return result;
    }
    std::unique_ptr<EventStream> events(const EventsOptions&) override {
        enter("events");
        throw ServerError(501, "not in the fake", "events: 501");
    }
    // Networks and volumes: the Session never uses them; listed empty, never found.
    std::vector<NetworkInfo> list_networks(const Filters&) override {
        enter("list_networks");
        return {};
    }
    NetworkInfo inspect_network(const std::string& id) override {
        enter("inspect_network " + id);
        throw NotFound(404, "network " + id + " not found", "404");
    }
    void remove_network(const std::string& id) override {
        enter("remove_network " + id);
        throw NotFound(404, "network " + id + " not found", "404");
    }
    std::vector<VolumeInfo> list_volumes(const Filters&) override {
        enter("list_volumes");
        return {};
    }
    VolumeInfo inspect_volume(const std::string& name) override {
        enter("inspect_volume " + name);
        throw NotFound(404, "get " + name + ": no such volume", "404");
    }
    void remove_volume(const std::string& name) override {
        enter("remove_volume " + name);
        throw NotFound(404, "get " + name + ": no such volume", "404");
    }
    void close() noexcept override {
        std::lock_guard lock(state_->mutex);
        state_->calls.push_back("close");
        ++state_->close_calls;
        state_->closed = true;
    }

private:
    static std::string make_id(State& state) {
        char buf[65];
        std::snprintf(buf, sizeof buf, "%064x", state.next_id++);
        return buf;
    }
    // Records the call, fails if closed, and runs the injected fault for its method.
    void enter(const std::string& call) {
        Fault fault;
        {
            std::lock_guard lock(state_->mutex);
            state_->calls.push_back(call);
            if (state_->closed) throw ClientClosed(0, "", "client closed");
            auto method = call.substr(0, call.find(' '));
            if (auto it = state_->next_faults.find(method); it != state_->next_faults.end() && !it->second.empty()) {
                fault = std::move(it->second.front());
                it->second.pop_front();
            } else if (auto always = state_->always_faults.find(method); always != state_->always_faults.end()) {
                fault = always->second;
            }
        }
        if (fault) fault();
    }
    Container& find(const std::string& id_or_name) {
        if (auto it = state_->containers.find(id_or_name); it != state_->containers.end()) return it->second;
        for (auto& [id, c] : state_->containers)
            if (c.info.name == id_or_name) return c;
        throw NotFound(404, "No such container: " + id_or_name, "404");
    }
    void halt(const std::string& id) {
        std::lock_guard lock(state_->mutex);
        auto& c = find(id);
        c.info.state.running = false;
        c.info.state.status = "exited";
    }

    std::shared_ptr<State> state_;
};

}  // namespace reaper::test
