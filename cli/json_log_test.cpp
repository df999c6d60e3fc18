// How a json-file line decodes; what every log reader does with a file is log_readers_test's.
#include "json_log.hpp"

#include <boost/test/unit_test.hpp>

#include <optional>
#include <string>
#include <vector>

using namespace reaperctl;

BOOST_AUTO_TEST_CASE(lines_decode_as_the_engine_wrote_them_and_nothing_else_does) {
    struct Row {
        std::string line;
        std::optional<std::string> text;
        bool from_stderr = false;
    };
    const std::vector<Row> rows{
        {R"({"log":"hi\n","stream":"stdout","time":"2026-12-02T10:00:00Z"})", "hi\n"},
        {R"({"log":"oops\n","stream":"stderr","time":"2026-12-02T10:00:00Z"})", "oops\n", true},
        {R"({"log":"no newline: a partial entry","stream":"stdout","time":"t"})", "no newline: a partial entry"},
        {R"({"log":"\u00e9\t\"q\"\n","stream":"stdout","time":"t"})", "\xC3\xA9\t\"q\"\n"},
        {R"({"stream":"stdout","time":"t"})", std::nullopt},
        {R"({"log":7,"stream":"stdout","time":"t"})", std::nullopt},
        {R"({"log":"x","stream":"stdin","time":"t"})", std::nullopt},
        {R"("stream":"stdout","time":"2026-12-02T10:00:00Z"})", std::nullopt},  // torn by a punch
        {R"({"log":"torn","stre)", std::nullopt},                               // torn by a writer
        {std::string(100, '\0'), std::nullopt},                                  // a hole's NULs
        // A line read up to its log's middle, the rest punched out before it was read, joined
        // to a later line's end: control characters may not stand in a JSON string.
        {"{\"log\":\"12" + std::string(100, '\0') + "789\\n\",\"stream\":\"stdout\",\"time\":\"t\"}", std::nullopt},
        {"{\"log\":\"12\t34\",\"stream\":\"stdout\",\"time\":\"t\"}", std::nullopt},
        {"", std::nullopt},
        {"[1]", std::nullopt},
    };
    for (const auto& row : rows) {
        BOOST_TEST_CONTEXT(row.line) {
            const auto decoded = decode_json_log_line(row.line);
            BOOST_TEST(decoded.has_value() == row.text.has_value());
            if (decoded && row.text) {
                BOOST_TEST(decoded->text == *row.text);
                BOOST_TEST(decoded->from_stderr == row.from_stderr);
            }
        }
    }
}

