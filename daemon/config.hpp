// reaperd's configuration: the YAML file parsed into plain structs, then validated.
// Every key, its meaning and its default is documented in config/reaperd.yaml, and a test
// checks that file against the defaults below.
//
// Every duration is at most max_duration (parse_duration refuses more), so adding one to any
// clock's time_point cannot overflow; validation guarantees the other ranges documented in
// config/reaperd.yaml.
#pragma once

#include "vocabulary.hpp"

#include <reaper/log_rotation.hpp>
#include <reaper/units.hpp>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace reaperd {

using Duration = std::chrono::milliseconds;
using reaper::max_duration;

struct EngineConfig {
    std::string host;  // "" = $DOCKER_HOST, else unix:///var/run/docker.sock
    // A directory with ca.pem, cert.pem and key.pem: TLS with verification, as
    // DOCKER_TLS_VERIFY=1 DOCKER_CERT_PATH=dir. "" = as $DOCKER_TLS_VERIFY/$DOCKER_CERT_PATH say.
    std::string tls_cert_path;
    bool allow_plain_tcp = false;  // plain TCP to a host that is not local (else refused)
    Duration request_timeout{std::chrono::seconds{30}};
    std::string api_version;  // "" = $DOCKER_API_VERSION, else negotiate

    friend bool operator==(const EngineConfig&, const EngineConfig&) = default;
};

struct ControlConfig {
    // A user other than root: $XDG_RUNTIME_DIR/reaperd/control.sock (main passes it as the
    // default; lib/src/user_defaults.hpp).
    std::string socket = "/run/reaperd/control.sock";
    std::string group;  // "" = the daemon's own group; the socket is mode 0660
    // Connections served at once (leases included), lowered at start-up to fit the
    // descriptor limit (control_server.hpp fit_to_descriptors).
    unsigned max_connections = 4096;
    // Per uid (SO_PEERCRED, root included); 0 = no limit beyond max_connections. Validation
    // keeps each at most max_connections, and the lease limit at most the connection limit
    // (a lease is a connection). Defaults a CI host whose hundreds of sessions all run as one
    // uid does not reach, yet one uid cannot take every connection from the others.
    unsigned max_connections_per_uid = 3072;
    unsigned max_leases_per_uid = 2048;  // leases held at once by that uid's connections
    // A reaperd run by a user other than root serves that uid only (SO_PEERCRED); this admits
    // root as well. No effect on root's reaperd, whose socket's mode and group decide.
    bool allow_root = false;

    friend bool operator==(const ControlConfig&, const ControlConfig&) = default;
};

struct StateConfig {
    std::string dir = "/var/lib/reaperd";  // a user other than root: $XDG_STATE_HOME/reaperd

    friend bool operator==(const StateConfig&, const StateConfig&) = default;
};

struct SessionsConfig {
    // A container is session-owned iff it carries one of these label keys; the value is
    // its session id.
    std::vector<std::string> labels{"reaperd.session"};
    Duration lease_grace{std::chrono::seconds{10}};
    Duration max_age{0};          // 0 = off; label reaperd.max-age overrides per container
    Duration unclaimed_grace{0};  // 0 = off: sessions that never leased are left alone
    Duration tombstone_ttl{std::chrono::hours{24}};
    // Ended sessions remembered at most; past it the oldest go first, but never one whose
    // containers, networks, volumes or pending reaps are still there (policy.cpp decide()).
    unsigned max_tombstones = 10000;

    friend bool operator==(const SessionsConfig&, const SessionsConfig&) = default;
};

struct ReaperConfig {
    bool dry_run = false;
    Duration resync_interval{std::chrono::seconds{60}};
    Duration retry_initial{std::chrono::seconds{1}};
    Duration retry_max{std::chrono::seconds{60}};
    unsigned concurrency = 16;         // removals in flight at once (see reaperd.yaml)
    unsigned error_after_attempts = 10;  // failures before a retry is logged as an error

    friend bool operator==(const ReaperConfig&, const ReaperConfig&) = default;
};

// LogAction (logs.action) is a vocabulary of its own: vocabulary.hpp.
enum class LogScope { sessions, all };
std::string_view to_string(LogScope scope) noexcept;    // "sessions" or "all"

struct LogsConfig {
    // 0 = caps off; label reaperd.log-max-size overrides. On by default: a runaway writer
    // fills a disk in minutes, and no sane test log reaches 1GiB.
    std::uint64_t max_size_bytes = reaper::default_log_cap_bytes;
    LogAction action = LogAction::truncate;
    LogScope scope = LogScope::sessions;
    std::uint64_t total_max_size_bytes = 0;  // 0 = no budget over all capped containers
    Duration check_interval{std::chrono::seconds{1}};  // the periodic backstop
    // Tell a labelling proxy (`reaperctl run --own`, in the lease reply) to set Docker's own
    // rotation (max-size = half the cap, max-file = 2) on the json-file and local containers
    // it creates without one: a log the engine rotates needs no cut, and a cut from outside
    // stalls Docker 23+'s followers and `--tail` (issue 21).
    bool rotate_at_create = true;

    friend bool operator==(const LogsConfig&, const LogsConfig&) = default;
};

struct MetricsConfig {
    std::string listen;  // "" = no HTTP listener; else "127.0.0.1:9324"

    friend bool operator==(const MetricsConfig&, const MetricsConfig&) = default;
};

struct Config {
    EngineConfig engine;
    ControlConfig control;
    StateConfig state;
    SessionsConfig sessions;
    ReaperConfig reaper;
    LogsConfig logs;
    MetricsConfig metrics;

    friend bool operator==(const Config&, const Config&) = default;
};

// One problem in a config file, located.
struct ConfigProblem {
    std::string file;
    int line = 0;    // 1-based; 0 when unknown
    int column = 0;  // 1-based
    std::string key; // dotted path, e.g. "sessions.lease_grace"
    std::string message;  // what was expected / what is wrong
    // "file:line:column: key: message"; the location is left out when unknown (line 0),
    // the key when empty (a YAML syntax error or an unreadable file).
    std::string to_string() const;
};

// All the problems found in one file, reported at once, in file order; what() lists them
// one per line.
class ConfigError : public std::runtime_error {
public:
    explicit ConfigError(std::vector<ConfigProblem> problems);
    const std::vector<ConfigProblem>& problems() const noexcept { return problems_; }

private:
    std::vector<ConfigProblem> problems_;
};

// A value that parsed and validated, yet fails when reaperd puts it to use at start-up (a
// control.group that does not exist, a metrics.listen address that will not bind): still
// a configuration error (exit 78), reported against its key.
class ConfigValueError : public std::runtime_error {
public:
    ConfigValueError(std::string key, const std::string& message)
        : std::runtime_error(key + ": " + message), key_(std::move(key)), message_(message) {}
    const std::string& key() const noexcept { return key_; }
    const std::string& message() const noexcept { return message_; }

private:
    std::string key_;
    std::string message_;
};

// The problem `message` with the dotted `key`, located where `file` sets that key (line 0,
// unlocated, when the file does not set it or cannot be read again).
ConfigProblem locate_problem(const std::string& file, const std::string& key, const std::string& message);

// Parses YAML text (`file` names it in errors). Missing keys take their value in `defaults`
// (a user's reaperd passes its own control.socket and state.dir: user_defaults.hpp); unknown
// keys, wrong types, bad units and invalid values are problems. Throws ConfigError listing
// every problem found.
Config parse_config(std::string_view yaml_text, const std::string& file, const Config& defaults = Config{});
// Reads and parses a file; an unreadable file is a ConfigError too.
Config load_config(const std::string& path, const Config& defaults = Config{});

// The config as YAML with every key (no comments), for --check-config to show the
// effective config; parse_config(format_config(c), ...) == c.
std::string format_config(const Config& config);
// Every key the file may hold, dotted ("sessions.lease_grace"), in file order.
std::vector<std::string> config_keys();

// Durations and sizes read and written in the one grammar of reaper/units.hpp (sizes binary).
using reaper::format_duration;
using reaper::format_size;
using reaper::parse_duration;
using reaper::parse_size;

// A docker label key reaperd accepts in sessions.labels: 1 to 255 characters of letters,
// digits, '.', '-', '_' and '/', starting and ending with a letter or digit
// ("reaperd.session", "org.testcontainers.sessionId").
bool label_key_valid(std::string_view key) noexcept;

}  // namespace reaperd
