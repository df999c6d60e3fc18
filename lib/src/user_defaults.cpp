#include "user_defaults.hpp"

#include "unique_fd.hpp"

#include <cstdlib>
#include <cstring>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

namespace reaper::defaults {
namespace {

// An XDG variable's value, or nullopt when unset, empty or relative (the XDG spec: "If an
// implementation encounters a relative path in any of these variables it should consider the
// path invalid and ignore it").
std::optional<std::string> xdg(const Environment& env, const std::string& name) {
    std::optional<std::string> value = env(name);
    if (!value || value->empty() || value->front() != '/') return std::nullopt;
    return value;
}

// $name if set, else $HOME/fallback; nullopt without either.
std::optional<std::string> xdg_or_home(const Environment& env, const std::string& name, const std::string& fallback) {
    if (auto value = xdg(env, name)) return value;
    if (auto home = xdg(env, "HOME")) return *home + "/" + fallback;
    return std::nullopt;
}

std::string runtime_dir(const Environment& env) {
    auto dir = xdg(env, "XDG_RUNTIME_DIR");
    if (!dir)
        throw DefaultsError(
            "XDG_RUNTIME_DIR is not set to an absolute path: a reaperd of a user other than root keeps its "
            "control socket there (a login session and `systemctl --user` set it)");
    return *dir;
}

}  // namespace

std::vector<std::string> config_files(uid_t uid, const Environment& env) {
    std::vector<std::string> files;
    if (uid != 0) {
        if (auto dir = xdg_or_home(env, "XDG_CONFIG_HOME", ".config")) files.push_back(*dir + "/reaperd/reaperd.yaml");
    }
    files.push_back(system_config_file);
    return files;
}

DaemonPaths daemon_paths(uid_t uid, const Environment& env) {
    if (uid == 0) return {system_control_socket, system_state_dir};
    DaemonPaths paths;
    paths.control_socket = runtime_dir(env) + "/reaperd/control.sock";
    auto state = xdg_or_home(env, "XDG_STATE_HOME", ".local/state");
    if (!state)
        throw DefaultsError("neither XDG_STATE_HOME nor HOME is set to an absolute path: a reaperd of a user other "
                            "than root keeps its state there");
    paths.state_dir = *state + "/reaperd";
    return paths;
}

std::vector<std::string> engine_candidates(uid_t uid, const Environment& env) {
    if (auto host = env("DOCKER_HOST"); host && !host->empty()) return {*host};
    if (uid == 0) return {"unix:///var/run/docker.sock"};
    auto dir = xdg(env, "XDG_RUNTIME_DIR");
    if (!dir) return {};
    return {"unix://" + *dir + "/docker.sock", "unix://" + *dir + "/podman/podman.sock"};
}

std::optional<std::string> choose_engine(uid_t uid, const Environment& env, const SocketProbe& answers) {
    const std::vector<std::string> candidates = engine_candidates(uid, env);
    const auto host = env("DOCKER_HOST");
    if ((host && !host->empty()) || uid == 0) return candidates.front();
    for (const std::string& candidate : candidates) {
        if (answers(candidate.substr(std::strlen("unix://")))) return candidate;
    }
    return std::nullopt;
}

std::vector<std::string> client_socket_candidates(uid_t uid, const Environment& env) {
    if (auto path = env("REAPERD_SOCKET"); path && !path->empty()) return {*path};
    std::vector<std::string> candidates;
    if (uid != 0) {
        if (auto dir = xdg(env, "XDG_RUNTIME_DIR")) candidates.push_back(*dir + "/reaperd/control.sock");
    }
    candidates.push_back(system_control_socket);
    return candidates;
}

std::string client_socket(uid_t uid, const Environment& env, const SocketProbe& exists) {
    const std::vector<std::string> candidates = client_socket_candidates(uid, env);
    if (const auto path = env("REAPERD_SOCKET"); path && !path->empty()) return candidates.front();
    for (const std::string& candidate : candidates) {
        if (exists(candidate)) return candidate;
    }
    return candidates.front();
}

std::optional<std::string> process_environment(const std::string& name) {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
}

bool socket_answers(const std::string& path) {
    sockaddr_un address{};
    if (path.size() >= sizeof(address.sun_path)) return false;
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
    const detail::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    // A unix connect completes or fails at once: a stale socket file gives ECONNREFUSED.
    return fd && ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0;
}

bool socket_exists(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

}  // namespace reaper::defaults
