#include "engine_port.hpp"

namespace reaperd {

reaper::EngineInfo EngineAdapter::info() { return engine_.info(); }

std::vector<reaper::ContainerSummary> EngineAdapter::list_containers(const reaper::ListOptions& options) {
    return engine_.list_containers(options);
}

reaper::ContainerInfo EngineAdapter::inspect(const std::string& id) { return engine_.inspect(id); }

void EngineAdapter::stop(const std::string& id, std::chrono::seconds grace) { engine_.stop(id, grace); }

void EngineAdapter::kill(const std::string& id, const std::string& signal) { engine_.kill(id, signal); }

void EngineAdapter::remove(const std::string& id, const reaper::RemoveOptions& options) {
    engine_.remove(id, options);
}

std::unique_ptr<reaper::EventStream> EngineAdapter::events(const reaper::EventsOptions& options) {
    return engine_.events(options);
}

std::vector<reaper::NetworkInfo> EngineAdapter::list_networks(const reaper::Filters& filters) {
    return engine_.list_networks(filters);
}

reaper::NetworkInfo EngineAdapter::inspect_network(const std::string& id) { return engine_.inspect_network(id); }

void EngineAdapter::remove_network(const std::string& id) { engine_.remove_network(id); }

std::vector<reaper::VolumeInfo> EngineAdapter::list_volumes(const reaper::Filters& filters) {
    return engine_.list_volumes(filters);
}

reaper::VolumeInfo EngineAdapter::inspect_volume(const std::string& name) { return engine_.inspect_volume(name); }

void EngineAdapter::remove_volume(const std::string& name) { engine_.remove_volume(name); }

void EngineAdapter::close() noexcept { engine_.close(); }

}  // namespace reaperd
