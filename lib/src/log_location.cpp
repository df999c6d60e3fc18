#include "log_location.hpp"

#include <algorithm>

namespace reaper {

namespace {
bool is_hex_id(const std::string& id) {
    return !id.empty() && id.size() <= 128 &&
           std::all_of(id.begin(), id.end(), [](char c) {
               return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
           });
}
}  // namespace

std::optional<LogFiles> locate_log(const std::string& id, const std::string& log_driver,
                                   const std::string& log_path, const std::string& docker_root_dir) {
    if (log_driver == "json-file" || (log_driver.empty() && !log_path.empty())) {
        if (!log_path.empty()) {
            auto slash = log_path.rfind('/');
            if (log_path[0] != '/' || slash == std::string::npos || slash + 1 == log_path.size())
                return std::nullopt;
            return LogFiles{slash == 0 ? "/" : log_path.substr(0, slash), log_path.substr(slash + 1)};
        }
        if (docker_root_dir.empty() || !is_hex_id(id)) return std::nullopt;
        return LogFiles{docker_root_dir + "/containers/" + id, id + "-json.log"};
    }
    if (log_driver == "local") {
        if (docker_root_dir.empty() || !is_hex_id(id)) return std::nullopt;
        return LogFiles{docker_root_dir + "/containers/" + id + "/local-logs", "container.log"};
    }
    return std::nullopt;
}

bool is_rotation(std::string_view name, std::string_view live_name) {
    if (name.size() <= live_name.size() + 1 || name.substr(0, live_name.size()) != live_name ||
        name[live_name.size()] != '.')
        return false;
    auto rest = name.substr(live_name.size() + 1);
    if (rest.size() > 3 && rest.substr(rest.size() - 3) == ".gz") rest.remove_suffix(3);
    return !rest.empty() && rest[0] != '0' &&
           std::all_of(rest.begin(), rest.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::optional<std::string> data_root_of_json_log(const std::string& id, const std::string& log_path) {
    const std::string tail = "/containers/" + id + "/" + id + "-json.log";
    if (id.empty() || log_path.size() <= tail.size() ||
        log_path.compare(log_path.size() - tail.size(), tail.size(), tail) != 0)
        return std::nullopt;
    return log_path.substr(0, log_path.size() - tail.size());
}

}  // namespace reaper
