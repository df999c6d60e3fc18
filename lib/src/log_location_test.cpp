// The engine's on-disk log layout (log_location.hpp).
#include "log_location.hpp"

#include <boost/test/unit_test.hpp>

#include <string>

using namespace reaper;

BOOST_AUTO_TEST_CASE(log_files_by_driver) {
    std::string id(64, 'a');
    auto json = locate_log(id, "json-file", "/d/containers/" + id + "/" + id + "-json.log", "/d");
    BOOST_TEST_REQUIRE(json.has_value());
    BOOST_TEST(json->dir == "/d/containers/" + id);
    BOOST_TEST(json->live_name == id + "-json.log");
    auto unstarted = locate_log(id, "json-file", "", "/d");
    BOOST_TEST_REQUIRE(unstarted.has_value());
    BOOST_TEST(unstarted->dir == "/d/containers/" + id);
    auto local = locate_log(id, "local", "", "/d");
    BOOST_TEST_REQUIRE(local.has_value());
    BOOST_TEST(local->dir == "/d/containers/" + id + "/local-logs");
    BOOST_TEST(local->live_name == "container.log");
    for (const char* driver : {"journald", "syslog", "none", "fluentd", "gelf"})
        BOOST_TEST(!locate_log(id, driver, "", "/d").has_value(), driver);
    BOOST_TEST(!locate_log(id, "local", "", "").has_value());
    BOOST_TEST(!locate_log("../../etc", "local", "", "/d").has_value());
    BOOST_TEST(!locate_log(id, "json-file", "relative.log", "/d").has_value());
}

BOOST_AUTO_TEST_CASE(rotation_names) {
    BOOST_TEST(is_rotation("c-json.log.1", "c-json.log"));
    BOOST_TEST(is_rotation("c-json.log.12", "c-json.log"));
    BOOST_TEST(is_rotation("container.log.3.gz", "container.log"));
    BOOST_TEST(!is_rotation("c-json.log", "c-json.log"));
    BOOST_TEST(!is_rotation("c-json.log.", "c-json.log"));
    BOOST_TEST(!is_rotation("c-json.log.0", "c-json.log"));
    BOOST_TEST(!is_rotation("c-json.log.1.tmp", "c-json.log"));
    BOOST_TEST(!is_rotation("c-json.log.gz", "c-json.log"));
    BOOST_TEST(!is_rotation("config.v2.json", "c-json.log"));
}

BOOST_AUTO_TEST_CASE(the_data_root_from_a_json_file_log_path) {
    std::string id(64, 'b');
    BOOST_TEST(*data_root_of_json_log(id, "/var/lib/docker/containers/" + id + "/" + id + "-json.log") ==
               "/var/lib/docker");
    BOOST_TEST(!data_root_of_json_log(id, "/var/lib/docker/containers/" + id + "/other.log").has_value());
    BOOST_TEST(!data_root_of_json_log(id, "").has_value());
    BOOST_TEST(!data_root_of_json_log("", "/containers///-json.log").has_value());
}
