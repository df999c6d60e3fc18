// The plain-stderr form of reaperd's log (used when not running under journald): one line
// per record, priority first, fields as KEY=value pairs that split back apart.
// The journald form is tested against a real journald in tests/integration/journal_test.cpp.
#include "log.hpp"

#include "captured_stderr.hpp"

#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <string>

namespace {

// reaperd's lines on stderr while `emit` runs.
template <typename F>
std::string captured_stderr(F emit) {
    // Chosen before the first record and kept for the process: force plain lines.
    setenv("REAPERD_LOG_TARGET", "stderr", 1);
    return reaper::test::captured_stderr(emit);
}

}  // namespace

BOOST_AUTO_TEST_CASE(record_with_fields_is_one_line) {
    auto out = captured_stderr([] {
        reaperd::log(reaperd::Priority::notice, reaperd::message_id::container_reaped,
                     "container reaped",
                     {{"CONTAINER_ID", "0123abcd"}, {"CONTAINER_NAME", "web-1"},
                      {"SESSION_ID", "s-42"}, {"ACTION", "remove"}});
    });
    BOOST_TEST(out ==
               "<5>notice: container reaped CONTAINER_ID=0123abcd CONTAINER_NAME=web-1 "
               "SESSION_ID=s-42 ACTION=remove MESSAGE_ID=0e62ab2724b54aa1a1c7ea5d3e0bebbf\n");
}

struct PriorityCase {
    reaperd::Priority priority;
    const char* expected;
};

BOOST_AUTO_TEST_CASE(each_priority_has_its_prefix) {
    const PriorityCase cases[] = {
        {reaperd::Priority::err, "<3>error: m\n"},
        {reaperd::Priority::warning, "<4>warning: m\n"},
        {reaperd::Priority::notice, "<5>notice: m\n"},
        {reaperd::Priority::info, "<6>info: m\n"},
        {reaperd::Priority::debug, "<7>debug: m\n"},
    };
    for (const auto& c : cases) {
        auto out = captured_stderr([&] { reaperd::log(c.priority, "m"); });
        BOOST_TEST(out == c.expected);
    }
}

BOOST_AUTO_TEST_CASE(values_with_spaces_quotes_and_newlines_stay_on_one_line) {
    auto out = captured_stderr([] {
        reaperd::log(reaperd::Priority::warning, reaperd::message_id::reap_failed,
                     "reap failed:\nengine said no",
                     {{"ERROR", "409 \"conflict\""}, {"CONTAINER_NAME", ""}, {"X", "a=b"}});
    });
    BOOST_TEST(out ==
               "<4>warning: reap failed:\\nengine said no ERROR=\"409 \\\"conflict\\\"\" "
               "CONTAINER_NAME=\"\" X=\"a=b\" MESSAGE_ID=347221861dca45598661bf3fe804fa0e\n");
}

// A container's name and labels are the engine's, and any user of the engine may set them: on
// a terminal, reaperd's log shows them without letting them drive it.
BOOST_AUTO_TEST_CASE(values_that_would_drive_a_terminal_are_escaped) {
    auto out = captured_stderr([] {
        reaperd::log(reaperd::Priority::notice, {}, "container reaped",
                     {{"SESSION_ID", "csi\xc2\x9b" "2J\x1b[31mred\x7f"}, {"CONTAINER_NAME", "raw\xff caf\xc3\xa9"}});
    });
    BOOST_TEST(out == "<5>notice: container reaped SESSION_ID=csi\\xc2\\x9b2J\\x1b[31mred\\x7f "
                      "CONTAINER_NAME=\"raw\\xff caf\xc3\xa9\"\n");
}

BOOST_AUTO_TEST_CASE(message_ids_are_distinct_128_bit_hex) {
    namespace id = reaperd::message_id;
    const std::string_view ids[] = {id::container_reaped, id::reap_failed, id::log_capped,
                                    id::session_ended,    id::engine_lost, id::engine_back,
                                    id::would_reap};
    for (std::size_t i = 0; i < std::size(ids); ++i) {
        BOOST_TEST(ids[i].size() == 32u);
        BOOST_TEST(ids[i].find_first_not_of("0123456789abcdef") == std::string_view::npos);
        for (std::size_t j = i + 1; j < std::size(ids); ++j) BOOST_TEST(ids[i] != ids[j]);
    }
}
