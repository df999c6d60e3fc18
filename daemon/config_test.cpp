#include "config.hpp"

#include <boost/test/unit_test.hpp>

using namespace reaperd;
using namespace std::chrono_literals;

BOOST_AUTO_TEST_CASE(empty_file_is_all_defaults) {
    BOOST_TEST((parse_config("", "empty.yaml") == Config{}));
}
