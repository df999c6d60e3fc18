#include "config.hpp"

#include <boost/test/unit_test.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <unistd.h>

using namespace reaperd;
using namespace std::chrono_literals;

namespace {

const std::string shipped_config = std::string(REAPER_SOURCE_DIR) + "/config/reaperd.yaml";

// The problems parse_config reports for `yaml`, or none when it parses.
std::vector<ConfigProblem> problems_of(const std::string& yaml) {
    try {
        parse_config(yaml, "test.yaml");
    } catch (const ConfigError& e) {
        return e.problems();
    }
    return {};
}

std::string all_lines(const std::vector<ConfigProblem>& problems) {
    std::string out;
    for (const auto& p : problems)
        out += p.to_string() + "\n";
    return out;
}

// A file in the test's temp dir, removed at scope exit.
struct TempFile {
    std::string path;
    explicit TempFile(const std::string& text) {
        char name[] = "/tmp/reaperd-config-test-XXXXXX";
        const int fd = ::mkstemp(name);
        BOOST_REQUIRE(fd >= 0);
        ::close(fd);
        path = name;
        std::ofstream(path) << text;
    }
    ~TempFile() { std::remove(path.c_str()); }
};

}  // namespace

// ---- the shipped file ---------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(shipped_config_equals_compiled_defaults) {
    const Config loaded = load_config(shipped_config);
    // format_config names the differing key in the failure message; == covers every field.
    BOOST_TEST(format_config(loaded) == format_config(Config{}));
    BOOST_TEST((loaded == Config{}));
}

BOOST_AUTO_TEST_CASE(shipped_config_sets_and_explains_every_key) {
    const YAML::Node root = YAML::LoadFile(shipped_config);
    std::ifstream in(shipped_config);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);)
        lines.push_back(line);

    // The keys whose default follows the user reaperd runs as are shown commented out (so
    // that a user's reaperd reading this file keeps its own), with root's default.
    const std::map<std::string, std::string> per_user{{"control.socket", "  # socket: /run/reaperd/control.sock"},
                                                      {"state.dir", "  # dir: /var/lib/reaperd"}};
    for (const std::string& key : config_keys()) {
        BOOST_TEST_CONTEXT(key) {
            const std::string section = key.substr(0, key.find('.'));
            const std::string name = key.substr(key.find('.') + 1);
            if (auto it = per_user.find(key); it != per_user.end()) {
                BOOST_TEST(!root[section][name].IsDefined());
                BOOST_TEST((std::find(lines.begin(), lines.end(), it->second) != lines.end()));
                continue;
            }
            const YAML::Node value = root[section][name];
            BOOST_TEST_REQUIRE(value.IsDefined());
            // The line before the key is (the end of) a comment explaining it.
            const int line = root[section][name].Mark().line;  // 0-based
            BOOST_TEST_REQUIRE(line >= 1);
            const std::string& above = lines[static_cast<std::size_t>(line - 1)];
            const auto first = above.find_first_not_of(' ');
            BOOST_TEST((first != std::string::npos && above[first] == '#'), "line above: " << above);
        }
    }
}

BOOST_AUTO_TEST_CASE(default_log_cap_is_on) {
    BOOST_TEST(Config{}.logs.max_size_bytes == std::uint64_t{1} << 30);
}

// ---- whole files that parse ----------------------------------------------------------------

BOOST_AUTO_TEST_CASE(empty_and_comment_only_files_are_all_defaults) {
    BOOST_TEST((parse_config("", "empty.yaml") == Config{}));
    BOOST_TEST((parse_config("# nothing here\n\n", "c.yaml") == Config{}));
    BOOST_TEST((parse_config("---\n", "doc.yaml") == Config{}));
    // A section whose keys are all commented out.
    BOOST_TEST((parse_config("sessions:\n  # lease_grace: 1s\nmetrics:\n", "s.yaml") == Config{}));
}

BOOST_AUTO_TEST_CASE(every_key_set) {
    const Config c = parse_config(R"(
engine:
  host: tcp://127.0.0.1:2376
  tls_cert_path: /etc/reaperd/tls
  allow_plain_tcp: true
  request_timeout: 5s
control:
  socket: /run/r/ctl.sock
  group: docker
  max_connections: 2000
  max_connections_per_uid: 1000
  max_leases_per_uid: 0
state:
  dir: /srv/reaperd
sessions:
  labels: [reaperd.session, org.testcontainers.sessionId]
  lease_grace: 0
  max_age: 2h
  unclaimed_grace: 30m
  tombstone_ttl: 7d
  max_tombstones: 500
reaper:
  dry_run: true
  resync_interval: 5m
  retry_initial: 500ms
  retry_max: 2m
  concurrency: 16
  error_after_attempts: 3
logs:
  max_size: 10MiB
  action: kill
  scope: all
  total_max_size: 1G
  check_interval: 250ms
metrics:
  listen: 127.0.0.1:9324
)",
                                  "full.yaml");
    BOOST_TEST(c.engine.host == "tcp://127.0.0.1:2376");
    BOOST_TEST(c.engine.tls_cert_path == "/etc/reaperd/tls");
    BOOST_TEST(c.engine.allow_plain_tcp);
    BOOST_TEST(c.engine.request_timeout.count() == 5000);
    BOOST_TEST(c.control.socket == "/run/r/ctl.sock");
    BOOST_TEST(c.control.group == "docker");
    BOOST_TEST(c.control.max_connections == 2000u);
    BOOST_TEST(c.control.max_connections_per_uid == 1000u);
    BOOST_TEST(c.control.max_leases_per_uid == 0u);
    BOOST_TEST(c.state.dir == "/srv/reaperd");
    BOOST_TEST((c.sessions.labels == std::vector<std::string>{"reaperd.session", "org.testcontainers.sessionId"}));
    BOOST_TEST(c.sessions.lease_grace.count() == 0);
    BOOST_TEST((c.sessions.max_age == 2h));
    BOOST_TEST((c.sessions.unclaimed_grace == 30min));
    BOOST_TEST((c.sessions.tombstone_ttl == 7 * 24h));
    BOOST_TEST(c.sessions.max_tombstones == 500u);
    BOOST_TEST(c.reaper.dry_run);
    BOOST_TEST((c.reaper.resync_interval == 5min));
    BOOST_TEST((c.reaper.retry_initial == 500ms));
    BOOST_TEST((c.reaper.retry_max == 2min));
    BOOST_TEST(c.reaper.concurrency == 16u);
    BOOST_TEST(c.reaper.error_after_attempts == 3u);
    BOOST_TEST(c.logs.max_size_bytes == 10u << 20);
    BOOST_TEST((c.logs.action == LogAction::kill));
    BOOST_TEST((c.logs.scope == LogScope::all));
    BOOST_TEST(c.logs.total_max_size_bytes == 1u << 30);
    BOOST_TEST((c.logs.check_interval == 250ms));
    BOOST_TEST(c.metrics.listen == "127.0.0.1:9324");

    // format_config writes it back losslessly.
    BOOST_TEST((parse_config(format_config(c), "formatted.yaml") == c));
}

BOOST_AUTO_TEST_CASE(accepted_values) {
    const std::vector<std::string> ok{
        "engine: {host: /var/run/docker.sock}",
        "engine: {host: \"tcp://127.0.0.1:2375\"}",
        "engine: {host: \"tcp://[::1]:2375\"}",
        "engine:\n  host:\n",  // empty = the environment's
        "engine: {host: \"tcp://10.0.0.1:2376\", tls_cert_path: /etc/reaperd/tls}",
        "engine: {tls_cert_path: /etc/reaperd/tls}",  // the address from DOCKER_HOST
        "engine: {host: \"tcp://10.0.0.1:2375\", allow_plain_tcp: true}",
        // Whether plain TCP is refused depends on DOCKER_TLS_VERIFY too: decided at start.
        "engine: {host: \"tcp://10.0.0.1:2375\"}",
        "control: {group: \"1001\"}",
        "logs: {max_size: 0, total_max_size: 1MiB}",  // a budget without per-container caps
        "logs: {max_size: 4KiB}",
        "logs: {action: remove, scope: all}",  // unowned containers are only ever truncated
        "metrics: {listen: \"[::1]:9324\"}",
        "metrics: {listen: \"localhost:9324\"}",
        "metrics: {listen: \"127.0.0.1:0\"}",
        "reaper: {retry_initial: 1m, retry_max: 1m}",
        "reaper: {dry_run: True, concurrency: \"8\"}",
        "sessions: {labels: [a/b, x_y-z.w], lease_grace: 365d}",
    };
    for (const std::string& yaml : ok) {
        BOOST_TEST_CONTEXT(yaml) {
            const auto problems = problems_of(yaml);
            BOOST_TEST(problems.empty(), all_lines(problems));
        }
    }
}

// ---- the error table ------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(config_error_table) {
    struct Case {
        std::string yaml;
        std::string key;
        int line;
        int column;
        std::string message;  // a fragment of the message
    };
    const std::string long_socket = "/run/" + std::string(110, 's');
    const std::vector<Case> cases{
        // durations
        {"sessions:\n  lease_grace: ten\n", "sessions.lease_grace", 2, 16,
         "expected a duration such as 500ms, 10s, 5m; got \"ten\""},
        {"sessions:\n  lease_grace: 10\n", "sessions.lease_grace", 2, 16, "no unit; write e.g. 10s"},
        {"sessions:\n  lease_grace: -5s\n", "sessions.lease_grace", 2, 16, "negative"},
        {"sessions:\n  lease_grace: 1.5s\n", "sessions.lease_grace", 2, 16, "fractions are not supported"},
        {"sessions:\n  lease_grace: 10sec\n", "sessions.lease_grace", 2, 16, "unknown unit \"sec\""},
        {"sessions:\n  lease_grace: 1h30m\n", "sessions.lease_grace", 2, 16, "rather than 1h30m"},
        {"sessions:\n  lease_grace: 400d\n", "sessions.lease_grace", 2, 16, "more than 365d"},
        {"sessions:\n  lease_grace:\n", "sessions.lease_grace", 2, 3, "got nothing"},
        {"sessions:\n  lease_grace: [1s]\n", "sessions.lease_grace", 2, 16, "got a list"},
        {"sessions:\n  tombstone_ttl: 0\n", "sessions.tombstone_ttl", 2, 18, "must be at least 1s; got 0"},
        {"sessions:\n  max_tombstones: 0\n", "sessions.max_tombstones", 2, 19, "must be from 1 to 10000000; got 0"},
        {"sessions:\n  max_tombstones: 20000000\n", "sessions.max_tombstones", 2, 19, "must be from 1 to 10000000"},
        {"sessions:\n  max_tombstones: many\n", "sessions.max_tombstones", 2, 19, "expected a whole number"},
        {"engine:\n  request_timeout: 10ms\n", "engine.request_timeout", 2, 20, "at least 100ms"},
        {"reaper:\n  resync_interval: 0\n", "reaper.resync_interval", 2, 20, "at least 1s"},
        {"reaper:\n  retry_initial: 1ms\n", "reaper.retry_initial", 2, 18, "at least 10ms"},
        {"logs:\n  check_interval: 1ms\n", "logs.check_interval", 2, 19, "at least 10ms"},
        // unknown keys, at every level
        {"sessions:\n  lease_grce: 5s\n", "sessions.lease_grce", 2, 3, "did you mean lease_grace?"},
        {"reaper:\n  lease_grace: 5s\n", "reaper.lease_grace", 2, 3, "lease_grace belongs under sessions:"},
        {"sesions:\n  lease_grace: 5s\n", "sesions", 1, 1, "did you mean sessions?"},
        {"dry_run: true\n", "dry_run", 1, 1, "belongs under reaper:"},
        {"bogus: 1\n", "bogus", 1, 1, "expected one of engine, control, state, sessions, reaper, logs, metrics"},
        {"state:\n  directory: /x\n", "state.directory", 2, 3, "unknown key"},
        {"sessions:\n  lease_grace: 1s\n  lease_grace: 2s\n", "sessions.lease_grace", 3, 3,
         "duplicate key; first given at line 2"},
        {"engine:\n  ? [a]\n  : 1\n", "engine", 2, 5, "expected a key name; got a list"},
        // structure
        {"sessions: 5\n", "sessions", 1, 11, "expected a mapping of keys (labels, lease_grace"},
        {"- a\n- b\n", "", 1, 1, "expected a mapping of sections"},
        {"engine: {}\n---\nengine: {}\n", "", 3, 1, "one YAML document"},
        // booleans, counts, enums
        {"reaper:\n  dry_run: yes\n", "reaper.dry_run", 2, 12, "expected true or false; got \"yes\""},
        {"reaper:\n  concurrency: 0\n", "reaper.concurrency", 2, 16, "must be from 1 to 256; got 0"},
        {"reaper:\n  concurrency: 1000\n", "reaper.concurrency", 2, 16, "must be from 1 to 256"},
        {"reaper:\n  concurrency: four\n", "reaper.concurrency", 2, 16, "expected a whole number"},
        {"reaper:\n  concurrency: -1\n", "reaper.concurrency", 2, 16, "expected a whole number"},
        {"reaper:\n  concurrency: 99999999999\n", "reaper.concurrency", 2, 16, "too large"},
        {"reaper:\n  error_after_attempts: 0\n", "reaper.error_after_attempts", 2, 25, "at least 1"},
        {"logs:\n  action: delete\n", "logs.action", 2, 11, "expected one of truncate, stop, kill, remove"},
        {"logs:\n  action: trunacte\n", "logs.action", 2, 11, "did you mean truncate?"},
        {"logs:\n  scope: everything\n", "logs.scope", 2, 10, "expected one of sessions, all"},
        // cross-field checks, reported where the file sets the value
        {"reaper:\n  retry_initial: 2m\n", "reaper.retry_initial", 2, 18,
         "must be at most reaper.retry_max (1m); got 2m"},
        {"reaper:\n  retry_initial: 2m\n  retry_max: 1m\n", "reaper.retry_max", 3, 14,
         "must be at least reaper.retry_initial (2m); got 1m"},
        {"reaper:\n  retry_max: 10ms\n", "reaper.retry_max", 2, 14, "at least reaper.retry_initial (1s)"},
        {"logs:\n  max_size: 1GiB\n  total_max_size: 100MiB\n", "logs.total_max_size", 3, 19,
         "must be 0 (no budget) or at least logs.max_size (1GiB); got 100MiB"},
        {"logs:\n  total_max_size: 1MiB\n", "logs.total_max_size", 2, 19, "at least logs.max_size (1GiB)"},
        // sizes
        {"logs:\n  max_size: lots\n", "logs.max_size", 2, 13, "expected a size such as 100MiB, 1GiB or 0; got \"lots\""},
        {"logs:\n  max_size: 10XB\n", "logs.max_size", 2, 13, "unknown unit \"XB\""},
        {"logs:\n  max_size: 100\n", "logs.max_size", 2, 13, "must be 0 (caps off) or at least 4KiB"},
        {"logs:\n  max_size: 99999999999999999999\n", "logs.max_size", 2, 13, "too large"},
        {"logs:\n  total_max_size: -1G\n", "logs.total_max_size", 2, 19, "negative"},
        // paths, names, addresses
        {"control:\n  socket: relative.sock\n", "control.socket", 2, 11, "expected an absolute path"},
        {"control:\n  socket:\n", "control.socket", 2, 3, "expected an absolute path"},
        {"control:\n  socket: /run/reaperd/\n", "control.socket", 2, 11, "expected an absolute path"},
        {"control:\n  socket: " + long_socket + "\n", "control.socket", 2, 11, "the unix socket path limit"},
        {"control:\n  group: \"bad group\"\n", "control.group", 2, 10, "expected a group name"},
        {"control:\n  max_connections: 0\n", "control.max_connections", 2, 20, "must be from 1 to 1048576; got 0"},
        {"control:\n  max_leases_per_uid: -1\n", "control.max_leases_per_uid", 2, 23, "expected a whole number"},
        // per-uid limits: at most their bound, reported where the file sets the value
        {"control:\n  max_connections_per_uid: 5000\n", "control.max_connections_per_uid", 2, 28,
         "must be 0 (no limit) or at most control.max_connections (4096); got 5000"},
        {"control:\n  max_connections: 100\n", "control.max_connections", 2, 20,
         "must be at least control.max_connections_per_uid (3072), or lower that too; got 100"},
        {"control:\n  max_connections_per_uid: 10\n", "control.max_connections_per_uid", 2, 28,
         "must be at least control.max_leases_per_uid (2048), since each lease holds a connection, or lower "
         "that too; got 10"},
        {"control:\n  max_connections_per_uid: 10\n  max_leases_per_uid: 11\n", "control.max_leases_per_uid", 3,
         23, "at most control.max_connections_per_uid (10), since each lease holds a connection; got 11"},
        {"control:\n  max_connections_per_uid: 0\n  max_leases_per_uid: 4097\n", "control.max_leases_per_uid", 3,
         23, "at most control.max_connections (4096), since each lease holds a connection; got 4097"},
        {"state:\n  dir: var/lib\n", "state.dir", 2, 8, "expected an absolute path such as /var/lib/reaperd"},
        {"state:\n  dir: {a: 1}\n", "state.dir", 2, 8, "expected a string; got a mapping"},
        {"engine:\n  host: ssh://host\n", "engine.host", 2, 9, "tcp://host:port"},
        {"engine:\n  host: tcp://localhost\n", "engine.host", 2, 9, "port"},
        {"engine:\n  host: unix://relative.sock\n", "engine.host", 2, 9, "absolute"},
        {"engine:\n  api_version: latest\n", "engine.api_version", 2, 16, "such as \"1.44\""},
        {"engine:\n  tls_cert_path: certs\n", "engine.tls_cert_path", 2, 18, "expected an absolute path"},
        {"engine:\n  host: /run/docker.sock\n  tls_cert_path: /etc/reaperd/tls\n", "engine.tls_cert_path", 3, 18,
         "TLS is for tcp:// engines; engine.host is \"/run/docker.sock\""},
        {"engine:\n  allow_plain_tcp: yes\n", "engine.allow_plain_tcp", 2, 20, "expected true or false"},
        {"engine:\n  api_version: 1.44.0\n", "engine.api_version", 2, 16, "got \"1.44.0\""},
        {"metrics:\n  listen: 9324\n", "metrics.listen", 2, 11, "expected host:port such as 127.0.0.1:9324"},
        {"metrics:\n  listen: localhost:99999\n", "metrics.listen", 2, 11, "from 0 to 65535"},
        {"metrics:\n  listen: \":9324\"\n", "metrics.listen", 2, 11, "no host"},
        // session labels
        {"sessions:\n  labels: []\n", "sessions.labels", 2, 11, "at least one label key"},
        {"sessions:\n  labels: reaperd.session\n", "sessions.labels", 2, 11, "expected a list of label keys"},
        {"sessions:\n  labels: [reaperd.session, \"bad key\"]\n", "sessions.labels[1]", 2, 29,
         "expected a label key of letters"},
        {"sessions:\n  labels: [a, a]\n", "sessions.labels[1]", 2, 15, "duplicate label key \"a\""},
        {"sessions:\n  labels: [reaperd.max-age]\n", "sessions.labels[0]", 2, 12, "per-container setting"},
        {"sessions:\n  labels:\n    - {x: 1}\n", "sessions.labels[0]", 3, 7, "expected a label key; got a mapping"},
        // YAML syntax: one problem, located, no key
        {"sessions:\n  lease_grace: [1s\n", "", 3, 1, "invalid YAML"},
        {"sessions:\n  lease_grace: 1s\n labels: [a]\n", "", 3, 2, "invalid YAML: end of map not found"},
        {"a: b: c\n", "", 1, 5, "invalid YAML: illegal map value"},
        // yaml-cpp alone would loop without end on these (found by config_fuzz)
        {",", "", 1, 1, "invalid YAML: unexpected character \",\" where a document should start"},
        {"# a comment\n,\n", "", 2, 1, "unexpected character \",\""},
        {"---\n,\n", "", 2, 1, "unexpected character \",\""},
        // not UTF-8: yaml-cpp would keep the byte and its emitter could not write it back
        {"engine:\n  host: tcp://h\x97st:1\n", "", 2, 16, "not UTF-8: byte 0x97 does not start a valid character"},
        {"# caf\xc3\xa9 \xc3\n", "", 1, 8, "not UTF-8: byte 0xc3"},
    };
    for (const Case& c : cases) {
        BOOST_TEST_CONTEXT(c.yaml) {
            const auto problems = problems_of(c.yaml);
            BOOST_TEST_REQUIRE(problems.size() == 1u, all_lines(problems));
            const ConfigProblem& p = problems.front();
            BOOST_TEST(p.file == "test.yaml");
            BOOST_TEST(p.key == c.key);
            BOOST_TEST(p.line == c.line);
            BOOST_TEST(p.column == c.column);
            BOOST_TEST(p.message.find(c.message) != std::string::npos, p.to_string());
        }
    }
}

BOOST_AUTO_TEST_CASE(problem_text_names_file_location_key_and_expectation) {
    const auto problems = problems_of("sessions:\n  lease_grace: ten\n");
    BOOST_TEST_REQUIRE(problems.size() == 1u);
    BOOST_TEST(problems[0].to_string() ==
               "test.yaml:2:16: sessions.lease_grace: expected a duration such as 500ms, 10s, 5m; got \"ten\"");

    ConfigProblem unlocated{"/etc/reaperd/reaperd.yaml", 0, 0, "", "cannot open: No such file"};
    BOOST_TEST(unlocated.to_string() == "/etc/reaperd/reaperd.yaml: cannot open: No such file");
}

BOOST_AUTO_TEST_CASE(all_errors_reported_at_once_in_file_order) {
    const std::string yaml =
        "logs:\n"
        "  action: explode\n"        // 2: bad enum
        "sessions:\n"
        "  lease_grace: soon\n"      // 4: bad duration
        "  labels: [reaperd.session]\n"
        "reaper:\n"
        "  concurency: 4\n";         // 7: unknown key
    try {
        parse_config(yaml, "three.yaml");
        BOOST_FAIL("parse_config accepted a file with three problems");
    } catch (const ConfigError& e) {
        const auto& problems = e.problems();
        BOOST_TEST_REQUIRE(problems.size() == 3u, e.what());
        BOOST_TEST(problems[0].key == "logs.action");
        BOOST_TEST(problems[0].line == 2);
        BOOST_TEST(problems[1].key == "sessions.lease_grace");
        BOOST_TEST(problems[1].line == 4);
        BOOST_TEST(problems[2].key == "reaper.concurency");
        BOOST_TEST(problems[2].line == 7);
        BOOST_TEST(problems[2].message.find("did you mean concurrency?") != std::string::npos);
        // what() is the list, one problem per line.
        BOOST_TEST(std::string(e.what()) == problems[0].to_string() + "\n" + problems[1].to_string() +
                                                "\n" + problems[2].to_string());
    }
}

BOOST_AUTO_TEST_CASE(a_bad_value_does_not_cause_follow_on_problems) {
    // retry_max does not parse; the retry_initial <= retry_max check is skipped, not run
    // against the default.
    const auto problems = problems_of("reaper:\n  retry_initial: 5m\n  retry_max: often\n");
    BOOST_TEST_REQUIRE(problems.size() == 1u, all_lines(problems));
    BOOST_TEST(problems[0].key == "reaper.retry_max");
}

BOOST_AUTO_TEST_CASE(load_config_reports_the_path) {
    TempFile bad("engine:\n  request_timeout: forever\n");
    try {
        load_config(bad.path);
        BOOST_FAIL("accepted a bad file");
    } catch (const ConfigError& e) {
        BOOST_TEST_REQUIRE(e.problems().size() == 1u);
        BOOST_TEST(e.problems()[0].to_string().rfind(bad.path + ":2:20: engine.request_timeout: ", 0) == 0u,
                   e.what());
    }

    TempFile good("reaper:\n  dry_run: true\n");
    BOOST_TEST(load_config(good.path).reaper.dry_run);

    for (const std::string& path : {std::string("/nonexistent/reaperd.yaml"), std::string("/tmp")}) {
        BOOST_TEST_CONTEXT(path) {
            try {
                load_config(path);
                BOOST_FAIL("loaded " + path);
            } catch (const ConfigError& e) {
                BOOST_TEST_REQUIRE(e.problems().size() == 1u);
                BOOST_TEST(e.problems()[0].file == path);
                BOOST_TEST(std::string(e.what()).rfind(path + ": cannot ", 0) == 0u, e.what());
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(format_config_round_trips) {
    BOOST_TEST((parse_config(format_config(Config{}), "defaults.yaml") == Config{}));
    Config c;
    c.engine.host = "tcp://[::1]:2375";
    c.engine.api_version = "1.44";
    c.engine.tls_cert_path = "/etc/reaperd/tls";
    c.engine.allow_plain_tcp = true;
    c.sessions.labels = {"x", "y.z"};
    c.sessions.lease_grace = 1500ms;
    c.sessions.max_tombstones = 42;
    c.logs.max_size_bytes = 0;
    c.logs.action = LogAction::remove;
    c.metrics.listen = "[::1]:9";
    c.control.max_connections_per_uid = 0;
    c.control.max_leases_per_uid = 4096;
    BOOST_TEST((parse_config(format_config(c), "c.yaml") == c), format_config(c));
    BOOST_TEST(config_keys().size() == 31u);
}

// ---- durations and sizes --------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(durations_that_parse) {
    const std::vector<std::pair<std::string, std::int64_t>> good{
        {"0", 0},          {"0s", 0},           {"0ms", 0},         {"500ms", 500},
        {"10s", 10'000},   {"5m", 300'000},     {"2h", 7'200'000},  {"1d", 86'400'000},
        {"007s", 7'000},   {"90m", 5'400'000},  {"365d", 31'536'000'000},
    };
    for (const auto& [text, ms] : good) {
        BOOST_TEST_CONTEXT(text) {
            BOOST_TEST(parse_duration(text).count() == ms);
        }
    }
}

BOOST_AUTO_TEST_CASE(durations_that_do_not) {
    const std::vector<std::pair<std::string, std::string>> bad{
        {"", "empty"},
        {"10", "no unit"},
        {"-5s", "negative"},
        {"-0", "negative"},
        {"+5s", "expected e.g. 500ms"},
        {"5 s", "without a space"},
        {"1.5s", "fractions"},
        {"10sec", "unknown unit \"sec\""},
        {"10S", "unknown unit \"S\""},
        {"1h30m", "90m rather than 1h30m"},
        {"s", "expected e.g. 500ms"},
        {"ten", "expected e.g. 500ms"},
        {" 10s", "expected e.g. 500ms"},
        {"10s ", "unknown unit"},
        {"366d", "more than 365d"},
        {"9223372036854775807ms", "more than 365d"},
        {"99999999999999999999s", "too large"},
        {"999999999999999999999999ms", "too large"},
    };
    for (const auto& [text, why] : bad) {
        BOOST_TEST_CONTEXT(text) {
            try {
                parse_duration(text);
                BOOST_FAIL("accepted " + text);
            } catch (const std::invalid_argument& e) {
                const std::string what = e.what();
                BOOST_TEST(what.find(why) != std::string::npos, what);
                BOOST_TEST(what.rfind("invalid duration \"", 0) == 0u, what);
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(sizes_that_parse) {
    constexpr std::uint64_t K = 1024;
    const std::vector<std::pair<std::string, std::uint64_t>> good{
        {"0", 0},           {"1024", 1024},         {"7b", 7},             {"10KiB", 10 * K},
        {"10MiB", 10 * K * K}, {"1GiB", K * K * K}, {"1G", K * K * K},     {"10M", 10 * K * K},
        {"100k", 100 * K},  {"5MB", 5 * K * K},     {"2gb", 2 * K * K * K}, {"1Gi", K * K * K},
        {"1TiB", K * K * K * K},
        {"18446744073709551615", std::numeric_limits<std::uint64_t>::max()},
        {"16777215TiB", 16777215 * K * K * K * K},
    };
    for (const auto& [text, bytes] : good) {
        BOOST_TEST_CONTEXT(text) {
            BOOST_TEST(parse_size(text) == bytes);
        }
    }
}

BOOST_AUTO_TEST_CASE(sizes_that_do_not) {
    const std::vector<std::pair<std::string, std::string>> bad{
        {"", "empty"},
        {"-1", "negative"},
        {"1.5G", "fractions"},
        {"10XB", "unknown unit \"XB\""},
        {"1bb", "unknown unit \"bb\""},
        {"1ib", "unknown unit \"ib\""},
        {"1PiB", "unknown unit \"PiB\""},
        {"MiB", "expected e.g. 100MiB"},
        {"lots", "expected e.g. 100MiB"},
        {"10 MiB", "without a space"},
        {"18446744073709551616", "too large"},
        {"16777216TiB", "too large"},
    };
    for (const auto& [text, why] : bad) {
        BOOST_TEST_CONTEXT(text) {
            try {
                parse_size(text);
                BOOST_FAIL("accepted " + text);
            } catch (const std::invalid_argument& e) {
                const std::string what = e.what();
                BOOST_TEST(what.find(why) != std::string::npos, what);
                BOOST_TEST(what.rfind("invalid size \"", 0) == 0u, what);
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(formatting_round_trips) {
    const std::vector<std::pair<std::int64_t, std::string>> durations{
        {0, "0"},          {1, "1ms"},          {999, "999ms"},          {1'000, "1s"},
        {1'500, "1500ms"}, {60'000, "1m"},      {90'000, "90s"},         {5'400'000, "90m"},
        {3'600'000, "1h"}, {86'400'000, "1d"},  {max_duration.count(), "365d"},
    };
    for (const auto& [ms, text] : durations) {
        BOOST_TEST_CONTEXT(text) {
            BOOST_TEST(format_duration(Duration{ms}) == text);
            BOOST_TEST(parse_duration(text).count() == ms);
        }
    }
    const std::vector<std::pair<std::uint64_t, std::string>> sizes{
        {0, "0"},
        {1, "1"},
        {1023, "1023"},
        {1024, "1KiB"},
        {1536, "1536"},
        {1536 * 1024, "1536KiB"},
        {100u << 20, "100MiB"},
        {1u << 30, "1GiB"},
        {std::uint64_t{3} << 40, "3TiB"},
        {std::numeric_limits<std::uint64_t>::max(), "18446744073709551615"},
    };
    for (const auto& [bytes, text] : sizes) {
        BOOST_TEST_CONTEXT(text) {
            BOOST_TEST(format_size(bytes) == text);
            BOOST_TEST(parse_size(text) == bytes);
        }
    }
}

BOOST_AUTO_TEST_CASE(label_keys) {
    for (const char* good : {"reaperd.session", "org.testcontainers.sessionId", "a", "com.example/run-id",
                             "x_y", "A1"}) {
        BOOST_TEST(label_key_valid(good), good);
    }
    for (const char* bad : {"", ".a", "a.", "-a", "a b", "a=b", "a\tb", "caf\xc3\xa9", "a/"}) {
        BOOST_TEST(!label_key_valid(bad), bad);
    }
    BOOST_TEST(label_key_valid(std::string(255, 'a')));
    BOOST_TEST(!label_key_valid(std::string(256, 'a')));
}

BOOST_AUTO_TEST_CASE(enum_names) {
    BOOST_TEST(to_string(LogAction::truncate) == "truncate");
    BOOST_TEST(to_string(LogAction::stop) == "stop");
    BOOST_TEST(to_string(LogAction::kill) == "kill");
    BOOST_TEST(to_string(LogAction::remove) == "remove");
    BOOST_TEST(to_string(LogScope::sessions) == "sessions");
    BOOST_TEST(to_string(LogScope::all) == "all");
}

// A user's reaperd passes its own socket and state dir as defaults: the shipped file (which
// leaves both unset) then gives that user's paths, and a file that sets them wins.
BOOST_AUTO_TEST_CASE(missing_keys_take_the_given_defaults) {
    Config user;
    user.control.socket = "/run/user/1000/reaperd/control.sock";
    user.state.dir = "/home/u/.local/state/reaperd";
    const Config shipped = load_config(shipped_config, user);
    BOOST_TEST(shipped.control.socket == user.control.socket);
    BOOST_TEST(shipped.state.dir == user.state.dir);
    const Config set = parse_config("control:\n  socket: /x/c.sock\n  allow_root: true\n", "c.yaml", user);
    BOOST_TEST(set.control.socket == "/x/c.sock");
    BOOST_TEST(set.control.allow_root);
    BOOST_TEST(set.state.dir == user.state.dir);
}
