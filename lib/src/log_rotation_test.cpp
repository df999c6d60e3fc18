#include <reaper/log_rotation.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

using namespace reaper;

BOOST_AUTO_TEST_CASE(rotation_is_half_the_cap_in_plain_bytes_and_two_files) {
    BOOST_TEST((rotation_options(2 * 1024 * 1024) ==
                std::map<std::string, std::string>{{"max-size", "1048576"}, {"max-file", "2"}}));
    BOOST_TEST(rotation_options(default_log_cap_bytes).at("max-size") == "536870912");
    BOOST_TEST(rotation_options(3).at("max-size") == "1");
    BOOST_TEST(rotation_options(1).empty());
    BOOST_TEST(rotation_options(0).empty());
    // Read back as Docker reads max-size, it is exactly half.
    BOOST_TEST(engine_rotation_bound("json-file", rotation_options(2 * 1024 * 1024)).value() == 2u * 1024 * 1024);
}

BOOST_AUTO_TEST_CASE(which_drivers_rotate_and_what_counts_as_a_choice_of_ones_own) {
    BOOST_TEST(driver_rotates("json-file"));
    BOOST_TEST(driver_rotates("local"));
    for (const char* other : {"", "journald", "k8s-file", "none", "syslog", "JSON-FILE"}) BOOST_TEST(!driver_rotates(other));
    BOOST_TEST(sets_rotation({{"max-size", "1m"}}));
    BOOST_TEST(sets_rotation({{"max-file", "3"}}));
    BOOST_TEST(!sets_rotation({{"compress", "true"}, {"mode", "non-blocking"}}));
}

BOOST_AUTO_TEST_CASE(the_cap_is_the_label_as_reaperd_reads_it_else_the_default) {
    BOOST_TEST(log_cap_for({}, 1000) == 1000u);
    BOOST_TEST(log_cap_for({{log_max_size_label, "10m"}}, 1000) == 10'000'000u);  // decimal, as Docker
    BOOST_TEST(log_cap_for({{log_max_size_label, "0"}}, 1000) == 0u);            // exempt
    BOOST_TEST(log_cap_for({{log_max_size_label, "plenty"}}, 1000) == 1000u);    // reaperd warns, default
}

BOOST_AUTO_TEST_CASE(the_engines_own_bound_from_driver_and_options) {
    struct Row {
        std::string driver;
        std::map<std::string, std::string> options;
        std::optional<std::uint64_t> bound;
    };
    const std::vector<Row> rows{
        {"json-file", {}, std::nullopt},
        {"json-file", {{"max-size", "10m"}}, 10'000'000},
        {"json-file", {{"max-size", "1048576"}, {"max-file", "2"}}, 2 * 1048576},
        {"json-file", {{"max-file", "3"}}, std::nullopt},
        {"json-file", {{"max-size", "lots"}}, std::nullopt},
        {"json-file", {{"max-size", "1m"}, {"max-file", "x"}}, std::nullopt},
        {"local", {}, 5 * 20 * 1024 * 1024},
        {"local", {{"max-size", "1m"}}, 5'000'000},
        {"local", {{"max-size", "1m"}, {"max-file", "2"}}, 2'000'000},
        {"journald", {{"max-size", "1m"}}, std::nullopt},
    };
    for (const auto& row : rows) {
        BOOST_TEST_CONTEXT(row.driver << " " << row.options.size() << " options") {
            BOOST_TEST((engine_rotation_bound(row.driver, row.options) == row.bound));
        }
    }
}
