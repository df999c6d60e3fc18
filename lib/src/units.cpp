#include <reaper/units.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <ctime>
#include <limits>
#include <stdexcept>
#include <system_error>

namespace reaper {

namespace {

struct Unit {
    std::string_view name;
    std::uint64_t factor;
};

constexpr std::array<Unit, 5> duration_units{{
    {"d", 86'400'000}, {"h", 3'600'000}, {"m", 60'000}, {"s", 1'000}, {"ms", 1}}};

constexpr std::uint64_t KiB = 1024;
constexpr std::array<Unit, 4> size_format_units{{
    {"TiB", KiB * KiB * KiB * KiB}, {"GiB", KiB * KiB * KiB}, {"MiB", KiB * KiB}, {"KiB", KiB}}};

bool is_digit(char c) { return c >= '0' && c <= '9'; }
char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }


std::invalid_argument invalid(std::string_view what, std::string_view text, const std::string& why,
                              std::string_view example) {
    return std::invalid_argument("invalid " + std::string(what) + " " + quote_for_message(text) +
                                 (why.empty() ? "; expected e.g. " + std::string(example) : ": " + why));
}

// A whole number followed by a unit, as written; `why` is set when the text is not that shape.
struct Quantity {
    std::uint64_t number = 0;
    std::string_view unit;
};

std::optional<Quantity> split_quantity(std::string_view text, std::string& why) {
    if (text.empty()) {
        why = "empty";
        return std::nullopt;
    }
    if (text.front() == '-') {
        why = "negative values are not allowed";
        return std::nullopt;
    }
    std::size_t digits = 0;
    while (digits < text.size() && is_digit(text[digits]))
        ++digits;
    if (digits == 0)
        return std::nullopt;  // nothing specific to say: the expected form says it all
    if (digits < text.size() && (text[digits] == '.' || text[digits] == ',')) {
        why = "fractions are not supported; use a smaller unit";
        return std::nullopt;
    }
    if (digits < text.size() && text[digits] == ' ') {
        why = "write the number and its unit without a space";
        return std::nullopt;
    }
    Quantity q;
    auto [end, ec] = std::from_chars(text.data(), text.data() + digits, q.number);
    if (ec == std::errc::result_out_of_range || end != text.data() + digits) {
        why = "too large";
        return std::nullopt;
    }
    q.unit = text.substr(digits);
    return q;
}

std::optional<std::uint64_t> try_parse_docker_size(std::string_view text, std::string& why) {
    if (!text.empty() && text.front() == '-') {
        why = "negative values are not allowed";
        return std::nullopt;
    }
    // Digits with an optional point anywhere (".5", "5.", "1.5"), as strconv.ParseFloat reads them.
    std::size_t end = 0;
    std::size_t digits = 0;
    bool point = false;
    for (; end < text.size(); ++end) {
        if (is_digit(text[end]))
            ++digits;
        else if (text[end] == '.' && !point)
            point = true;
        else
            break;
    }
    if (digits == 0)
        return std::nullopt;
    double number = 0;
    if (auto [ptr, ec] = std::from_chars(text.data(), text.data() + end, number);
        ec != std::errc{} || ptr != text.data() + end) {
        why = "too large";
        return std::nullopt;
    }
    std::string_view rest = text.substr(end);
    if (!rest.empty() && rest.front() == ' ')
        rest.remove_prefix(1);
    std::string suffix;
    for (char c : rest)
        suffix += lower(c);
    double factor = 0;
    if (suffix.empty() || suffix == "b") {
        factor = 1;
    } else if (const std::string tail = suffix.substr(1); tail.empty() || tail == "b" || tail == "ib") {
        constexpr std::string_view prefixes = "kmgtp";
        if (const std::size_t power = prefixes.find(suffix.front()); power != std::string_view::npos) {
            factor = 1000;
            for (std::size_t i = 0; i < power; ++i)
                factor *= 1000;
        }
    }
    if (factor == 0) {
        why = "unknown unit \"" + std::string(rest) + "\" (Docker's: b, k, m, g, t, p, optionally with b or ib)";
        return std::nullopt;
    }
    // Go multiplies in float64 and converts with int64(): the same product, truncated.
    const double bytes = number * factor;
    constexpr double two_to_the_63 = 9223372036854775808.0;
    if (!(bytes < two_to_the_63)) {
        why = "too large";
        return std::nullopt;
    }
    return static_cast<std::uint64_t>(bytes);
}

}  // namespace

std::optional<std::chrono::milliseconds> try_parse_duration(std::string_view text, std::string& why) {
    auto q = split_quantity(text, why);
    if (!q)
        return std::nullopt;
    if (q->unit.empty()) {
        if (q->number == 0)
            return std::chrono::milliseconds{0};
        why = "no unit; write e.g. " + std::to_string(q->number) + "s (units: ms, s, m, h, d)";
        return std::nullopt;
    }
    for (const Unit& u : duration_units) {
        if (q->unit != u.name)
            continue;
        constexpr auto limit = static_cast<std::uint64_t>(max_duration.count());
        if (q->number > limit / u.factor) {
            why = "more than " + format_duration(max_duration) + ", the longest allowed";
            return std::nullopt;
        }
        return std::chrono::milliseconds{static_cast<std::chrono::milliseconds::rep>(q->number * u.factor)};
    }
    if (std::any_of(q->unit.begin(), q->unit.end(), is_digit))
        why = "one number and one unit, e.g. 90m rather than 1h30m";
    else
        why = "unknown unit \"" + std::string(q->unit) + "\" (units: ms, s, m, h, d)";
    return std::nullopt;
}

std::chrono::milliseconds parse_duration(std::string_view text) {
    std::string why;
    auto d = try_parse_duration(text, why);
    if (!d)
        throw invalid("duration", text, why, "500ms, 10s, 5m");
    return *d;
}

std::string format_duration(std::chrono::milliseconds d) {
    if (d.count() == 0)
        return "0";
    const bool negative = d.count() < 0;
    const std::uint64_t ms = negative ? 0 - static_cast<std::uint64_t>(d.count())
                                      : static_cast<std::uint64_t>(d.count());
    const Unit* unit = &duration_units.back();
    for (const Unit& u : duration_units) {
        if (ms % u.factor == 0) {
            unit = &u;
            break;
        }
    }
    // Appended piece by piece: GCC 12 at -O3 (the .deb's build) warns -Wrestrict on
    // `"-" + std::string&&` here, a false positive.
    std::string text = negative ? "-" : "";
    text += std::to_string(ms / unit->factor);
    text += unit->name;
    return text;
}

std::optional<std::uint64_t> try_parse_size(std::string_view text, std::string& why) {
    auto q = split_quantity(text, why);
    if (!q)
        return std::nullopt;
    // B, or K/M/G/T followed by nothing, B, i or iB (any case): all binary.
    std::string unit;
    for (char c : q->unit)
        unit += lower(c);
    std::uint64_t factor = 0;
    if (unit.empty() || unit == "b") {
        factor = 1;
    } else if (const std::string rest = unit.substr(1); rest.empty() || rest == "b" || rest == "i" || rest == "ib") {
        constexpr std::string_view prefixes = "kmgt";
        if (const std::size_t power = prefixes.find(unit.front()); power != std::string_view::npos) {
            factor = KiB;
            for (std::size_t i = 0; i < power; ++i)
                factor *= KiB;
        }
    }
    if (factor == 0) {
        why = "unknown unit \"" + std::string(q->unit) + "\" (units: B, KiB, MiB, GiB, TiB)";
        return std::nullopt;
    }
    if (q->number > std::numeric_limits<std::uint64_t>::max() / factor) {
        why = "too large";
        return std::nullopt;
    }
    return q->number * factor;
}

std::uint64_t parse_size(std::string_view text) {
    std::string why;
    auto bytes = try_parse_size(text, why);
    if (!bytes)
        throw invalid("size", text, why, "100MiB, 1GiB, 0");
    return *bytes;
}

std::string format_size(std::uint64_t bytes) {
    if (bytes == 0)
        return "0";
    for (const Unit& u : size_format_units)
        if (bytes % u.factor == 0)
            return std::to_string(bytes / u.factor) + std::string(u.name);
    return std::to_string(bytes);
}

std::uint64_t parse_docker_size(std::string_view text) {
    std::string why;
    auto bytes = try_parse_docker_size(text, why);
    if (!bytes)
        throw invalid("size", text, why, "10m, 1.5g, 500k");
    return *bytes;
}

std::optional<std::chrono::system_clock::time_point> parse_rfc3339(std::string_view view) {
    using Clock = std::chrono::system_clock;
    const std::string text(view);  // sscanf needs the terminating NUL
    int year, month, day, hour, minute, second, consumed = 0;
    if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &year, &month, &day, &hour, &minute,
                    &second, &consumed) != 6)
        return std::nullopt;
    std::tm tm{};
    tm.tm_year = year - 1900;
    tm.tm_mon = month - 1;
    tm.tm_mday = day;
    tm.tm_hour = hour;
    tm.tm_min = minute;
    tm.tm_sec = second;
    time_t seconds = timegm(&tm);
    std::size_t pos = static_cast<std::size_t>(consumed);
    std::int64_t nanos = 0;
    if (pos < text.size() && text[pos] == '.') {
        std::int64_t scale = 100000000;
        for (++pos; pos < text.size() && text[pos] >= '0' && text[pos] <= '9'; ++pos) {
            nanos += (text[pos] - '0') * scale;
            scale /= 10;
        }
    }
    if (pos >= text.size()) return std::nullopt;
    if (text[pos] == '+' || text[pos] == '-') {
        int oh = 0, om = 0;
        if (std::sscanf(text.c_str() + pos + 1, "%2d:%2d", &oh, &om) != 2) return std::nullopt;
        long offset = (oh * 3600L + om * 60L) * (text[pos] == '+' ? 1 : -1);
        seconds -= offset;
    } else if (text[pos] != 'Z' && text[pos] != 'z') {
        return std::nullopt;
    }
    // The clock counts nanoseconds in 64 bits (years 1678 to 2262); the engine's zero time
    // (0001-01-01T00:00:00Z) and the like are outside it, so they are not times we can use.
    constexpr auto clock_seconds =
        std::chrono::duration_cast<std::chrono::seconds>(Clock::duration::max()).count() - 1;
    if (seconds > clock_seconds || seconds < -clock_seconds) return std::nullopt;
    return Clock::time_point{std::chrono::duration_cast<Clock::duration>(std::chrono::seconds{seconds} +
                                                                         std::chrono::nanoseconds{nanos})};
}

std::size_t invalid_utf8_at(std::string_view text) noexcept {
    std::size_t i = 0;
    while (i < text.size()) {
        const auto c = static_cast<unsigned char>(text[i]);
        std::size_t length = 0;
        std::uint32_t code = 0;
        if (c < 0x80) {
            ++i;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            length = 2;
            code = c & 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            length = 3;
            code = c & 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            length = 4;
            code = c & 0x07;
        } else {
            return i;
        }
        if (i + length > text.size()) return i;
        for (std::size_t k = 1; k < length; ++k) {
            const auto d = static_cast<unsigned char>(text[i + k]);
            if ((d & 0xc0) != 0x80) return i;
            code = (code << 6) | (d & 0x3f);
        }
        const bool overlong = (length == 2 && code < 0x80) || (length == 3 && code < 0x800) ||
                              (length == 4 && code < 0x10000);
        if (overlong || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return i;
        i += length;
    }
    return std::string_view::npos;
}

namespace {

void append_hex(std::string& out, unsigned char byte) {
    constexpr char digits[] = "0123456789abcdef";
    out += "\\x";
    out += digits[byte >> 4];
    out += digits[byte & 0xf];
}

}  // namespace

std::string terminal_safe(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    while (!text.empty()) {
        const std::size_t bad = invalid_utf8_at(text);
        const std::string_view valid = text.substr(0, bad);
        for (std::size_t i = 0; i < valid.size(); ++i) {
            const auto byte = static_cast<unsigned char>(valid[i]);
            const bool c1 = byte == 0xc2 && i + 1 < valid.size() && static_cast<unsigned char>(valid[i + 1]) < 0xa0;
            if (byte < 0x20 || byte == 0x7f) {
                append_hex(out, byte);
            } else if (c1) {  // U+0080-U+009F, among them CSI (U+009B)
                append_hex(out, byte);
                append_hex(out, static_cast<unsigned char>(valid[++i]));
            } else {
                out += valid[i];
            }
        }
        if (bad == std::string_view::npos) break;
        append_hex(out, static_cast<unsigned char>(text[bad]));
        text.remove_prefix(bad + 1);
    }
    return out;
}

std::string quote_for_message(std::string_view text) {
    constexpr std::size_t max_shown = 60;
    std::size_t shown = std::min(text.size(), max_shown);
    // Cut where a character starts (a UTF-8 character is at most 4 bytes), so the cut shows no
    // half of one as \xNN.
    for (int back = 0; back < 3 && shown < text.size() && (static_cast<unsigned char>(text[shown]) & 0xc0) == 0x80; ++back)
        --shown;
    std::string escaped;
    for (const char c : text.substr(0, shown)) {
        if (c == '"' || c == '\\') escaped += '\\';
        escaped += c;
    }
    // The quotes and backslashes added are ASCII, so terminal_safe sees every character whole.
    return "\"" + terminal_safe(escaped) + (shown < text.size() ? "...\"" : "\"");
}

}  // namespace reaper
