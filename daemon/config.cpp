#include "config.hpp"

#include "errno_text.hpp"
#include "read_all.hpp"
#include "unique_fd.hpp"

#include <reaper/client.hpp>
#include <reaper/units.hpp>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>
#include <utility>

namespace reaperd {

namespace {

using namespace std::chrono_literals;

// ---- characters (durations and sizes are parsed by reaper/units.hpp) --------------------

constexpr std::uint64_t KiB = 1024;

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_alnum(char c) {
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }


std::string join(const std::vector<std::string_view>& items, std::string_view separator) {
    std::string out;
    for (std::size_t i = 0; i < items.size(); ++i) {
        if (i)
            out += separator;
        out += items[i];
    }
    return out;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
    std::vector<std::size_t> row(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j)
        row[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
        std::size_t diagonal = row[0];
        row[0] = i;
        for (std::size_t j = 1; j <= b.size(); ++j) {
            const std::size_t above = row[j];
            const std::size_t cost = lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1;
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + cost});
            diagonal = above;
        }
    }
    return row[b.size()];
}

// The candidate closest to `word`, if it is close enough to be a likely typo.
std::optional<std::string_view> closest(std::string_view word,
                                        const std::vector<std::string_view>& candidates) {
    std::optional<std::string_view> best;
    std::size_t best_distance = std::max<std::size_t>(1, word.size() / 3) + 1;
    for (std::string_view c : candidates) {
        const std::size_t d = edit_distance(word, c);
        if (d < best_distance) {
            best = c;
            best_distance = d;
        }
    }
    return best;
}

// ---- the parser -------------------------------------------------------------------------

std::string describe(const YAML::Node& node) {
    switch (node.Type()) {
    case YAML::NodeType::Null:
        return "nothing";
    case YAML::NodeType::Sequence:
        return "a list";
    case YAML::NodeType::Map:
        return "a mapping";
    case YAML::NodeType::Scalar:
        return reaper::quote_for_message(node.Scalar());
    case YAML::NodeType::Undefined:
        break;
    }
    return "nothing";
}

constexpr std::string_view duration_expected = "expected a duration such as 500ms, 10s, 5m";
constexpr std::string_view size_expected = "expected a size such as 100MiB, 1GiB or 0";

std::string with_reason(std::string message, const std::string& why) {
    return why.empty() ? message : message + ": " + why;
}

class Parser {
public:
    explicit Parser(std::string file) : file_(std::move(file)) {}

    void problem(const YAML::Mark& mark, const std::string& key, std::string message) {
        ConfigProblem p;
        p.file = file_;
        if (!mark.is_null()) {
            p.line = mark.line + 1;
            p.column = mark.column + 1;
        }
        p.key = key;
        p.message = std::move(message);
        problems_.push_back(std::move(p));
        if (!key.empty())
            bad_.insert(key);
    }

    // A problem with a key whose value is in the config (validation): located where the file
    // sets it, or unlocated when it holds the default.
    void problem(const std::string& key, std::string message) {
        auto it = where_.find(key);
        problem(it == where_.end() ? YAML::Mark::null_mark() : it->second, key, std::move(message));
    }

    // Where a value is reported: at the value, or at its key when there is none (yaml-cpp
    // places an empty value at the start of the next token).
    void located(const std::string& key, const YAML::Node& key_node, const YAML::Node& value) {
        where_[key] = value.IsNull() ? key_node.Mark() : value.Mark();
    }

    bool bad(const std::string& key) const { return bad_.count(key) != 0; }
    bool set_in_file(const std::string& key) const { return where_.count(key) != 0; }
    std::vector<ConfigProblem> take_problems() { return std::move(problems_); }

    void read(const YAML::Node& node, const std::string& key, Duration& out) {
        const YAML::Mark mark = where_.at(key);
        if (!node.IsScalar()) {
            problem(mark, key, std::string(duration_expected) + "; got " + describe(node));
            return;
        }
        std::string why;
        auto d = reaper::try_parse_duration(node.Scalar(), why);
        if (!d) {
            problem(mark, key,
                    with_reason(std::string(duration_expected) + "; got " + reaper::quote_for_message(node.Scalar()), why));
            return;
        }
        out = *d;
    }

    void read(const YAML::Node& node, const std::string& key, std::uint64_t& out) {
        const YAML::Mark mark = where_.at(key);
        if (!node.IsScalar()) {
            problem(mark, key, std::string(size_expected) + "; got " + describe(node));
            return;
        }
        std::string why;
        auto bytes = reaper::try_parse_size(node.Scalar(), why);
        if (!bytes) {
            problem(mark, key,
                    with_reason(std::string(size_expected) + "; got " + reaper::quote_for_message(node.Scalar()), why));
            return;
        }
        out = *bytes;
    }

    void read(const YAML::Node& node, const std::string& key, unsigned& out) {
        const YAML::Mark mark = where_.at(key);
        const std::string expected = "expected a whole number such as 4; got ";
        if (!node.IsScalar()) {
            problem(mark, key, expected + describe(node));
            return;
        }
        const std::string& text = node.Scalar();
        unsigned value = 0;
        auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (text.empty() || !is_digit(text.front()) || end != text.data() + text.size()) {
            problem(mark, key, expected + reaper::quote_for_message(text));
            return;
        }
        if (ec == std::errc::result_out_of_range) {
            problem(mark, key, expected + reaper::quote_for_message(text) + ": too large");
            return;
        }
        out = value;
    }

    void read(const YAML::Node& node, const std::string& key, bool& out) {
        const YAML::Mark mark = where_.at(key);
        if (node.IsScalar()) {
            const std::string& text = node.Scalar();
            if (text == "true" || text == "True" || text == "TRUE") {
                out = true;
                return;
            }
            if (text == "false" || text == "False" || text == "FALSE") {
                out = false;
                return;
            }
        }
        problem(mark, key, "expected true or false; got " + describe(node));
    }

    // A string key; an empty value reads as "" (the keys whose "" means "off" say so, and
    // validation rejects it where a value is required).
    void read(const YAML::Node& node, const std::string& key, std::string& out) {
        if (node.IsNull()) {
            out.clear();
            return;
        }
        if (!node.IsScalar()) {
            problem(where_.at(key), key, "expected a string; got " + describe(node));
            return;
        }
        out = node.Scalar();
    }

    void read(const YAML::Node& node, const std::string& key, std::vector<std::string>& out) {
        if (!node.IsSequence()) {
            problem(where_.at(key), key,
                    "expected a list of label keys such as [reaperd.session]; got " + describe(node));
            return;
        }
        std::vector<std::string> items;
        bool ok = true;
        for (std::size_t i = 0; i < node.size(); ++i) {
            const YAML::Node item = node[i];
            const std::string item_key = key + "[" + std::to_string(i) + "]";
            where_[item_key] = item.Mark();
            if (!item.IsScalar()) {
                problem(item.Mark(), item_key, "expected a label key; got " + describe(item));
                ok = false;
                continue;
            }
            items.push_back(item.Scalar());
        }
        if (ok)
            out = std::move(items);
        else
            bad_.insert(key);
    }

    template <typename Enum, std::size_t N>
    void read_enum(const YAML::Node& node, const std::string& key, Enum& out,
                   const std::array<Enum, N>& values) {
        std::vector<std::string_view> names;
        for (Enum v : values)
            names.push_back(to_string(v));
        std::string message = "expected one of " + join(names, ", ") + "; got " + describe(node);
        if (node.IsScalar()) {
            for (Enum v : values) {
                if (node.Scalar() == to_string(v)) {
                    out = v;
                    return;
                }
            }
            if (auto near = closest(node.Scalar(), names))
                message += " (did you mean " + std::string(*near) + "?)";
        }
        problem(where_.at(key), key, std::move(message));
    }

    void read(const YAML::Node& node, const std::string& key, LogAction& out) {
        std::array<LogAction, log_action_names.size()> values;
        for (std::size_t i = 0; i < values.size(); ++i) values[i] = log_action_names[i].value;
        read_enum(node, key, out, values);
    }
    void read(const YAML::Node& node, const std::string& key, LogScope& out) {
        read_enum(node, key, out, std::array{LogScope::sessions, LogScope::all});
    }

private:
    std::string file_;
    std::vector<ConfigProblem> problems_;
    std::map<std::string, YAML::Mark> where_;  // key -> where the file sets its value
    std::set<std::string> bad_;                // keys that already have a problem
};

// ---- the key table ----------------------------------------------------------------------

void emit(YAML::Emitter& out, Duration d) { out << format_duration(d); }
void emit(YAML::Emitter& out, std::uint64_t bytes) { out << format_size(bytes); }
void emit(YAML::Emitter& out, unsigned n) { out << n; }
void emit(YAML::Emitter& out, bool b) { out << b; }
void emit(YAML::Emitter& out, const std::string& s) { out << YAML::DoubleQuoted << s; }
void emit(YAML::Emitter& out, const std::vector<std::string>& v) { out << YAML::Flow << v; }
void emit(YAML::Emitter& out, LogAction a) { out << std::string(to_string(a)); }
void emit(YAML::Emitter& out, LogScope s) { out << std::string(to_string(s)); }

struct Field {
    std::string_view name;
    void (*read)(Parser&, const YAML::Node&, const std::string& key, Config&);
    void (*emit)(YAML::Emitter&, const Config&);
};

template <auto section, auto member>
Field field(std::string_view name) {
    return {name,
            [](Parser& parser, const YAML::Node& node, const std::string& key, Config& config) {
                parser.read(node, key, (config.*section).*member);
            },
            [](YAML::Emitter& out, const Config& config) { emit(out, (config.*section).*member); }};
}

struct Section {
    std::string_view name;
    std::vector<Field> fields;

    std::vector<std::string_view> field_names() const {
        std::vector<std::string_view> names;
        for (const Field& f : fields)
            names.push_back(f.name);
        return names;
    }
};

const std::vector<Section>& sections() {
    using C = Config;
    static const std::vector<Section> table{
        {"engine",
         {field<&C::engine, &EngineConfig::host>("host"),
          field<&C::engine, &EngineConfig::tls_cert_path>("tls_cert_path"),
          field<&C::engine, &EngineConfig::allow_plain_tcp>("allow_plain_tcp"),
          field<&C::engine, &EngineConfig::request_timeout>("request_timeout"),
          field<&C::engine, &EngineConfig::api_version>("api_version")}},
        {"control",
         {field<&C::control, &ControlConfig::socket>("socket"),
          field<&C::control, &ControlConfig::group>("group"),
          field<&C::control, &ControlConfig::max_connections>("max_connections"),
          field<&C::control, &ControlConfig::max_connections_per_uid>("max_connections_per_uid"),
          field<&C::control, &ControlConfig::max_leases_per_uid>("max_leases_per_uid"),
          field<&C::control, &ControlConfig::allow_root>("allow_root")}},
        {"state", {field<&C::state, &StateConfig::dir>("dir")}},
        {"sessions",
         {field<&C::sessions, &SessionsConfig::labels>("labels"),
          field<&C::sessions, &SessionsConfig::lease_grace>("lease_grace"),
          field<&C::sessions, &SessionsConfig::max_age>("max_age"),
          field<&C::sessions, &SessionsConfig::unclaimed_grace>("unclaimed_grace"),
          field<&C::sessions, &SessionsConfig::tombstone_ttl>("tombstone_ttl"),
          field<&C::sessions, &SessionsConfig::max_tombstones>("max_tombstones")}},
        {"reaper",
         {field<&C::reaper, &ReaperConfig::dry_run>("dry_run"),
          field<&C::reaper, &ReaperConfig::resync_interval>("resync_interval"),
          field<&C::reaper, &ReaperConfig::retry_initial>("retry_initial"),
          field<&C::reaper, &ReaperConfig::retry_max>("retry_max"),
          field<&C::reaper, &ReaperConfig::concurrency>("concurrency"),
          field<&C::reaper, &ReaperConfig::error_after_attempts>("error_after_attempts")}},
        {"logs",
         {field<&C::logs, &LogsConfig::max_size_bytes>("max_size"),
          field<&C::logs, &LogsConfig::action>("action"),
          field<&C::logs, &LogsConfig::scope>("scope"),
          field<&C::logs, &LogsConfig::total_max_size_bytes>("total_max_size"),
          field<&C::logs, &LogsConfig::check_interval>("check_interval"),
          field<&C::logs, &LogsConfig::rotate_at_create>("rotate_at_create")}},
        {"metrics", {field<&C::metrics, &MetricsConfig::listen>("listen")}},
    };
    return table;
}

std::vector<std::string_view> section_names() {
    std::vector<std::string_view> names;
    for (const Section& s : sections())
        names.push_back(s.name);
    return names;
}

// The message for a key that is not in `known`: a likely typo, a key of another section,
// or the list of what this level holds.
std::string unknown_key_message(std::string_view key, const std::vector<std::string_view>& known,
                                std::string_view here) {
    if (auto near = closest(key, known))
        return "unknown key; did you mean " + std::string(*near) + "?";
    for (const Section& s : sections()) {
        if (s.name == here)
            continue;
        for (const Field& f : s.fields)
            if (f.name == key)
                return "unknown key; " + std::string(key) + " belongs under " + std::string(s.name) + ":";
    }
    return "unknown key; expected one of " + join(known, ", ");
}

// Scalar keys of a mapping, each once: reports non-scalar and repeated keys.
template <typename Visit>
void for_each_key(Parser& parser, const YAML::Node& map, const std::string& prefix, Visit visit) {
    std::map<std::string, int> first_line;
    for (auto it = map.begin(); it != map.end(); ++it) {
        // Copies: the iterator hands out a temporary pair.
        const YAML::Node key_node = it->first;
        const YAML::Node value = it->second;
        if (!key_node.IsScalar()) {
            parser.problem(key_node.Mark(), prefix, "expected a key name; got " + describe(key_node));
            continue;
        }
        const std::string& name = key_node.Scalar();
        const std::string dotted = prefix.empty() ? name : prefix + "." + name;
        auto [seen, inserted] = first_line.emplace(name, key_node.Mark().line + 1);
        if (!inserted) {
            parser.problem(key_node.Mark(), dotted,
                           "duplicate key; first given at line " + std::to_string(seen->second));
            continue;
        }
        visit(name, dotted, key_node, value);
    }
}

void read_section(Parser& parser, const Section& section, const YAML::Node& node, Config& config) {
    const std::string prefix(section.name);
    if (node.IsNull())
        return;  // every key of the section commented out: all defaults
    if (!node.IsMap()) {
        parser.problem(node.Mark(), prefix,
                       "expected a mapping of keys (" + join(section.field_names(), ", ") +
                           "); got " + describe(node));
        return;
    }
    for_each_key(parser, node, prefix,
                 [&](const std::string& name, const std::string& key, const YAML::Node& key_node,
                     const YAML::Node& value) {
                     for (const Field& f : section.fields) {
                         if (f.name == name) {
                             parser.located(key, key_node, value);
                             f.read(parser, value, key, config);
                             return;
                         }
                     }
                     parser.problem(key_node.Mark(), key,
                                    unknown_key_message(name, section.field_names(), section.name));
                 });
}

// ---- validation -------------------------------------------------------------------------

bool absolute_path(const std::string& path) {
    return !path.empty() && path.front() == '/' && path.find('\0') == std::string::npos;
}

// "host:port" with a port from 0 to 65535 (0: any free port, for tests); the host a name, an
// IPv4 address or [IPv6].
// Sets `why` to what is wrong.
bool host_port_valid(std::string_view text, std::string& why) {
    const std::size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) {
        why = "no port";
        return false;
    }
    std::string_view host = text.substr(0, colon);
    const std::string_view port = text.substr(colon + 1);
    unsigned port_number = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), port_number);
    if (port.empty() || ec != std::errc{} || end != port.data() + port.size() || port_number > 65535) {
        why = "the port must be a number from 0 to 65535";
        return false;
    }
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
        host = host.substr(1, host.size() - 2);
        const bool ipv6_chars = !host.empty() && std::all_of(host.begin(), host.end(), [](char c) {
            return is_digit(c) || (lower(c) >= 'a' && lower(c) <= 'f') || c == ':' || c == '.';
        });
        if (!ipv6_chars)
            why = "not an IPv6 address between the brackets";
        return ipv6_chars;
    }
    const bool host_chars = !host.empty() && std::all_of(host.begin(), host.end(), [](char c) {
        return is_alnum(c) || c == '.' || c == '-';
    });
    if (!host_chars)
        why = host.empty() ? "no host" : "the host must be a name or an address (IPv6 in brackets)";
    return host_chars;
}

bool group_valid(const std::string& group) {
    if (group.empty() || group.size() > 32)
        return false;
    if (std::all_of(group.begin(), group.end(), is_digit))
        return true;
    return (is_alnum(group.front()) || group.front() == '_') &&
           std::all_of(group.begin(), group.end(),
                       [](char c) { return is_alnum(c) || c == '_' || c == '-' || c == '.'; });
}

// sun_path holds 108 bytes with the NUL, and the control server binds "<socket>.new" first
// (renamed once it listens), so the configured path has 4 bytes fewer.
constexpr std::size_t max_control_socket_path = 107 - 4;
constexpr unsigned max_concurrency = 256;
// Each tombstone costs ~190 bytes of reaperd's memory and ~80 bytes of state file
// (bench/tombstone_bench): 10 million is ~2 GB, a typo rather than a plan.
constexpr unsigned max_tombstones_limit = 10'000'000;
// A connection holds a descriptor; no host gives a daemon more than this many.
constexpr unsigned max_control_connections = 1u << 20;
constexpr std::uint64_t min_log_cap = 4 * KiB;
constexpr std::array<std::string_view, 2> per_container_labels{"reaperd.max-age",
                                                                "reaperd.log-max-size"};

void validate(Parser& p, const Config& c) {
    // Each check only when its keys parsed, so one typo gives one problem.
    auto check = [&](std::initializer_list<std::string_view> keys, bool ok, std::string_view report_at,
                     const std::string& message) {
        for (std::string_view k : keys)
            if (p.bad(std::string(k)))
                return;
        if (!ok)
            p.problem(std::string(report_at), message);
    };
    auto at_least = [&](std::string_view key, Duration value, Duration min, std::string_view why) {
        check({key}, value >= min, key,
              "must be at least " + format_duration(min) + "; got " + format_duration(value) +
                  (why.empty() ? "" : " (" + std::string(why) + ")"));
    };

    std::optional<reaper::EngineAddress> engine_address;
    if (!c.engine.host.empty()) {
        // The client's own parser, so the check can never disagree with the connection.
        std::string error;
        try {
            engine_address = reaper::EngineAddress::parse(c.engine.host);
        } catch (const std::invalid_argument& e) {
            error = e.what();
        }
        check({"engine.host"}, error.empty(), "engine.host", error);
    }
    if (!c.engine.tls_cert_path.empty()) {
        check({"engine.tls_cert_path"}, absolute_path(c.engine.tls_cert_path), "engine.tls_cert_path",
              "expected an absolute path to a directory holding ca.pem, cert.pem and key.pem, or \"\"; got " +
                  reaper::quote_for_message(c.engine.tls_cert_path));
        // Whether the files are there and fit is found when reaperd starts (exit 78 then).
        if (engine_address)
            check({"engine.tls_cert_path"}, engine_address->kind == reaper::EngineAddress::Kind::Tcp,
                  "engine.tls_cert_path", "TLS is for tcp:// engines; engine.host is " + reaper::quote_for_message(c.engine.host));
    }
    at_least("engine.request_timeout", c.engine.request_timeout, 100ms, "");
    check({"engine.api_version"}, c.engine.api_version.empty() || reaper::is_api_version(c.engine.api_version),
          "engine.api_version",
          "expected an API version such as \"1.44\", or \"\" to negotiate; got " + reaper::quote_for_message(c.engine.api_version));

    check({"control.socket"}, absolute_path(c.control.socket) && c.control.socket.back() != '/',
          "control.socket",
          "expected an absolute path such as /run/reaperd/control.sock; got " + reaper::quote_for_message(c.control.socket));
    check({"control.socket"}, c.control.socket.size() <= max_control_socket_path, "control.socket",
          "must be at most " + std::to_string(max_control_socket_path) +
              " bytes long (the unix socket path limit, less 4 for the \".new\" it is bound under first); got " +
              std::to_string(c.control.socket.size()));
    if (!c.control.group.empty())
        check({"control.group"}, group_valid(c.control.group), "control.group",
              "expected a group name or a numeric group id; got " + reaper::quote_for_message(c.control.group));
    check({"control.max_connections"},
          c.control.max_connections >= 1 && c.control.max_connections <= max_control_connections,
          "control.max_connections",
          "must be from 1 to " + std::to_string(max_control_connections) + "; got " +
              std::to_string(c.control.max_connections));
    // A per-uid limit over its bound is reported where the file sets it, or else at the bound
    // the file lowered (as reaper.retry_max and retry_initial are).
    const auto at_most = [&](const std::string& key, unsigned value, const std::string& bound_key,
                             unsigned bound, std::string_view why) {
        if (value <= bound || p.bad(key) || p.bad(bound_key)) return;
        if (p.set_in_file(key) || !p.set_in_file(bound_key))
            p.problem(key, "must be 0 (no limit) or at most " + bound_key + " (" + std::to_string(bound) +
                               ")" + std::string(why) + "; got " + std::to_string(value));
        else
            p.problem(bound_key, "must be at least " + key + " (" + std::to_string(value) + ")" +
                                     std::string(why) + ", or lower that too; got " + std::to_string(bound));
    };
    if (c.control.max_connections >= 1) {
        at_most("control.max_connections_per_uid", c.control.max_connections_per_uid,
                "control.max_connections", c.control.max_connections, "");
        if (c.control.max_connections_per_uid == 0)
            at_most("control.max_leases_per_uid", c.control.max_leases_per_uid, "control.max_connections",
                    c.control.max_connections, ", since each lease holds a connection");
        else if (c.control.max_connections_per_uid <= c.control.max_connections)
            at_most("control.max_leases_per_uid", c.control.max_leases_per_uid,
                    "control.max_connections_per_uid", c.control.max_connections_per_uid,
                    ", since each lease holds a connection");
    }

    check({"state.dir"}, absolute_path(c.state.dir), "state.dir",
          "expected an absolute path such as /var/lib/reaperd; got " + reaper::quote_for_message(c.state.dir));

    check({"sessions.labels"}, !c.sessions.labels.empty(), "sessions.labels",
          "must name at least one label key, such as [reaperd.session]");
    if (!p.bad("sessions.labels")) {
        std::set<std::string> seen;
        for (std::size_t i = 0; i < c.sessions.labels.size(); ++i) {
            const std::string& label = c.sessions.labels[i];
            const std::string key = "sessions.labels[" + std::to_string(i) + "]";
            const std::string at = p.set_in_file(key) ? key : "sessions.labels";
            if (!label_key_valid(label))
                p.problem(at, "expected a label key of letters, digits, '.', '-', '_' and '/', "
                              "starting and ending with a letter or digit; got " + reaper::quote_for_message(label));
            else if (std::find(per_container_labels.begin(), per_container_labels.end(), label) !=
                     per_container_labels.end())
                p.problem(at, label + " is a per-container setting of reaperd, not a session label");
            else if (!seen.insert(label).second)
                p.problem(at, "duplicate label key " + reaper::quote_for_message(label));
        }
    }
    at_least("sessions.tombstone_ttl", c.sessions.tombstone_ttl, 1s,
             "ended sessions must be remembered to reap their late containers");
    check({"sessions.max_tombstones"},
          c.sessions.max_tombstones >= 1 && c.sessions.max_tombstones <= max_tombstones_limit,
          "sessions.max_tombstones",
          "must be from 1 to " + std::to_string(max_tombstones_limit) + "; got " +
              std::to_string(c.sessions.max_tombstones));

    at_least("reaper.resync_interval", c.reaper.resync_interval, 1s, "");
    at_least("reaper.retry_initial", c.reaper.retry_initial, 10ms, "");
    if (p.set_in_file("reaper.retry_max"))
        check({"reaper.retry_initial", "reaper.retry_max"}, c.reaper.retry_initial <= c.reaper.retry_max,
              "reaper.retry_max",
              "must be at least reaper.retry_initial (" + format_duration(c.reaper.retry_initial) +
                  "); got " + format_duration(c.reaper.retry_max));
    else
        check({"reaper.retry_initial"}, c.reaper.retry_initial <= c.reaper.retry_max,
              "reaper.retry_initial",
              "must be at most reaper.retry_max (" + format_duration(c.reaper.retry_max) + "); got " +
                  format_duration(c.reaper.retry_initial));
    check({"reaper.concurrency"}, c.reaper.concurrency >= 1 && c.reaper.concurrency <= max_concurrency,
          "reaper.concurrency",
          "must be from 1 to " + std::to_string(max_concurrency) + "; got " +
              std::to_string(c.reaper.concurrency));
    check({"reaper.error_after_attempts"}, c.reaper.error_after_attempts >= 1,
          "reaper.error_after_attempts", "must be at least 1; got 0");

    check({"logs.max_size"}, c.logs.max_size_bytes == 0 || c.logs.max_size_bytes >= min_log_cap,
          "logs.max_size",
          "must be 0 (caps off) or at least " + format_size(min_log_cap) + "; got " +
              format_size(c.logs.max_size_bytes));
    check({"logs.max_size", "logs.total_max_size"},
          c.logs.total_max_size_bytes == 0 || c.logs.max_size_bytes == 0 ||
              c.logs.total_max_size_bytes >= c.logs.max_size_bytes,
          "logs.total_max_size",
          "must be 0 (no budget) or at least logs.max_size (" + format_size(c.logs.max_size_bytes) +
              "); got " + format_size(c.logs.total_max_size_bytes));
    at_least("logs.check_interval", c.logs.check_interval, 10ms, "");

    if (!c.metrics.listen.empty()) {
        std::string why;
        const bool ok = host_port_valid(c.metrics.listen, why);
        check({"metrics.listen"}, ok, "metrics.listen",
              with_reason("expected host:port such as 127.0.0.1:9324 or \"\" for no listener; got " +
                              reaper::quote_for_message(c.metrics.listen),
                          why));
    }
}

ConfigProblem file_problem(const std::string& file, std::string message) {
    ConfigProblem p;
    p.file = file;
    p.message = std::move(message);
    return p;
}

// YAML is Unicode text, and yaml-cpp passes bytes that are not UTF-8 into strings that its
// own emitter then cannot write back (config_fuzz: an engine.host holding byte 0x97 did not
// survive --check-config's output). Refuse them up front, at their place.
void reject_invalid_utf8(const std::string& text, const std::string& file) {
    const std::size_t at = reaper::invalid_utf8_at(text);
    if (at == std::string_view::npos)
        return;
    // The column counts characters: every byte but UTF-8 continuation bytes starts one.
    int line = 1;
    int column = 1;
    for (std::size_t i = 0; i < at; ++i) {
        if (text[i] == '\n') {
            ++line;
            column = 1;
        } else if ((static_cast<unsigned char>(text[i]) & 0xc0) != 0x80) {
            ++column;
        }
    }
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", static_cast<unsigned char>(text[at]));
    ConfigProblem p = file_problem(file, std::string("not UTF-8: byte ") + hex +
                                             " does not start a valid character; a config "
                                             "file is UTF-8 text");
    p.line = line;
    p.column = column;
    throw ConfigError({std::move(p)});
}

// Records where each document of a YAML stream starts, and nothing else.
class DocumentStarts final : public YAML::EventHandler {
public:
    std::optional<YAML::Mark> last;
    bool stuck = false;

    void OnDocumentStart(const YAML::Mark& mark) override {
        stuck = last && last->pos == mark.pos;
        last = mark;
    }
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
    void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
    void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
    void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
    void OnMapEnd() override {}
};

// yaml-cpp 0.7 never consumes a token it cannot start a document with (a ',' or '?' at the top
// level, found by config_fuzz): it yields empty documents at the same place forever, and
// YAML::LoadAll grows until memory runs out. Walk the stream once, stopping at the first
// document that starts where the one before it did, and report that place as the error.
// Throws YAML::Exception for ordinary syntax errors, like LoadAll.
void reject_unparsable_tail(const std::string& text, const std::string& file) {
    std::istringstream stream(text);
    YAML::Parser parser(stream);
    DocumentStarts starts;
    while (parser.HandleNextDocument(starts)) {
        if (!starts.stuck)
            continue;
        ConfigProblem p = file_problem(file, "invalid YAML: unexpected character");
        if (starts.last->pos >= 0 && static_cast<std::size_t>(starts.last->pos) < text.size())
            p.message += " " + reaper::quote_for_message(std::string(1, text[static_cast<std::size_t>(starts.last->pos)]));
        p.message += " where a document should start";
        p.line = starts.last->line + 1;
        p.column = starts.last->column + 1;
        throw ConfigError({std::move(p)});
    }
}

}  // namespace

std::string_view to_string(LogScope scope) noexcept {
    return scope == LogScope::all ? "all" : "sessions";
}

std::string ConfigProblem::to_string() const {
    std::string out = file;
    if (line > 0)
        out += ":" + std::to_string(line) + ":" + std::to_string(column);
    out += ": ";
    if (!key.empty())
        out += key + ": ";
    return out + message;
}

namespace {
std::string describe_all(const std::vector<ConfigProblem>& problems) {
    std::string out;
    for (const ConfigProblem& p : problems) {
        if (!out.empty())
            out += '\n';
        out += p.to_string();
    }
    return out;
}
}  // namespace

ConfigError::ConfigError(std::vector<ConfigProblem> problems)
    : std::runtime_error(describe_all(problems)), problems_(std::move(problems)) {}

Config parse_config(std::string_view yaml_text, const std::string& file, const Config& defaults) {
    std::vector<YAML::Node> documents;
    try {
        const std::string text(yaml_text);
        reject_invalid_utf8(text, file);
        reject_unparsable_tail(text, file);
        documents = YAML::LoadAll(text);
    } catch (const YAML::Exception& e) {
        ConfigProblem p = file_problem(file, "invalid YAML: " + e.msg);
        if (!e.mark.is_null()) {
            p.line = e.mark.line + 1;
            p.column = e.mark.column + 1;
        }
        throw ConfigError({std::move(p)});
    }

    Parser parser(file);
    Config config = defaults;
    for (std::size_t i = 1; i < documents.size(); ++i) {
        if (!documents[i].IsNull()) {
            parser.problem(documents[i].Mark(), "",
                           "a config file holds one YAML document; a second one starts here");
            break;
        }
    }
    const YAML::Node root = documents.empty() ? YAML::Node() : documents.front();
    if (root.IsMap()) {
        for_each_key(parser, root, "",
                     [&](const std::string& name, const std::string& key, const YAML::Node& key_node,
                         const YAML::Node& value) {
                         for (const Section& s : sections()) {
                             if (s.name == name) {
                                 read_section(parser, s, value, config);
                                 return;
                             }
                         }
                         parser.problem(key_node.Mark(), key,
                                        unknown_key_message(name, section_names(), ""));
                     });
    } else if (!root.IsNull()) {
        parser.problem(root.Mark(), "",
                       "expected a mapping of sections (" + join(section_names(), ", ") + "); got " +
                           describe(root));
    }
    validate(parser, config);

    std::vector<ConfigProblem> problems = parser.take_problems();
    if (!problems.empty()) {
        // File order; problems about defaults (no location) last.
        std::stable_sort(problems.begin(), problems.end(), [](const ConfigProblem& a, const ConfigProblem& b) {
            auto order = [](const ConfigProblem& p) {
                return std::pair{p.line == 0 ? std::numeric_limits<int>::max() : p.line, p.column};
            };
            return order(a) < order(b);
        });
        throw ConfigError(std::move(problems));
    }
    return config;
}

ConfigProblem locate_problem(const std::string& file, const std::string& key, const std::string& message) {
    ConfigProblem problem = file_problem(file, message);
    problem.key = key;
    try {
        YAML::Node node = YAML::LoadFile(file);
        std::string_view rest = key;
        while (!rest.empty() && node && node.IsMap()) {
            const auto dot = rest.find('.');
            // reset(), not assignment: assigning a yaml-cpp node writes into the tree.
            node.reset(std::as_const(node)[std::string(rest.substr(0, dot))]);
            rest = dot == std::string_view::npos ? std::string_view{} : rest.substr(dot + 1);
        }
        if (rest.empty() && node && !node.Mark().is_null()) {
            problem.line = node.Mark().line + 1;
            problem.column = node.Mark().column + 1;
        }
    } catch (const YAML::Exception&) {
        // The file changed or went since it loaded: the key alone still names the problem.
    }
    return problem;
}

Config load_config(const std::string& path, const Config& defaults) {
    const reaper::detail::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd)
        throw ConfigError({file_problem(path, "cannot open: " + reaper::detail::errno_text(errno))});
    std::string text;
    struct stat st {};
    int error = 0;
    if (::fstat(fd.get(), &st) != 0) {
        error = errno;
    } else if (S_ISDIR(st.st_mode)) {
        error = EISDIR;
    } else {
        error = read_all(fd.get(), text);
    }
    if (error != 0)
        throw ConfigError({file_problem(path, "cannot read: " + reaper::detail::errno_text(error))});
    return parse_config(text, path, defaults);
}

std::string format_config(const Config& config) {
    YAML::Emitter out;
    out << YAML::BeginMap;
    for (const Section& s : sections()) {
        out << YAML::Key << std::string(s.name) << YAML::Value << YAML::BeginMap;
        for (const Field& f : s.fields) {
            out << YAML::Key << std::string(f.name) << YAML::Value;
            f.emit(out, config);
        }
        out << YAML::EndMap;
    }
    out << YAML::EndMap;
    return std::string(out.c_str()) + "\n";
}

std::vector<std::string> config_keys() {
    std::vector<std::string> keys;
    for (const Section& s : sections())
        for (const Field& f : s.fields)
            keys.push_back(std::string(s.name) + "." + std::string(f.name));
    return keys;
}

bool label_key_valid(std::string_view key) noexcept {
    if (key.empty() || key.size() > 255 || !is_alnum(key.front()) || !is_alnum(key.back()))
        return false;
    return std::all_of(key.begin(), key.end(),
                       [](char c) { return is_alnum(c) || c == '.' || c == '-' || c == '_' || c == '/'; });
}

}  // namespace reaperd
