// reaperd: parse the command line, load the config, run the daemon, map failures to exit
// codes (sysexits: 64 usage, 78 config, 1 any other start-up failure).
#include "config.hpp"
#include "daemon.hpp"
#include "log.hpp"
#include "user_defaults.hpp"

#include <reaper/client.hpp>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <malloc.h>
#include <optional>
#include <string>
#include <unistd.h>

namespace {

constexpr int exit_usage = 64;
constexpr int exit_config = 78;

const char* usage_text =
    "Usage: reaperd [--config FILE] [--check-config]\n"
    "       reaperd --version | --help\n"
    "\n"
    "Reaps the Docker containers of ended sessions: containers labeled with one of\n"
    "sessions.labels (default reaperd.session=SESSION) are removed once their session ends\n"
    "(its last lease closed and lease_grace passed, it was ended explicitly, or max_age\n"
    "passed). Containers without such a label are never stopped, killed or removed.\n"
    "\n"
    "  --config FILE     the YAML config (every key: /etc/reaperd/reaperd.yaml); without it\n"
    "                    /etc/reaperd/reaperd.yaml, or for a user other than root the first of\n"
    "                    $XDG_CONFIG_HOME/reaperd/reaperd.yaml (~/.config) and that one\n"
    "  --check-config    validate the config, print every problem, exit (78 if bad)\n"
    "  --version         print the version\n"
    "  --help            print this\n"
    "\n"
    "Runs in the foreground. SIGHUP re-reads the config; SIGTERM stops after removals in\n"
    "flight. The engine is engine.host, else $DOCKER_HOST, else unix:///var/run/docker.sock\n"
    "for root, and for another user the first of $XDG_RUNTIME_DIR/docker.sock and\n"
    "$XDG_RUNTIME_DIR/podman/podman.sock that answers. A user's reaperd listens on\n"
    "$XDG_RUNTIME_DIR/reaperd/control.sock, keeps its state in $XDG_STATE_HOME/reaperd\n"
    "(~/.local/state) and serves that user only (control.allow_root admits root);\n"
    "its API version is negotiated unless engine.api_version or $DOCKER_API_VERSION pins it.\n"
    "TLS to a tcp:// engine uses the files in engine.tls_cert_path, else, when\n"
    "$DOCKER_TLS_VERIFY is set, in $DOCKER_CERT_PATH (or ~/.docker); plain TCP to another\n"
    "host is refused unless engine.allow_plain_tcp is true.\n";

void print_problems(const reaperd::ConfigError& e) {
    for (const auto& p : e.problems()) std::fprintf(stderr, "%s\n", p.to_string().c_str());
}

}  // namespace

int main(int argc, char** argv) {
    // Two malloc arenas instead of glibc's 8 per core: reaperd's ~30 threads (reaper pool,
    // inspect pool, control server, watcher, log capper) allocate little and rarely at the same
    // time, but each arena keeps what its thread freed. Before it, scripts/load.sh at 1,000
    // leases peaked at 65.8 MB of RSS, ~20 KB per tracked container.
    ::mallopt(M_ARENA_MAX, 2);
    std::string config_path;
    bool check_only = false;
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg == "--version") {
            std::printf("reaperd %s\n", REAPER_VERSION);
            return 0;
        } else if (arg == "--help" || arg == "-h") {
            std::fputs(usage_text, stdout);
            return 0;
        } else if (arg == "--check-config") {
            check_only = true;
        } else if (arg == "--config" && i + 1 < argc) {
            config_path = argv[++i];
        } else if (arg.rfind("--config=", 0) == 0) {
            config_path = arg.substr(9);
        } else {
            std::fprintf(stderr, "reaperd: unknown or incomplete argument \"%s\"\n%s",
                         arg.c_str(), usage_text);
            return exit_usage;
        }
    }
    // Where this user's files are when neither the command line nor the file says: pure
    // (user_defaults.hpp); a user without XDG_RUNTIME_DIR has no private place for the socket.
    namespace defaults = reaper::defaults;
    const uid_t uid = ::geteuid();
    reaperd::Config config_defaults;
    try {
        const defaults::DaemonPaths paths = defaults::daemon_paths(uid, defaults::process_environment);
        config_defaults.control.socket = paths.control_socket;
        config_defaults.state.dir = paths.state_dir;
    } catch (const defaults::DefaultsError& e) {
        std::fprintf(stderr, "reaperd: %s\n", e.what());
        return exit_config;
    }
    if (config_path.empty()) {
        const auto files = defaults::config_files(uid, defaults::process_environment);
        for (const std::string& file : files) {
            if (::access(file.c_str(), F_OK) == 0) {
                config_path = file;
                break;
            }
        }
        if (config_path.empty()) {
            std::string looked;
            for (const std::string& file : files) looked += (looked.empty() ? "" : ", ") + file;
            std::fprintf(stderr, "reaperd: no config file: none of %s exists (or give --config FILE)\n",
                         looked.c_str());
            return exit_config;
        }
    }

    reaperd::Config config;
    try {
        config = reaperd::load_config(config_path, config_defaults);
    } catch (const reaperd::ConfigError& e) {
        print_problems(e);
        return exit_config;
    }
    if (check_only) {
        std::printf("%s: OK\n", config_path.c_str());
        return 0;
    }

    // The engine's address, API version and TLS may come from the environment (DOCKER_HOST,
    // DOCKER_API_VERSION, DOCKER_TLS_VERIFY and DOCKER_CERT_PATH), which is configuration
    // too: a bad value exits 78, named.
    reaper::ClientOptions client_options;
    const bool host_in_file = !config.engine.host.empty();
    const bool tls_in_file = !config.engine.tls_cert_path.empty();
    try {
        if (host_in_file) {
            client_options.address = reaper::EngineAddress::parse(config.engine.host);
        } else if (auto engine = defaults::choose_engine(uid, defaults::process_environment, defaults::socket_answers)) {
            client_options.address = reaper::EngineAddress::parse(*engine);
        } else {
            // A user's engine that is not up yet: exit 1, so that systemd restarts reaperd
            // until it is (the user unit orders itself after podman.socket and docker).
            std::string tried;
            for (const auto& candidate : defaults::engine_candidates(uid, defaults::process_environment))
                tried += (tried.empty() ? "" : " or ") + candidate;
            std::fprintf(stderr, "reaperd: no engine answers at %s; start one or set DOCKER_HOST or engine.host\n",
                         tried.empty() ? "(no XDG_RUNTIME_DIR)" : tried.c_str());
            return 1;
        }
        client_options.pinned_api_version = config.engine.api_version.empty()
                                                ? reaper::api_version_from_environment()
                                                : config.engine.api_version;
        client_options.tls = tls_in_file ? reaper::TlsOptions::in_directory(config.engine.tls_cert_path)
                                         : reaper::TlsOptions::from_environment();
    } catch (const std::invalid_argument& e) {
        std::fprintf(stderr, "reaperd: %s\n", e.what());
        return exit_config;
    }
    client_options.allow_plain_tcp = config.engine.allow_plain_tcp;
    client_options.request_timeout = config.engine.request_timeout;

    // A refused address and TLS files that cannot be used are found only now, yet are the
    // configuration's fault: 78, against the key (located in the file) or the variable that
    // set them.
    auto refused = [&](bool in_file, const std::string& key, const char* variable, const std::string& message) {
        if (in_file)
            std::fprintf(stderr, "%s\n", reaperd::locate_problem(config_path, key, message).to_string().c_str());
        else
            std::fprintf(stderr, "reaperd: %s: %s\n", variable, message.c_str());
        return exit_config;
    };
    try {
        reaper::check_plain_tcp(client_options);
    } catch (const std::invalid_argument& e) {
        return refused(host_in_file, "engine.host", "DOCKER_HOST", e.what());
    }
    std::optional<reaper::Client> client;
    try {
        client.emplace(client_options);  // reads the TLS files; plain TCP passed above
    } catch (const std::invalid_argument& e) {
        return refused(tls_in_file, "engine.tls_cert_path", "DOCKER_CERT_PATH", e.what());
    }

    // A peer that hangs up must cost an EPIPE on that socket, never the process.
    std::signal(SIGPIPE, SIG_IGN);
    try {
        reaperd::DaemonOptions options;
        options.config_path = config_path;
        options.config_defaults = config_defaults;
        options.engine_address = client_options.address.to_string();
        reaperd::EngineAdapter engine(*client);
        reaperd::Daemon daemon(std::move(config), engine, options);
        return daemon.run();
    } catch (const reaperd::ConfigValueError& e) {
        // Found only when put to use (no such group, an address taken): the file's fault all
        // the same, so 78 and its place in the file, and systemd does not restart in a loop.
        reaperd::log(reaperd::Priority::err, {},
                     "cannot run: " + reaperd::locate_problem(config_path, e.key(), e.message()).to_string());
        return exit_config;
    } catch (const std::exception& e) {
        reaperd::log(reaperd::Priority::err, {}, std::string("cannot run: ") + e.what());
        return 1;
    }
}
