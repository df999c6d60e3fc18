#include <reaper/log_rotation.hpp>

#include <reaper/units.hpp>

#include <stdexcept>
#include <string>

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

std::optional<std::uint64_t> engine_rotation_bound(std::string_view driver,
                                                   const std::map<std::string, std::string>& options) {
    // moby daemon/logger/local/local.go: defaultMaxFileSize 20 MiB, defaultMaxFileCount 5.
    constexpr std::uint64_t local_default_size = 20 * 1024 * 1024;
    constexpr std::uint64_t local_default_files = 5;
    if (driver != "json-file" && driver != "local") return std::nullopt;
    const auto size = options.find("max-size");
    const auto files = options.find("max-file");
    if (driver == "json-file" && size == options.end()) return std::nullopt;  // never rotated
    try {
        const std::uint64_t bytes = size == options.end() ? local_default_size : parse_docker_size(size->second);
        std::uint64_t count = driver == "local" ? local_default_files : 1;
        if (files != options.end()) {
            std::size_t used = 0;
            const auto n = std::stoll(files->second, &used);
            if (used != files->second.size() || n < 1) return std::nullopt;
            count = static_cast<std::uint64_t>(n);
        }
        if (bytes == 0) return std::nullopt;  // max-size 0 (or -1 in moby's reading): no rotation
        return bytes * count;
    } catch (const std::exception&) {
        return std::nullopt;
    }
}

}  // namespace reaper
