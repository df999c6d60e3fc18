// Docker's own log rotation, set when a container is created: the one way to bound a log that
// breaks no reader (every reader of the json-file and local drivers follows the engine's own
// rotations; a cut from outside leaves Docker 23+'s followers and `--tail` past the end of
// the file, issue 21). Both doors through which reaperd's side creates containers use it: the
// labelling proxy of `reaperctl run --own` (proxy.hpp) and the library's Session (session.hpp).
//
// The rule: a container whose log driver is json-file or local, and whose own log options set
// neither max-size nor max-file, gets max-size = half its cap and max-file = 2, so the live
// file and its one rotation together stay within the cap that reaperd holds it to. Options
// that set either are the tool's choice and stay exactly as given.
#pragma once

#include <reaper/engine.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace reaper {

// reaperd's default logs.max_size (daemon/config.hpp LogsConfig): the cap assumed when no
// reaperd said its own (a Session without a lease, a proxy whose reaperd is older than the
// lease reply's log_max_size).
inline constexpr std::uint64_t default_log_cap_bytes = std::uint64_t{1} << 30;

// The label that overrides reaperd's logs.max_size for one container ("0" exempts it).
inline constexpr const char* log_max_size_label = "reaperd.log-max-size";

// The drivers whose files the engine rotates by max-size/max-file (moby's jsonfilelog and
// local). Podman's k8s-file is not one: conmon's max-size truncates the file to nothing.
bool driver_rotates(std::string_view driver);

// Whether a container's own log options already choose its rotation (max-size or max-file
// set): then none of them is touched.
bool sets_rotation(const std::map<std::string, std::string>& options);

// The cap reaperd holds a container to, as reaperd reads it (daemon/logcap_policy.cpp
// resolve_cap): its reaperd.log-max-size label when that parses as Docker's max-size
// (parse_docker_size, decimal; "0" = exempt, returned as 0), else `default_cap_bytes`.
std::uint64_t log_cap_for(const Labels& labels, std::uint64_t default_cap_bytes);

// {"max-size": <cap/2 in bytes>, "max-file": "2"}; empty when cap/2 is 0 (no cap, or a cap of
// one byte). The size is written as plain decimal digits, which both drivers read as that many
// bytes exactly: moby parses max-size with go-units FromHumanSize (jsonfilelog.go and
// local/config.go), whose grammar takes a number without a suffix as bytes, in go-units v0.4
// (Docker 20.10, its regexp `^(\d+(\.\d+)*) ?([kKmMgGtTpP])?[iI]?[bB]?$`) and v0.5 (Docker
// 23+) alike. A suffix would round: "1m" is 10^6 bytes whatever a MiB cap meant.
std::map<std::string, std::string> rotation_options(std::uint64_t cap_bytes);

// The most a container's log can hold by the engine's own rotation, from its driver and log
// options (inspect's HostConfig.LogConfig): max-size (as Docker reads it, parse_docker_size)
// times max-file (default 1 for json-file; for local, moby's defaults 20 MiB and 5 files
// stand in for what is unset, since that driver always rotates). The engine checks before each
// write, so each file can pass max-size by at most the one entry that crossed it. nullopt when
// the engine does not bound the log (json-file without max-size, other drivers) or an option
// does not parse. For reaperd's capper: a log whose bound is within its cap is the engine's to
// keep, and a cut from outside would only break its readers.
std::optional<std::uint64_t> engine_rotation_bound(std::string_view driver,
                                                   const std::map<std::string, std::string>& options);

}  // namespace reaper
