// reaperd: parse the command line, load the config, run the daemon, map failures to exit
// codes (sysexits: 64 usage, 78 config, 1 any other start-up failure).
#include "config.hpp"
#include "daemon.hpp"
#include "log.hpp"

#include <reaper/client.hpp>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

namespace {

constexpr int exit_usage = 64;
constexpr int exit_config = 78;

const char* usage_text =
    "Usage: reaperd --config FILE [--check-config]\n"
    "       reaperd --version | --help\n"
    "\n"
    "Reaps the Docker containers of ended sessions: containers labeled with one of\n"
    "sessions.labels (default reaperd.session=SESSION) are removed once their session ends\n"
    "(its last lease closed and lease_grace passed, it was ended explicitly, or max_age\n"
    "passed). Containers without such a label are never stopped, killed or removed.\n"
    "\n"
    "  --config FILE     the YAML config (every key: /etc/reaperd/reaperd.yaml)\n"
    "  --check-config    validate the config, print every problem, exit (78 if bad)\n"
    "  --version         print the version\n"
    "  --help            print this\n"
    "\n"
    "Runs in the foreground. SIGHUP re-reads the config; SIGTERM stops after removals in\n"
    "flight. The engine is engine.host, else $DOCKER_HOST, else unix:///var/run/docker.sock;\n"
    "its API version is negotiated unless engine.api_version or $DOCKER_API_VERSION pins it.\n";

void print_problems(const reaperd::ConfigError& e) {
    for (const auto& p : e.problems()) std::fprintf(stderr, "%s\n", p.to_string().c_str());
}

}  // namespace

int main(int argc, char** argv) {
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
    if (config_path.empty()) {
        std::fprintf(stderr, "reaperd: --config FILE is required\n%s", usage_text);
        return exit_usage;
    }

    reaperd::Config config;
    try {
        config = reaperd::load_config(config_path);
    } catch (const reaperd::ConfigError& e) {
        print_problems(e);
        return exit_config;
    }
    if (check_only) {
        std::printf("%s: OK\n", config_path.c_str());
        return 0;
    }

    // The engine's address and API version may come from the environment (DOCKER_HOST,
    // DOCKER_API_VERSION), which is configuration too: a bad value exits 78, named.
    reaper::ClientOptions client_options;
    try {
        client_options.address = config.engine.host.empty()
                                     ? reaper::EngineAddress::from_environment()
                                     : reaper::EngineAddress::parse(config.engine.host);
        client_options.pinned_api_version = config.engine.api_version.empty()
                                                ? reaper::api_version_from_environment()
                                                : config.engine.api_version;
    } catch (const std::invalid_argument& e) {
        std::fprintf(stderr, "reaperd: %s\n", e.what());
        return exit_config;
    }
    client_options.request_timeout = config.engine.request_timeout;

    // A peer that hangs up must cost an EPIPE on that socket, never the process.
    std::signal(SIGPIPE, SIG_IGN);
    try {
        reaper::Client client(client_options);
        reaperd::DaemonOptions options;
        options.config_path = config_path;
        options.engine_address = client_options.address.to_string();
        reaperd::Daemon daemon(std::move(config), client, options);
        return daemon.run();
    } catch (const std::exception& e) {
        reaperd::log(reaperd::Priority::err, {}, std::string("cannot run: ") + e.what());
        return 1;
    }
}
