// reaperd's port to the container engine: only the calls the daemon makes (the watcher's
// list, events and inspects; the door's inspects and destructive calls; the capper's data
// root), so what reaperd can do to an engine is read here, and a test fake implements
// this much. Sessions' calls (create, start, exec: reaper::Engine) and the engine's version
// are the library's, not reaperd's.
//
// For every call: failures are reaper::EngineError of a typed kind (reaper/engine.hpp), the
// engine's dialect read behind the port: a missing object is reaper::NotFound, a refusal
// reaper::Conflict, and a container the engine is removing already
// reaper::RemovalInProgress; statuses are typed (ContainerStatus), so reaperd never compares
// the engine's words. Implementations are safe to call from several threads at once, and
// block on the engine (bounded by its request timeout).
#pragma once

#include <reaper/client.hpp>
#include <reaper/engine.hpp>

#include "log_location.hpp"

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace reaperd {

class EnginePort {
public:
    virtual ~EnginePort() = default;

    // The engine's data root (DockerRootDir), where the capper finds `local` driver logs.
    virtual reaper::EngineInfo info() = 0;
    // The containers whose labels and state the watcher reconciles against.
    virtual std::vector<reaper::ContainerSummary> list_containers(const reaper::ListOptions& options) = 0;
    // By full id, name or unique id prefix, as the engine resolves them; the door pins the
    // full id before it calls, so a name it was given never reaches a destructive call.
    virtual reaper::ContainerInfo inspect(const std::string& id) = 0;
    // Destructive: only the door (guard.hpp) calls these, with the id an inspect returned.
    // A container already stopped is not an error for stop(); it kills after `grace`.
    virtual void stop(const std::string& id, std::chrono::seconds grace) = 0;
    virtual void kill(const std::string& id, const std::string& signal) = 0;
    virtual void remove(const std::string& id, const reaper::RemoveOptions& options) = 0;
    // The live stream the watcher follows; closing the port ends it (next() returns nullopt).
    virtual std::unique_ptr<reaper::EventStream> events(const reaper::EventsOptions& options) = 0;

    virtual std::vector<reaper::NetworkInfo> list_networks(const reaper::Filters& filters) = 0;
    virtual reaper::NetworkInfo inspect_network(const std::string& id) = 0;
    // Refused while containers are attached (Docker: 403, BadRequest).
    virtual void remove_network(const std::string& id) = 0;
    virtual std::vector<reaper::VolumeInfo> list_volumes(const reaper::Filters& filters) = 0;
    virtual reaper::VolumeInfo inspect_volume(const std::string& name) = 0;
    // Refused while any container uses it, running or not (409, Conflict).
    virtual void remove_volume(const std::string& name) = 0;

    // Idempotent, never throws; every call after it throws reaper::ClientClosed and every
    // open events stream ends, which is how the daemon cuts short a call in flight at exit.
    virtual void close() noexcept = 0;
};

// ---- where the engine keeps a container's log ---------------------------------------------
// The engine's on-disk layout (LogFiles, locate_log, is_rotation, data_root_of_json_log) is
// the library's (log_location.hpp), shared with reaperctl's `logs`.
using reaper::data_root_of_json_log;
using reaper::is_rotation;
using reaper::locate_log;
using reaper::LogFiles;

// The port over the library's client (reaperd's main wires it): the library already speaks
// the engine's dialect, so each call passes straight through. `engine` must outlive the
// adapter.
class EngineAdapter final : public EnginePort {
public:
    explicit EngineAdapter(reaper::Client& engine) : engine_(engine) {}

    reaper::EngineInfo info() override;
    std::vector<reaper::ContainerSummary> list_containers(const reaper::ListOptions& options) override;
    reaper::ContainerInfo inspect(const std::string& id) override;
    void stop(const std::string& id, std::chrono::seconds grace) override;
    void kill(const std::string& id, const std::string& signal) override;
    void remove(const std::string& id, const reaper::RemoveOptions& options) override;
    std::unique_ptr<reaper::EventStream> events(const reaper::EventsOptions& options) override;
    std::vector<reaper::NetworkInfo> list_networks(const reaper::Filters& filters) override;
    reaper::NetworkInfo inspect_network(const std::string& id) override;
    void remove_network(const std::string& id) override;
    std::vector<reaper::VolumeInfo> list_volumes(const reaper::Filters& filters) override;
    reaper::VolumeInfo inspect_volume(const std::string& name) override;
    void remove_volume(const std::string& name) override;
    void close() noexcept override;

private:
    reaper::Client& engine_;
};

}  // namespace reaperd
