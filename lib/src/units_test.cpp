#include <reaper/units.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

using namespace reaper;
using namespace std::chrono_literals;

namespace {

// The message of the std::invalid_argument that `parse` throws for `text`, or "" if none.
template <class F>
std::string refusal(F parse, const std::string& text) {
    try {
        parse(text);
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return "";
}

constexpr std::uint64_t K = 1024;

}  // namespace

BOOST_AUTO_TEST_SUITE(units)

// The config's messages (config_test checks them in context) come from here unchanged.
BOOST_AUTO_TEST_CASE(durations) {
    const std::vector<std::pair<std::string, std::int64_t>> good{
        {"0", 0},         {"0ms", 0},          {"500ms", 500},         {"10s", 10'000},
        {"5m", 300'000},  {"1h", 3'600'000},   {"1d", 86'400'000},     {"007s", 7'000},
        {"365d", max_duration.count()},        {"31536000000ms", max_duration.count()},
    };
    for (const auto& [text, ms] : good)
        BOOST_TEST_CONTEXT(text) { BOOST_TEST(parse_duration(text).count() == ms); }

    const std::vector<std::pair<std::string, std::string>> bad{
        {"", "invalid duration \"\": empty"},
        {"10", "invalid duration \"10\": no unit; write e.g. 10s (units: ms, s, m, h, d)"},
        {"-5s", "negative values are not allowed"},
        {"1.5s", "fractions are not supported"},
        {"5 s", "without a space"},
        {"10sec", "unknown unit \"sec\" (units: ms, s, m, h, d)"},
        {"1h30m", "90m rather than 1h30m"},
        {"ten", "invalid duration \"ten\"; expected e.g. 500ms, 10s, 5m"},
        {"366d", "more than 365d, the longest allowed"},
        {"31536000001ms", "more than 365d"},
        {"99999999999999999999s", "too large"},
        {"1\n", "invalid duration \"1\\x0a\""},
    };
    for (const auto& [text, message] : bad) {
        BOOST_TEST_CONTEXT(text) {
            const std::string what = refusal(parse_duration, text);
            BOOST_TEST(what.find(message) != std::string::npos, what);
        }
    }
    std::string why;
    BOOST_TEST(!try_parse_duration("ten", why).has_value());
    BOOST_TEST(why.empty());  // not a quantity at all: the caller's example says it
}

BOOST_AUTO_TEST_CASE(durations_format_back) {
    const std::vector<std::pair<std::int64_t, std::string>> rows{
        {0, "0"},          {1, "1ms"},        {1'500, "1500ms"}, {90'000, "90s"},
        {5'400'000, "90m"}, {3'600'000, "1h"}, {86'400'000, "1d"}, {max_duration.count(), "365d"},
    };
    for (const auto& [ms, text] : rows) {
        BOOST_TEST_CONTEXT(text) {
            BOOST_TEST(format_duration(std::chrono::milliseconds{ms}) == text);
            BOOST_TEST(parse_duration(text).count() == ms);
        }
    }
    BOOST_TEST(format_duration(-1500ms) == "-1500ms");
}

// reaperd's sizes are binary, whatever the suffix: "10MB" is 10 MiB (README, config/reaperd.yaml).
BOOST_AUTO_TEST_CASE(sizes_are_binary) {
    const std::vector<std::pair<std::string, std::uint64_t>> good{
        {"0", 0},
        {"1024", 1024},
        {"7b", 7},
        {"100k", 100 * K},
        {"10KiB", 10 * K},
        {"10M", 10 * K * K},
        {"10m", 10 * K * K},
        {"5MB", 5 * K * K},
        {"1Gi", K * K * K},
        {"1GiB", K * K * K},
        {"1TiB", K * K * K * K},
        {"18446744073709551615", std::numeric_limits<std::uint64_t>::max()},
    };
    for (const auto& [text, bytes] : good) {
        BOOST_TEST_CONTEXT(text) {
            BOOST_TEST(parse_size(text) == bytes);
            BOOST_TEST(parse_size(format_size(bytes)) == bytes);
        }
    }
    const std::vector<std::pair<std::string, std::string>> bad{
        {"", "empty"},
        {"-1", "negative"},
        {"1.5G", "fractions"},
        {"10 MiB", "without a space"},
        {"1PiB", "unknown unit \"PiB\" (units: B, KiB, MiB, GiB, TiB)"},
        {"1ib", "unknown unit \"ib\""},
        {"lots", "invalid size \"lots\"; expected e.g. 100MiB, 1GiB, 0"},
        {"16777216TiB", "too large"},
    };
    for (const auto& [text, message] : bad) {
        BOOST_TEST_CONTEXT(text) {
            const std::string what = refusal(parse_size, text);
            BOOST_TEST(what.find(message) != std::string::npos, what);
        }
    }
    BOOST_TEST(format_size(1536) == "1536");
    BOOST_TEST(format_size(1536 * K) == "1536KiB");
    BOOST_TEST(format_size(100 * K * K) == "100MiB");
}

// Docker's log max-size is go-units FromHumanSize: decimal, and the "i" changes nothing.
// The expected values are what `docker run --log-opt max-size=X` caps at: most rows are
// go-units v0.5 size_test.go's TestFromHumanSize.
BOOST_AUTO_TEST_CASE(docker_sizes_are_decimal) {
    const std::vector<std::pair<std::string, std::uint64_t>> good{
        {"0", 0},
        {"32", 32},
        {"32b", 32},
        {"32B", 32},
        {"32k", 32'000},
        {"32K", 32'000},
        {"32kb", 32'000},
        {"32Kb", 32'000},
        {"32Mb", 32'000'000},
        {"32Gb", 32'000'000'000},
        {"32Tb", 32'000'000'000'000},
        {"32Pb", 32'000'000'000'000'000},
        {"10m", 10'000'000},
        {"10MiB", 10'000'000},  // FromHumanSize ignores the i
        {"1kib", 1'000},
        {"32.5KB", 32'500},
        {"32.5 kB", 32'500},
        {"0.3 K", 300},
        {".3kB", 300},
        {"32.", 32},
        {"32. B", 32},
        {"32.5 B", 32},
        {"0 ", 0},
        {"0.3m", 300'000},
        {"1.5", 1},              // int64(1.5) in Go
        {"5 MB", 5'000'000},     // one space between number and unit
        {"9223372036854774784", 9223372036854774784u},  // the largest double below 2^63
    };
    for (const auto& [text, bytes] : good)
        BOOST_TEST_CONTEXT(text) { BOOST_TEST(parse_docker_size(text) == bytes); }

    const std::vector<std::pair<std::string, std::string>> bad{
        {"", "invalid size \"\"; expected e.g. 10m, 1.5g, 500k"},
        {"-32", "negative"},
        {".", "expected e.g."},
        {"-0", "negative"},
        {" 32", "expected e.g."},
        {"32b ", "unknown unit"},
        {"32m b", "unknown unit"},
        {"1.2.3", "unknown unit"},
        {"m", "expected e.g."},
        {"32x", "unknown unit \"x\""},
        {"32mm", "unknown unit \"mm\""},
        {"32i", "unknown unit \"i\""},    // go-units v0.4 took it, v0.5 does not
        {"32kibb", "unknown unit"},
        {"1e3", "unknown unit \"e3\""},   // v0.5's ParseFloat took it, v0.4's regex did not
        {"32  MB", "unknown unit \" MB\""},
        {"ten megs", "expected e.g."},
        {"9223372036854775807", "too large"},  // a float64 of 2^63: Go's int64() overflows
        {"10Pb0", "unknown unit"},
        {"9300p", "too large"},
    };
    for (const auto& [text, message] : bad) {
        BOOST_TEST_CONTEXT(text) {
            const std::string what = refusal(parse_docker_size, text);
            BOOST_TEST(what.find(message) != std::string::npos, what);
        }
    }
}

BOOST_AUTO_TEST_CASE(rfc3339) {
    using Clock = std::chrono::system_clock;
    const auto epoch_ns = [](const std::string& text) -> std::optional<std::int64_t> {
        const auto t = parse_rfc3339(text);
        if (!t) return std::nullopt;
        return std::chrono::duration_cast<std::chrono::nanoseconds>(t->time_since_epoch()).count();
    };
    const std::vector<std::pair<std::string, std::optional<std::int64_t>>> rows{
        {"1970-01-01T00:00:00Z", 0},
        {"1970-01-01T00:00:01.5Z", 1'500'000'000},
        {"2026-11-30T13:26:20.123456789Z", 1'796'045'180'123'456'789},
        {"2026-11-30T15:26:20.123456789+02:00", 1'796'045'180'123'456'789},
        {"2026-11-30T12:56:20.123456789-00:30", 1'796'045'180'123'456'789},
        {"2026-11-30t13:26:20z", std::nullopt},  // the T must be upper case
        {"2026-11-30T13:26:20z", 1'796'045'180'000'000'000},
        {"0001-01-01T00:00:00Z", std::nullopt},  // the engine's zero time: outside the clock
        {"2026-11-30T13:26:20", std::nullopt},   // no zone
        {"2026-11-30T13:26:20+02", std::nullopt},
        {"2026-11-30", std::nullopt},
        {"", std::nullopt},
        {"yesterday", std::nullopt},
    };
    for (const auto& [text, ns] : rows)
        BOOST_TEST_CONTEXT(text) { BOOST_TEST(epoch_ns(text).value_or(-1) == ns.value_or(-1)); }  // -1: none
    static_assert(std::is_same_v<decltype(parse_rfc3339(""))::value_type, Clock::time_point>);
}

BOOST_AUTO_TEST_CASE(utf8) {
    const std::vector<std::pair<std::string, std::size_t>> rows{
        {"", std::string_view::npos},
        {"plain ascii", std::string_view::npos},
        {"caf\xc3\xa9", std::string_view::npos},
        {"\xe2\x82\xac", std::string_view::npos},           // U+20AC, 3 bytes
        {"\xf0\x9f\x98\x80", std::string_view::npos},       // U+1F600, 4 bytes
        {"\xf4\x8f\xbf\xbf", std::string_view::npos},       // U+10FFFF, the last one
        {"\xed\x9f\xbf", std::string_view::npos},           // U+D7FF, just below the surrogates
        {std::string("a\0b", 3), std::string_view::npos},   // NUL is a character
        {"ab\x80", 2},                                      // a stray continuation byte
        {"caf\xc3", 3},                                     // cut short
        {"\xc3(", 0},                                       // lead without continuation
        {"\xc0\xaf", 0},                                    // overlong '/'
        {"\xe0\x80\xaf", 0},                                // overlong, 3 bytes
        {"\xf0\x80\x80\xaf", 0},                            // overlong, 4 bytes
        {"x\xed\xa0\x80", 1},                               // U+D800, a surrogate
        {"\xf4\x90\x80\x80", 0},                            // U+110000, past the last
        {"\xf8\x88\x80\x80\x80", 0},                        // 5-byte forms are gone
        {"\xff", 0},
    };
    for (const auto& [text, at] : rows) {
        BOOST_TEST_CONTEXT("row of " << text.size() << " bytes at " << at) {
            BOOST_TEST(invalid_utf8_at(text) == at);
            BOOST_TEST(valid_utf8(text) == (at == std::string_view::npos));
        }
    }
}

// Label values are the engine's, and any user of the engine may set them: none may drive the
// terminal that shows them.
BOOST_AUTO_TEST_CASE(terminal_safe_escapes_what_would_drive_a_terminal) {
    const std::vector<std::pair<std::string, std::string>> cases{
        {"build-42", "build-42"},
        {"sessiön", "sessiön"},                                // valid UTF-8 stays
        {"a b", "a b"},
        {"evil\n<3>err: forged", "evil\\x0a<3>err: forged"},  // no forged line
        {"\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"},       // no colour, no cursor
        {"bell\a del\x7f", "bell\\x07 del\\x7f"},
        {"csi\xc2\x9b" "2J", "csi\\xc2\\x9b2J"},              // C1 in UTF-8
        {"nbsp\xc2\xa0ok", "nbsp\xc2\xa0ok"},                 // U+00A0 is printable
        {"raw\x9b" "2J", "raw\\x9b2J"},                       // not UTF-8
        {"cut\xc3", "cut\\xc3"},
        {std::string("nul\0x", 5), "nul\\x00x"},
        {"", ""},
    };
    for (const auto& [text, expected] : cases) {
        BOOST_TEST_CONTEXT(expected) { BOOST_TEST(terminal_safe(text) == expected); }
    }
}

BOOST_AUTO_TEST_CASE(quote_for_message_quotes_escapes_and_cuts_at_a_character) {
    const std::string euro_at_the_cut = std::string(59, 'e') + "\xe2\x82\xac";  // bytes 59-61
    std::string stray_bytes_shown;  // not UTF-8 at all: the cut backs off 3 bytes at most
    for (int i = 0; i < 57; ++i) stray_bytes_shown += "\\x80";
    const std::vector<std::pair<std::string, std::string>> cases{
        {"10sec", "\"10sec\""},
        {"say \"hi\" \\o/", "\"say \\\"hi\\\" \\\\o/\""},
        {"1\n", "\"1\\x0a\""},
        {"csi\xc2\x9b" "2J", "\"csi\\xc2\\x9b2J\""},
        {"raw\xff", "\"raw\\xff\""},
        {"caf\xc3\xa9", "\"caf\xc3\xa9\""},
        {std::string(61, 'x'), "\"" + std::string(60, 'x') + "...\""},
        {euro_at_the_cut, "\"" + std::string(59, 'e') + "...\""},
        {std::string(70, '\x80'), "\"" + stray_bytes_shown + "...\""},
    };
    for (const auto& [text, expected] : cases) {
        BOOST_TEST_CONTEXT(expected) { BOOST_TEST(quote_for_message(text) == expected); }
    }
}

BOOST_AUTO_TEST_SUITE_END()
