#include "reaperctl_format.hpp"

#include <boost/test/unit_test.hpp>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

BOOST_AUTO_TEST_CASE(status_renders_sections_tables_and_scalars) {
    const std::string status = R"({
        "sessions": [
            {"id": "build-42", "state": "leased", "leases": 2, "containers": 3},
            {"id": "t", "state": "ending", "grace_left_ms": 8000}
        ],
        "tracked_containers": 5,
        "pending_reaps": [],
        "counters": {"reaps_done": 10, "reaps_failed": 1},
        "dry_run": false,
        "labels": ["reaperd.session", "org.testcontainers.sessionId"]
    })";
    const auto text = reaperctl::format_status(status);
    const std::string expected =
        "sessions (2):\n"
        "  ID        STATE   LEASES  CONTAINERS  GRACE LEFT MS\n"
        "  build-42  leased  2       3           -\n"
        "  t         ending  -       -           8000\n"
        "tracked containers: 5\n"
        "pending reaps: none\n"
        "counters:\n"
        "  reaps done: 10\n"
        "  reaps failed: 1\n"
        "dry run: no\n"
        "labels: reaperd.session, org.testcontainers.sessionId\n";
    BOOST_TEST(text == expected);
}

BOOST_AUTO_TEST_CASE(status_tolerates_odd_shapes) {
    BOOST_TEST(reaperctl::format_status("{}") == "");
    BOOST_TEST(reaperctl::format_status(R"({"x":null,"y":{}})") == "x: -\ny: none\n");
    BOOST_TEST(reaperctl::format_status(R"({"rows":[{"a":{"b":1}},{"c":[1,2]}]})") ==
               "rows (2):\n  A        C\n  {\"b\":1}  -\n  -        [1,2]\n");
    BOOST_TEST(reaperctl::format_status(R"({"mixed":[1,{"a":2}]})") == "mixed: 1, {\"a\":2}\n");
    BOOST_CHECK_THROW(reaperctl::format_status("[1]"), std::invalid_argument);
    BOOST_CHECK_THROW(reaperctl::format_status("{"), std::invalid_argument);
}

namespace {

reaper::control::Reply parsed(const std::string& line) { return reaper::control::parse_reply(line); }

}  // namespace

BOOST_AUTO_TEST_CASE(counts_name_what_is_not_zero) {
    BOOST_TEST(reaperctl::format_counts({}) == "nothing");
    BOOST_TEST(reaperctl::format_counts({{"containers", 0}, {"networks", 0}}) == "nothing");
    BOOST_TEST(reaperctl::format_counts({{"containers", 1}, {"networks", 0}, {"volumes", 2}}) ==
               "1 container, 2 volumes");
    BOOST_TEST(reaperctl::format_counts({{"containers", 3}, {"networks", 1}}) == "3 containers, 1 network");
}

BOOST_AUTO_TEST_CASE(end_replies_say_what_happened) {
    const std::vector<std::pair<std::string, std::string>> cases{
        {R"({"ok":true})", "session s ended"},  // an older daemon
        {R"({"ok":true,"session":"s","known":true,"already_ended":false,"dry_run":false,)"
         R"("reaps_queued":{"containers":3,"networks":0,"volumes":0}})",
         "session s ended; 3 containers queued for reaping"},
        {R"({"ok":true,"session":"s","known":true,"already_ended":true,"dry_run":false,)"
         R"("reaps_queued":{"containers":1,"networks":1,"volumes":0}})",
         "session s had already ended; 1 container, 1 network queued for reaping"},
        {R"({"ok":true,"session":"s","known":true,"already_ended":false,"dry_run":false,)"
         R"("reaps_queued":{"containers":0,"networks":0,"volumes":0}})",
         "session s ended; nothing to reap"},
        {R"({"ok":true,"session":"s","known":false,"already_ended":false,"dry_run":false,)"
         R"("reaps_queued":{"containers":0}})",
         "session s ended (reaperd knew nothing of it; what is made under it later is reaped)"},
        {R"({"ok":true,"session":"s","known":true,"already_ended":false,"dry_run":true,)"
         R"("reaps_queued":{"containers":0}})",
         "session s ended; dry run: reaperd removes nothing"},
    };
    for (const auto& [line, expected] : cases) {
        BOOST_TEST_CONTEXT(line) { BOOST_TEST(reaperctl::format_end_reply("s", parsed(line)) == expected); }
    }
}

BOOST_AUTO_TEST_CASE(orphan_replies_name_the_full_id_and_the_outcome) {
    const std::string id(64, 'c');
    const std::vector<std::pair<std::string, std::string>> cases{
        {R"({"ok":true})", "orphan report for web accepted"},  // an older daemon
        {R"({"ok":true,"container":")" + id + R"(","name":"web","session":"s","owned":true,"queued":true,"dry_run":false})",
         "container web (" + id + ") of session s: queued for reaping"},
        {R"({"ok":true,"container":")" + id + R"(","name":"web","session":"s","owned":true,"queued":false,"dry_run":true})",
         "container web (" + id + ") of session s: dry run: would reap it"},
        {R"({"ok":true,"container":")" + id + R"(","queued":true,"dry_run":false})",
         "container " + id + ": queued for reaping (the engine did not answer; its label is checked before any removal)"},
    };
    for (const auto& [line, expected] : cases) {
        BOOST_TEST_CONTEXT(line) { BOOST_TEST(reaperctl::format_orphan_reply("web", parsed(line)) == expected); }
    }
}

BOOST_AUTO_TEST_CASE(status_shows_which_sessions_have_a_proxy_and_what_it_labelled) {
    const std::string status = R"({"sessions": [
        {"id": "ci-1", "state": "leased", "leases": 1, "containers": 2, "proxy": true,
         "containers_labelled": 2, "networks_labelled": 1, "volumes_labelled": 0},
        {"id": "plain", "state": "leased", "leases": 1, "containers": 0, "proxy": false}
    ]})";
    BOOST_TEST(reaperctl::format_status(status) ==
               "sessions (2):\n"
               "  ID     STATE   LEASES  CONTAINERS  PROXY  CONTAINERS LABELLED  NETWORKS LABELLED  VOLUMES LABELLED\n"
               "  ci-1   leased  1       2           yes    2                    1                  0\n"
               "  plain  leased  1       0           no     -                    -                  -\n");
}

BOOST_AUTO_TEST_CASE(status_values_are_terminal_safe_and_long_cells_are_cut) {
    const std::string long_id(5000, 'x');
    const std::string status = R"({"sessions": [
        {"id": "evil\n<3>err: forged \u001b[31mred", "state": "unclaimed"},
        {"id": "", "state": "unclaimed"},
        {"id": "sessiön", "state": "unclaimed"},
        {"id": ")" + long_id + R"(", "state": "unclaimed"}
    ], "last error": "\u001b]0;title\u0007"})";
    const std::string cut = std::string(77, 'x') + "...";
    const auto pad = [](std::size_t columns) { return std::string(columns, ' '); };
    BOOST_TEST(reaperctl::format_status(status) ==
               "sessions (4):\n"
               "  ID" + pad(78) + "  STATE\n"
               "  evil\\x0a<3>err: forged \\x1b[31mred" + pad(80 - 34) + "  unclaimed\n"
               "  \"\"" + pad(78) + "  unclaimed\n"
               "  sessiön" + pad(73) + "  unclaimed\n"
               "  " + cut + "  unclaimed\n"
               "  (1 cell cut at 80 characters; --json shows them whole)\n"
               "last error: \\x1b]0;title\\x07\n");
}

BOOST_AUTO_TEST_CASE(orphan_replies_are_terminal_safe) {
    const std::string id(64, 'c');
    const std::string line = R"({"ok":true,"container":")" + id +
                             R"(","name":"web","session":"s\n<3>err: \u001b[2J","owned":true,"queued":true,"dry_run":false})";
    BOOST_TEST(reaperctl::format_orphan_reply("web", parsed(line)) ==
               "container web (" + id + ") of session s\\x0a<3>err: \\x1b[2J: queued for reaping");
}
