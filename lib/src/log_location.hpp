// Where a Docker engine keeps a container's log on disk: the json-file and local drivers'
// files, from what an inspect says and the engine's data root.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace reaper {

// The engine's on-disk layout, read from what an inspect says (LogPath, the log driver) and
// the data root (GET /info's DockerRootDir): reaperd's log capper and reaperctl's `logs` read
// it from here only.

struct LogFiles {
    std::string dir;        // the directory holding the live file and its rotations
    std::string live_name;  // the file the driver appends to, inside `dir`
};

// The files of a container's log, or nullopt for drivers that write none reaperd can cap or
// reaperctl read (journald, syslog, none, fluentd, ...). json-file uses `log_path` (or, while the
// engine has not set it yet because the container never started,
// <root>/containers/<id>/<id>-json.log); local uses <root>/containers/<id>/local-logs/
// container.log. An id that is not plain hex is refused, so no path can escape the root.
std::optional<LogFiles> locate_log(const std::string& id, const std::string& log_driver,
                                   const std::string& log_path, const std::string& docker_root_dir);

// True when `name` is a rotation of `live_name` as json-file and local write them:
// "<live>.<N>" or "<live>.<N>.gz" with N a positive number.
bool is_rotation(std::string_view name, std::string_view live_name);

// The data root a json-file container's LogPath reveals (<root>/containers/<id>/<id>-json.log),
// so the local driver's files can be found before info() has answered; nullopt when the path
// is not of that shape.
std::optional<std::string> data_root_of_json_log(const std::string& id, const std::string& log_path);

}  // namespace reaper
