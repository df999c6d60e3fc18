// The test harness: a private, real dockerd for each test process, and helpers the
// integration tests share. Nothing here skips: if an engine cannot be started, the test
// fails with the engine's log.
#pragma once

#include <reaper/client.hpp>

#include <cstddef>
#include <ostream>
#include <string>

namespace reaper::test {

// Which engine the harness runs, from REAPER_TEST_ENGINE:
//   docker          the default, also when unset or empty: Debian 12's dockerd 20.10, the host's
//   docker-trixie   Debian 13's Docker 26.1, with its own CLI and Compose v2
//   docker-sid      Debian unstable's Docker (28.5 when this was written), its CLI and Compose v2
//   podman          the podman first in PATH (`podman system service`): Debian 12's 4.3, or
//                   Debian 13's 5.4 under scripts/test-podman.sh --engine trixie, or Debian
//                   unstable's (5.8 when this was written) under --engine sid
// The two newer Dockers are unpacked by scripts/fetch-engines.sh into
// $REAPERD_TEST_CACHE/engines/<suite>/root (default /var/cache/reaperd-test). Any other value,
// or an engine not fetched (or fetched and found not to run here), fails the test that asks,
// naming the choices or what to run: nothing is skipped silently.
enum class EngineKind { docker, podman };
const char* to_string(EngineKind kind);
inline std::ostream& operator<<(std::ostream& out, EngineKind kind) { return out << to_string(kind); }

struct TestEngine {
    EngineKind kind = EngineKind::docker;
    std::string name = "docker";  // as REAPER_TEST_ENGINE spells it
    std::string root;             // "" = the host's /usr; else the unpacked engine's root
    // The docker CLI that comes with the engine (Debian 12's for docker and podman).
    std::string docker_cli() const;
    // Compose v2, standalone, and the dir holding its CLI plugin (`docker compose`): both ""
    // for the host's engines, whose Debian 12 Compose is the Python 1.29.
    std::string compose_v2() const;
    std::string cli_plugins_dir() const;
};
// REAPER_TEST_ENGINE, read once per process.
const TestEngine& test_engine();
EngineKind test_engine_kind();

// The node_modules dir holding testcontainers-node (scripts/fetch-testcontainers.sh), for
// NODE_PATH. Throws, naming the script to run, when it has not been fetched.
std::string testcontainers_node_modules();

// One engine in its own temp dir, run by a guard script: tests/harness/engine-guard (a
// dockerd) or, under REAPER_TEST_ENGINE=podman, tests/harness/podman-guard (`podman system
// service`, Podman's Docker-compatible API). The guard stops the engine by its pid and
// removes the dir when this object is destroyed, and also when the test process dies any
// other way (its stdin pipe closes). Both answer on <dir>/docker.sock.
class PrivateEngine {
public:
    PrivateEngine();  // starts the engine and imports the test image
    // A dockerd (whatever REAPER_TEST_ENGINE says) that also serves TLS with --tlsverify on a
    // loopback port, with the files in `tls_dir` (engine-guard's REAPER_ENGINE_TLS_DIR).
    explicit PrivateEngine(const std::string& tls_dir);
    ~PrivateEngine();
    PrivateEngine(const PrivateEngine&) = delete;
    PrivateEngine& operator=(const PrivateEngine&) = delete;

    EngineKind kind() const { return kind_; }
    // The engine's own version (GET /version's Version: "20.10.24+dfsg1", "26.1.5+dfsg1",
    // "4.3.1"), and its major number, for expectations stated per engine.
    const std::string& version() const;
    int major_version() const;
    const std::string& dir() const { return dir_; }
    // Where the engine keeps containers: dockerd's --data-root (its DockerRootDir), podman's
    // --root (its graph root; a container's log is vfs-containers/<id>/userdata/ctr.log).
    std::string data_root() const { return dir_ + (kind_ == EngineKind::podman ? "/root" : "/data"); }
    std::string socket_path() const { return dir_ + "/docker.sock"; }
    // The dockerd's pid, from its pid file (for its CPU time in /proc); -1 for Podman, whose
    // service writes none, or while the engine is down.
    int daemon_pid() const;
    std::string address() const { return "unix://" + socket_path(); }
    ClientOptions client_options() const;
    // A shell command running the podman CLI with `args` on this Podman: rootful, as its own
    // process on the service's storage (what `podman logs` is on a host: it reads the file
    // itself); rootless, through the service's socket (`--remote`), the storage being the
    // plain user's.
    std::string podman_cli(const std::string& args) const;
    // "tcp://127.0.0.1:PORT" of an engine made with a tls_dir, else "".
    const std::string& tls_address() const { return tls_address_; }

    // Fault injection: SIGKILL the engine, then start it again on the same dirs.
    void kill();
    void start();

    // A busybox image made offline (sh, sleep, yes, echo, cat, true, false, ...).
    static constexpr const char* image = "reaper-test/busybox:latest";

private:
    PrivateEngine(EngineKind kind, const std::string& tls_dir);
    std::string command(const std::string& line);
    struct Guard;
    EngineKind kind_;
    Guard* guard_;
    mutable std::string version_;
    std::string dir_;
    std::string tls_address_;
};

// The test process's engine, started on first use and stopped at exit.
PrivateEngine& engine();

// RECIPES section 7: an immutable file in a container's writable layer on engine() makes
// every remove of it fail with a real 500 ("driver "vfs" failed to remove root filesystem"),
// force or not, until release(). The destructor releases it whatever happened: the file
// would also keep the guard from removing the engine's dir. Docker's vfs layout only.
class RemovalPin {
public:
    // Throws, naming what failed, when the container's layer is not found or chattr refuses.
    explicit RemovalPin(const std::string& container_id);
    ~RemovalPin();
    RemovalPin(const RemovalPin&) = delete;
    RemovalPin& operator=(const RemovalPin&) = delete;

    // Removes can succeed again. Throws when chattr refuses; a second call does nothing.
    void release();

private:
    std::string path_;
};

// A Docker release as the Engine API shows it: its version and the API versions it accepts.
struct EngineProfile {
    std::string name;             // for messages: "Docker 29.0"
    std::string min_api_version;  // "1.44"
    std::string max_api_version;  // "1.52"
    std::string engine_version;   // "29.0.0"
};

// The test process's engine presented as another Docker release: an engine_front
// (tests/harness/engine_front.cpp) child process in its own temp dir, in front of
// engine().socket_path(). It answers version checks, /version and /_ping as that release
// would and forwards everything else, unversioned, to the private engine. The constructor
// returns once /_ping answers through it; the destructor stops it by its pid (SIGTERM, then
// SIGKILL) and removes the dir. It also ends when the test process dies.
class EngineFront {
public:
    explicit EngineFront(EngineProfile profile);
    ~EngineFront();
    EngineFront(const EngineFront&) = delete;
    EngineFront& operator=(const EngineFront&) = delete;

    const EngineProfile& profile() const { return profile_; }
    std::string socket_path() const { return dir_ + "/docker.sock"; }
    std::string address() const { return "unix://" + socket_path(); }
    ClientOptions client_options() const;
    // What the front wrote (its start line, anything it failed on).
    std::string log_text() const;

private:
    void stop() noexcept;

    EngineProfile profile_;
    std::string dir_;
    int pid_ = -1;
};

// Imports the busybox test image into the engine behind `client`.
void import_busybox_image(Client& client, const std::string& reference);

// Open file descriptors of this process right now.
std::size_t open_fd_count();

// A name unique in this test run: prefix-<pid>-<counter>.
std::string unique_name(const std::string& prefix);

}  // namespace reaper::test
