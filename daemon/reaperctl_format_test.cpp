#include "reaperctl_format.hpp"

#include <boost/test/unit_test.hpp>

#include <stdexcept>
#include <string>

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
    const auto text = reaperd::format_status(status);
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
    BOOST_TEST(reaperd::format_status("{}") == "");
    BOOST_TEST(reaperd::format_status(R"({"x":null,"y":{}})") == "x: -\ny: none\n");
    BOOST_TEST(reaperd::format_status(R"({"rows":[{"a":{"b":1}},{"c":[1,2]}]})") ==
               "rows (2):\n  A        C\n  {\"b\":1}  -\n  -        [1,2]\n");
    BOOST_TEST(reaperd::format_status(R"({"mixed":[1,{"a":2}]})") == "mixed: 1, {\"a\":2}\n");
    BOOST_CHECK_THROW(reaperd::format_status("[1]"), std::invalid_argument);
    BOOST_CHECK_THROW(reaperd::format_status("{"), std::invalid_argument);
}
