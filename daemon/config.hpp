// reaperd's configuration: the YAML file parsed into plain structs, then validated.
// Every key, its meaning and its default is documented in config/reaperd.yaml, and a test
// checks that file against the defaults below.
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace reaperd {

using Duration = std::chrono::milliseconds;

struct EngineConfig {
    std::string host;  // "" = $DOCKER_HOST, else unix:///var/run/docker.sock
    Duration request_timeout{std::chrono::seconds{30}};
};

struct ControlConfig {
    std::string socket = "/run/reaperd/control.sock";
    std::string group;  // "" = the daemon's own group; the socket is mode 0660
};

struct StateConfig {
    std::string dir = "/var/lib/reaperd";
};

struct SessionsConfig {
    // A container is session-owned iff it carries one of these label keys; the value is
    // its session id.
    std::vector<std::string> labels{"reaperd.session"};
    Duration lease_grace{std::chrono::seconds{10}};
    Duration max_age{0};          // 0 = off; label reaperd.max-age overrides per container
    Duration unclaimed_grace{0};  // 0 = off: sessions that never leased are left alone
    Duration tombstone_ttl{std::chrono::hours{24}};
};

struct ReaperConfig {
    bool dry_run = false;
    Duration resync_interval{std::chrono::seconds{60}};
    Duration retry_initial{std::chrono::seconds{1}};
    Duration retry_max{std::chrono::seconds{60}};
    unsigned concurrency = 4;          // removals in flight at once
    unsigned error_after_attempts = 10;  // failures before a retry is logged as an error
};

enum class LogAction { truncate, stop, kill, remove };
enum class LogScope { sessions, all };

struct LogsConfig {
    std::uint64_t max_size_bytes = 0;  // 0 = caps off; label reaperd.log-max-size overrides
    LogAction action = LogAction::truncate;
    LogScope scope = LogScope::sessions;
    std::uint64_t total_max_size_bytes = 0;  // 0 = no budget over all capped containers
    Duration check_interval{std::chrono::seconds{1}};  // the periodic backstop
};

struct MetricsConfig {
    std::string listen;  // "" = no HTTP listener; else "127.0.0.1:9324"
};

struct Config {
    EngineConfig engine;
    ControlConfig control;
    StateConfig state;
    SessionsConfig sessions;
    ReaperConfig reaper;
    LogsConfig logs;
    MetricsConfig metrics;
};

// One problem in a config file, located.
struct ConfigProblem {
    std::string file;
    int line = 0;    // 1-based; 0 when unknown
    int column = 0;  // 1-based
    std::string key; // dotted path, e.g. "sessions.lease_grace"
    std::string message;  // what was expected / what is wrong
    std::string to_string() const;  // "file:line:column: key: message"
};

// All the problems found in one file, reported at once.
class ConfigError : public std::runtime_error {
public:
    explicit ConfigError(std::vector<ConfigProblem> problems);
    const std::vector<ConfigProblem>& problems() const noexcept { return problems_; }

private:
    std::vector<ConfigProblem> problems_;
};

// Parses YAML text (`file` names it in errors). Missing keys take their defaults; unknown
// keys, wrong types, bad units and invalid values are problems. Throws ConfigError listing
// every problem found.
Config parse_config(std::string_view yaml_text, const std::string& file);
// Reads and parses a file; an unreadable file is a ConfigError too.
Config load_config(const std::string& path);

// "500ms", "10s", "5m", "2h", "1d", "0" -> milliseconds. Throws std::invalid_argument.
Duration parse_duration(std::string_view text);
// "0", "1024", "10KiB", "10MiB", "1GiB", "1G", "10M", "100k" -> bytes (K/M/G and KiB/MiB/GiB
// all binary, as docker's max-size is). Throws std::invalid_argument.
std::uint64_t parse_size(std::string_view text);
std::string format_duration(Duration d);
std::string format_size(std::uint64_t bytes);

}  // namespace reaperd
