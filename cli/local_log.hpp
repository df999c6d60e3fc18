// Reading a container's log written by Docker's `local` driver, holes included: what
// `reaperctl logs` prints where the engine's own reader cannot.
//
// After reaperd punches the oldest part of a local log out (issue 21), the file starts with a
// hole of NUL bytes, and every Docker measured (20.10, 26.1, 28.5) prints nothing of it on a
// plain `docker logs`: its decoder reads the hole's zeros as empty entries, 8 bytes each, and
// stops at the frame the punch tore. These functions read only the file's data
// (data_regions()) and find the first whole entry past a hole by its framing.
//
// The file format (moby daemon/logger/local): one frame per entry, [size][entry][size], size a
// 32-bit big-endian count of the entry's bytes, the entry a protobuf LogEntry (api/types/
// plugins/logdriver/entry.proto): source = 1 (string), time_nano = 2 (varint), line = 3
// (bytes, without its '\n'), partial = 4 (bool), partial_log_metadata = 5 (message: last = 1,
// id = 2, ordinal = 3). The engine's reader refuses an entry over 1,000,000 bytes, and so do
// these.
#pragma once

#include "json_log.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace reaperctl {

// One entry's protobuf bytes (a frame without its two sizes). Its text is the line as the
// engine prints it: with a '\n' unless it is a partial entry other than the last of its line.
// nullopt for anything that is not a LogEntry from stdout or stderr (zeros of a hole, a torn
// frame, a wire type or length that does not fit).
std::optional<LogEntry> decode_local_entry(std::string_view entry);

// As read_entries(), tail_entries() and LogFormat::cut_before (json_log.hpp), for a local
// log: whole frames only; past a hole (or bytes that do not frame) reading starts at the
// first offset where a whole frame decodes; a frame the engine has not finished writing is
// left for a later call.
std::uint64_t read_local_entries(int fd, std::uint64_t offset, const EntrySink& sink);
std::vector<LogEntry> tail_local_entries(int fd, std::size_t n, std::uint64_t* follow_from = nullptr);
bool local_cut_before(int fd, std::uint64_t offset);

extern const LogFormat local_format;

}  // namespace reaperctl
