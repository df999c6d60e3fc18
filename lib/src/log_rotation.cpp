#include <reaper/log_rotation.hpp>

#include <reaper/units.hpp>

#include <stdexcept>

namespace reaper {

bool driver_rotates(std::string_view driver) { return driver == "json-file" || driver == "local"; }

bool sets_rotation(const std::map<std::string, std::string>& options) {
    return options.contains("max-size") || options.contains("max-file");
}

std::uint64_t log_cap_for(const Labels& labels, std::uint64_t default_cap_bytes) {
    const auto label = labels.find(log_max_size_label);
    if (label == labels.end()) return default_cap_bytes;
    try {
        return parse_docker_size(label->second);
    } catch (const std::invalid_argument&) {
        return default_cap_bytes;  // reaperd warns about the label and applies its default
    }
}

std::map<std::string, std::string> rotation_options(std::uint64_t cap_bytes) {
    // Two files of half the cap each: the live one and the one rotation max-file = 2 keeps.
    const std::uint64_t half = cap_bytes / 2;
    if (half == 0) return {};
    return {{"max-size", std::to_string(half)}, {"max-file", "2"}};
}

}  // namespace reaper
