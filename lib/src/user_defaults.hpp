// Internal to libreaper, reaperd and reaperctl (not installed): where reaperd's config, control
// socket, state and engine are by default, for the user the process runs as. One rule for the
// daemon and its clients (reaperctl, the library's Session); python/reaperd/control.py holds
// the same rule for the client side (tests/python/control_test.py checks it).
//
// root (uid 0) keeps the system paths: /etc/reaperd/reaperd.yaml, /run/reaperd/control.sock,
// /var/lib/reaperd, $DOCKER_HOST else unix:///var/run/docker.sock. Any other uid gets the
// XDG base directories (a rootless Podman or Docker belongs to one user, and so does the
// reaperd that watches it):
// - config: $XDG_CONFIG_HOME/reaperd/reaperd.yaml (~/.config), then /etc/reaperd/reaperd.yaml;
// - control socket: $XDG_RUNTIME_DIR/reaperd/control.sock;
// - state: $XDG_STATE_HOME/reaperd (~/.local/state);
// - engine: $DOCKER_HOST, else the first of $XDG_RUNTIME_DIR/docker.sock (rootless Docker) and
//   $XDG_RUNTIME_DIR/podman/podman.sock (rootless Podman) that answers.
// A relative XDG_* value counts as unset (as the XDG spec says). A user daemon with no
// XDG_RUNTIME_DIR has nowhere private for its socket: that is an error, never a fall-back to
// /run, where another user's reaperd could sit.
//
// Every function here is pure: the uid, the environment and the probe come in as arguments.
#pragma once

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/types.h>

namespace reaper::defaults {

// The value of an environment variable, nullopt when unset.
using Environment = std::function<std::optional<std::string>(const std::string& name)>;
// Whether something serves on the unix socket at `path`.
using SocketProbe = std::function<bool(const std::string& path)>;

// The defaults cannot be found for this user (the message names the variable).
class DefaultsError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

inline constexpr const char* system_config_file = "/etc/reaperd/reaperd.yaml";
inline constexpr const char* system_control_socket = "/run/reaperd/control.sock";
inline constexpr const char* system_state_dir = "/var/lib/reaperd";

// The config files reaperd reads when --config is not given, in order: it reads the first that
// exists.
std::vector<std::string> config_files(uid_t uid, const Environment& env);

struct DaemonPaths {
    std::string control_socket;
    std::string state_dir;
};
// Where reaperd listens and keeps its state by default. Throws DefaultsError for a non-root
// uid without an absolute XDG_RUNTIME_DIR, or without XDG_STATE_HOME and HOME.
DaemonPaths daemon_paths(uid_t uid, const Environment& env);

// The engine addresses to try, in order: [$DOCKER_HOST] when set, [unix:///var/run/docker.sock]
// for root, else the user's two sockets (none without XDG_RUNTIME_DIR).
std::vector<std::string> engine_candidates(uid_t uid, const Environment& env);
// The engine to watch: $DOCKER_HOST or root's socket as they are (never probed: the daemon
// waits for a fixed engine that is down), else the first user socket `answers` says serves;
// nullopt when none does.
std::optional<std::string> choose_engine(uid_t uid, const Environment& env, const SocketProbe& answers);

// Where a client finds reaperd, in order: [$REAPERD_SOCKET] when set and non-empty, else for a
// non-root uid $XDG_RUNTIME_DIR/reaperd/control.sock (when XDG_RUNTIME_DIR is set), then the
// system daemon's /run/reaperd/control.sock, which control.group may open to users.
std::vector<std::string> client_socket_candidates(uid_t uid, const Environment& env);
// The first candidate `exists` says is there; the first candidate when none is, so that the
// connection error names the socket this user's own daemon would have.
std::string client_socket(uid_t uid, const Environment& env, const SocketProbe& exists);

// The running process's inputs: getenv, and a probe that connects to the socket.
std::optional<std::string> process_environment(const std::string& name);
bool socket_answers(const std::string& path);
bool socket_exists(const std::string& path);

}  // namespace reaper::defaults
