// Session templates: named container presets (image, command, env, labels, resource limits,
// log caps, health check, readiness probe), defined in code or loaded from YAML.
//
// YAML format (every key but `image` optional; unknown keys are errors):
//
//   templates:
//     sandbox:
//       image: reaper-test/busybox:latest
//       command: [sleep, "3600"]
//       entrypoint: [/bin/sh, -c]
//       env: {MODE: test}            # or a list: ["MODE=test"]
//       labels: {team: infra}
//       limits: {memory: 256m, cpus: 0.5, pids: 100}
//       log: {driver: json-file, max-size: 10m, max-file: 2}
//       healthcheck: {command: [true], interval: 1s}
//       readiness: {command: [test, -e, /tmp/ready], timeout: 30s}
//
// Units are those of reaper/units.hpp: durations as parse_duration (500ms, 30s, 5m, 1h, 1d);
// limits.memory as parse_size (binary: 256m = 256MiB); log.max-size is passed to the engine
// as written and checked as Docker reads it (parse_docker_size: decimal, 10m = 10,000,000).
#pragma once

#include <reaper/engine.hpp>
#include <reaper/units.hpp>  // the units templates are written in

#include <chrono>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace reaper {

struct SessionTemplate {
    std::string name;
    ContainerSpec spec;  // spec.name is ignored by templates: the engine names each container
    // Run in the container after it runs (and is healthy); ready once it exits 0. Empty: none.
    std::vector<std::string> readiness_probe;
    // How long opening may wait for readiness; unset: the SessionOptions' ready_timeout.
    std::optional<std::chrono::milliseconds> ready_timeout;
};

// A bad template file or text. what() reads "<source>:<line>:<column>: <problem>" when the
// place is known, else "<source>: <problem>"; line and column are 1-based, 0 when unknown.
class TemplateError : public std::runtime_error {
public:
    TemplateError(std::string source, int line, int column, const std::string& problem);
    const std::string& source() const noexcept { return source_; }
    int line() const noexcept { return line_; }
    int column() const noexcept { return column_; }

private:
    std::string source_;
    int line_;
    int column_;
};

class TemplateLibrary {
public:
    // Adds a template, replacing one of the same name. Throws std::invalid_argument when the
    // name or the image is empty.
    void add(SessionTemplate tmpl);
    // Throws std::out_of_range naming the template and the known names when there is none.
    const SessionTemplate& get(const std::string& name) const;
    bool contains(const std::string& name) const;
    std::vector<std::string> names() const;  // sorted

    // Parses YAML text in the format above; `source` names it in errors. Throws TemplateError.
    static TemplateLibrary parse(std::string_view yaml_text, const std::string& source = "<text>");
    // Reads and parses a file. Throws TemplateError (also when the file cannot be read).
    static TemplateLibrary load_file(const std::string& path);

private:
    std::map<std::string, SessionTemplate> templates_;
};

}  // namespace reaper
