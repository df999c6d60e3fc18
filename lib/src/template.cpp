#include <reaper/template.hpp>
#include <reaper/units.hpp>

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

namespace reaper {

namespace {

std::string place(const std::string& source, int line, int column) {
    if (line <= 0) return source;
    return source + ":" + std::to_string(line) + ":" + std::to_string(column);
}

// Parses one template document, turning every problem into a TemplateError at its node.
class Parser {
public:
    explicit Parser(std::string source) : source_(std::move(source)) {}

    [[noreturn]] void fail(const YAML::Node& node, const std::string& problem) const {
        const auto mark = node.Mark();
        if (mark.is_null()) throw TemplateError(source_, 0, 0, problem);
        throw TemplateError(source_, mark.line + 1, mark.column + 1, problem);
    }

    void expect_map(const YAML::Node& node, const std::string& what) const {
        if (!node.IsMap()) fail(node, what + " must be a mapping");
    }

    void check_keys(const YAML::Node& map, const std::string& what, std::initializer_list<const char*> known) const {
        for (const auto& entry : map) {
            const auto key = entry.first.as<std::string>();
            if (std::none_of(known.begin(), known.end(), [&](const char* k) { return key == k; })) {
                std::string list;
                for (const char* k : known) list += std::string(list.empty() ? "" : ", ") + k;
                fail(entry.first, "unknown key '" + key + "' in " + what + " (known: " + list + ")");
            }
        }
    }

    std::string scalar(const YAML::Node& node, const std::string& what) const {
        if (!node.IsScalar()) fail(node, what + " must be a scalar");
        return node.Scalar();
    }

    std::vector<std::string> string_list(const YAML::Node& node, const std::string& what) const {
        std::vector<std::string> out;
        if (node.IsScalar()) {
            out.push_back(node.Scalar());
            return out;
        }
        if (!node.IsSequence()) fail(node, what + " must be a list of strings");
        for (const auto& item : node) out.push_back(scalar(item, "each item of " + what));
        return out;
    }

    std::map<std::string, std::string> string_map(const YAML::Node& node, const std::string& what) const {
        expect_map(node, what);
        std::map<std::string, std::string> out;
        for (const auto& entry : node) {
            auto key = scalar(entry.first, "a key of " + what);
            out[key] = scalar(entry.second, what + "." + key);
        }
        return out;
    }

    template <class F>
    auto convert(const YAML::Node& node, const std::string& what, F parse) const {
        auto text = scalar(node, what);
        try {
            return parse(text);
        } catch (const std::exception& e) {
            fail(node, what + ": " + e.what());
        }
    }

    SessionTemplate parse_template(const std::string& name, const YAML::Node& key, const YAML::Node& node) const {
        const std::string what = "template '" + name + "'";
        expect_map(node, what);
        check_keys(node, what,
                   {"image", "command", "entrypoint", "env", "labels", "limits", "log", "healthcheck",
                    "readiness"});
        SessionTemplate tmpl;
        tmpl.name = name;
        auto& spec = tmpl.spec;
        if (!node["image"]) fail(key, what + " has no image");
        spec.image = scalar(node["image"], what + ".image");
        if (spec.image.empty()) fail(node["image"], what + ".image is empty");
        if (auto n = node["command"]) spec.cmd = string_list(n, what + ".command");
        if (auto n = node["entrypoint"]) spec.entrypoint = string_list(n, what + ".entrypoint");
        if (auto n = node["env"]) {
            if (n.IsMap()) {
                for (const auto& [key, value] : string_map(n, what + ".env")) spec.env.push_back(key + "=" + value);
            } else {
                spec.env = string_list(n, what + ".env");
                for (std::size_t i = 0; i < spec.env.size(); ++i)
                    if (spec.env[i].find('=') == std::string::npos)
                        fail(n[i], what + ".env entry '" + spec.env[i] + "' is not KEY=value");
            }
        }
        if (auto n = node["labels"]) spec.labels = string_map(n, what + ".labels");
        if (auto n = node["limits"]) {
            expect_map(n, what + ".limits");
            check_keys(n, what + ".limits", {"memory", "cpus", "pids"});
            if (auto m = n["memory"])
                spec.memory_bytes = convert(m, what + ".limits.memory", [](const std::string& text) {
                    const std::uint64_t bytes = parse_size(text);
                    if (bytes > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
                        throw std::invalid_argument("invalid size \"" + text + "\": too large");
                    return static_cast<std::int64_t>(bytes);
                });
            if (auto c = n["cpus"])
                spec.nano_cpus = convert(c, what + ".limits.cpus", [](const std::string& text) {
                    std::size_t used = 0;
                    double cpus = std::stod(text, &used);
                    if (used != text.size() || !(cpus > 0) || cpus > 1024)
                        throw std::invalid_argument("'" + text + "' is not a CPU count in (0, 1024]");
                    return static_cast<std::int64_t>(std::llround(cpus * 1e9));
                });
            if (auto p = n["pids"])
                spec.pids_limit = convert(p, what + ".limits.pids", [](const std::string& text) {
                    std::int64_t value = 0;
                    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
                    if (ec != std::errc{} || end != text.data() + text.size() || value <= 0)
                        throw std::invalid_argument("'" + text + "' is not a positive integer");
                    return value;
                });
        }
        if (auto n = node["log"]) {
            expect_map(n, what + ".log");
            for (const auto& [key, value] : string_map(n, what + ".log")) {
                if (key == "driver")
                    spec.log_config.type = value;
                else
                    spec.log_config.options[key] = value;
            }
            // Checked here as the engine will read it, so a typo fails at load, not at create.
            if (auto s = n["max-size"]) convert(s, what + ".log.max-size", parse_docker_size);
        }
        if (auto n = node["healthcheck"]) {
            expect_map(n, what + ".healthcheck");
            check_keys(n, what + ".healthcheck", {"command", "interval"});
            if (!n["command"]) fail(n, what + ".healthcheck has no command");
            spec.healthcheck_cmd = string_list(n["command"], what + ".healthcheck.command");
            if (auto i = n["interval"]) spec.healthcheck_interval = convert(i, what + ".healthcheck.interval", parse_duration);
        }
        if (auto n = node["readiness"]) {
            expect_map(n, what + ".readiness");
            check_keys(n, what + ".readiness", {"command", "timeout"});
            if (auto c = n["command"]) tmpl.readiness_probe = string_list(c, what + ".readiness.command");
            if (auto t = n["timeout"]) tmpl.ready_timeout = convert(t, what + ".readiness.timeout", parse_duration);
        }
        return tmpl;
    }

    TemplateLibrary parse_document(const YAML::Node& root) const {
        TemplateLibrary library;
        if (!root || root.IsNull()) throw TemplateError(source_, 0, 0, "empty document: expected 'templates:'");
        expect_map(root, "the document");
        check_keys(root, "the document", {"templates"});
        auto templates = root["templates"];
        if (!templates) fail(root, "no 'templates:' mapping");
        expect_map(templates, "'templates'");
        for (const auto& entry : templates) {
            auto name = scalar(entry.first, "a template name");
            if (name.empty()) fail(entry.first, "a template name is empty");
            library.add(parse_template(name, entry.first, entry.second));
        }
        return library;
    }

private:
    std::string source_;
};

}  // namespace

TemplateError::TemplateError(std::string source, int line, int column, const std::string& problem)
    : std::runtime_error(place(source, line, column) + ": " + problem),
      source_(std::move(source)),
      line_(line),
      column_(column) {}

void TemplateLibrary::add(SessionTemplate tmpl) {
    if (tmpl.name.empty()) throw std::invalid_argument("template has no name");
    if (tmpl.spec.image.empty()) throw std::invalid_argument("template '" + tmpl.name + "' has no image");
    auto name = tmpl.name;
    templates_[name] = std::move(tmpl);
}

const SessionTemplate& TemplateLibrary::get(const std::string& name) const {
    auto found = templates_.find(name);
    if (found != templates_.end()) return found->second;
    std::string known;
    for (const auto& [n, t] : templates_) known += (known.empty() ? "" : ", ") + n;
    throw std::out_of_range("no template named '" + name + "' (known: " + (known.empty() ? "none" : known) + ")");
}

bool TemplateLibrary::contains(const std::string& name) const { return templates_.count(name) != 0; }

std::vector<std::string> TemplateLibrary::names() const {
    std::vector<std::string> out;
    for (const auto& [name, t] : templates_) out.push_back(name);
    return out;
}

TemplateLibrary TemplateLibrary::parse(std::string_view yaml_text, const std::string& source) {
    YAML::Node root;
    try {
        root = YAML::Load(std::string(yaml_text));
    } catch (const YAML::Exception& e) {
        if (e.mark.is_null()) throw TemplateError(source, 0, 0, e.msg);
        throw TemplateError(source, e.mark.line + 1, e.mark.column + 1, e.msg);
    }
    Parser parser(source);
    try {
        return parser.parse_document(root);
    } catch (const TemplateError&) {
        throw;
    } catch (const YAML::Exception& e) {
        if (e.mark.is_null()) throw TemplateError(source, 0, 0, e.msg);
        throw TemplateError(source, e.mark.line + 1, e.mark.column + 1, e.msg);
    }
}

TemplateLibrary TemplateLibrary::load_file(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw TemplateError(path, 0, 0, "cannot read the template file");
    std::ostringstream text;
    text << in.rdbuf();
    return parse(text.str(), path);
}

}  // namespace reaper
