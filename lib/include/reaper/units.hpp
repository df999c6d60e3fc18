// The one grammar for each unit reaperd and libreaper read: durations and sizes in config
// files, templates and labels, Docker's log `max-size`, the engine's RFC 3339 timestamps, and
// UTF-8 text. Pure functions of their argument; none allocates more than its result.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace reaper {

// The longest duration any parser here accepts: a year, so that adding one to any clock
// reading cannot overflow.
inline constexpr std::chrono::milliseconds max_duration = std::chrono::hours{24 * 365};

// "500ms", "10s", "5m", "2h", "1d", "0" -> milliseconds: a whole number and one unit
// (ms, s, m, h, d); only 0 may go without a unit; at most max_duration. Throws
// std::invalid_argument reading `invalid duration "<text>": <why>` (negative, fraction,
// unknown unit, no unit, too large).
std::chrono::milliseconds parse_duration(std::string_view text);
// The same grammar without the exception: nullopt with `why` set to what is wrong, or left
// empty when the text is not a number and unit at all (the caller's example says it then).
std::optional<std::chrono::milliseconds> try_parse_duration(std::string_view text, std::string& why);
// The largest unit that represents d exactly ("10s", "1500ms", "0"); parse_duration reads
// it back to d for every 0 <= d <= max_duration. Negative values (never parsed) get a "-".
std::string format_duration(std::chrono::milliseconds d);

// Sizes of reaperd's config and of templates' memory limits, binary throughout:
// "0", "1024", "10KiB", "10MiB", "1GiB", "1G", "10M", "100k" -> bytes: a whole number and
// an optional unit B, K, KB, Ki, KiB, and the same for M, G and T (case-insensitive;
// every K is 1024, "10MB" too). Throws std::invalid_argument reading
// `invalid size "<text>": <why>`.
std::uint64_t parse_size(std::string_view text);
// The same grammar without the exception, as try_parse_duration.
std::optional<std::uint64_t> try_parse_size(std::string_view text, std::string& why);
// The largest binary unit that represents bytes exactly ("100MiB", "1536KiB", "1023", "0");
// parse_size reads it back.
std::string format_size(std::uint64_t bytes);

// A size as Docker reads the json-file and local log drivers' `max-size`: go-units'
// FromHumanSize (moby daemon/logger/jsonfilelog/jsonfilelog.go: `units.FromHumanSize(capacity)`),
// which is DECIMAL whatever the suffix says: "10m", "10MB" and "10MiB" are all 10,000,000
// bytes, "1k" is 1000. (RAMInBytes, the binary one, is what `--memory` uses.)
// The grammar of go-units v0.5 (docker/go-units size.go parseSize, vendored by moby since
// Docker 23): a decimal number with an optional point ("10", "1.5", ".5", "5."), one optional
// space, and an optional suffix b, or k/m/g/t/p alone or followed by b or ib, any case; the
// bytes are the number times the unit, truncated as Go's int64(float64 product) does.
// What strconv.ParseFloat also takes but no size is written as (signs, exponents, hex, inf)
// is refused, "-0" too. Throws std::invalid_argument reading `invalid size "<text>": <why>`;
// 2^63 bytes or more is too large (Docker's int64 cannot hold it either).
std::uint64_t parse_docker_size(std::string_view text);

// The engine's timestamps: "2026-11-30T13:26:20.123456789Z" or with an offset ("+02:00").
// nullopt when the text is not that, or outside what system_clock holds (the engine's zero
// time 0001-01-01T00:00:00Z among them).
std::optional<std::chrono::system_clock::time_point> parse_rfc3339(std::string_view text);

// Where the first byte that does not start a valid UTF-8 sequence is (truncated, overlong,
// a surrogate, above U+10FFFF, a stray continuation byte), or std::string_view::npos.
std::size_t invalid_utf8_at(std::string_view text) noexcept;
inline bool valid_utf8(std::string_view text) noexcept {
    return invalid_utf8_at(text) == std::string_view::npos;
}

// `text` (a label value, a name, an engine's error: anything a user of the engine may set) as
// a terminal may show it: control characters (C0, DEL, and C1 such as CSI in UTF-8) and bytes
// that are not valid UTF-8 as \xNN, so that no value can move the cursor, colour the screen or
// forge a line; the rest, valid UTF-8 included, as it is.
std::string terminal_safe(std::string_view text);

// A value from the user for an error message: in double quotes, cut after 60 bytes (at a
// character's start) with "...", quotes and backslashes escaped, the rest as terminal_safe.
std::string quote_for_message(std::string_view text);

}  // namespace reaper
