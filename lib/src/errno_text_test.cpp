#include "errno_text.hpp"

#include <boost/test/unit_test.hpp>

#include <cerrno>

using reaper::detail::errno_text;

BOOST_AUTO_TEST_CASE(an_errno_value_reads_as_the_systems_text) {
    BOOST_TEST(errno_text(ENOENT) == "No such file or directory");
    BOOST_TEST(errno_text(EACCES) == "Permission denied");
}

BOOST_AUTO_TEST_CASE(zero_reads_as_unknown_error_not_success) {
    BOOST_TEST(errno_text(0) == "unknown error");
}

BOOST_AUTO_TEST_CASE(a_value_the_system_does_not_know_still_reads_as_text) {
    BOOST_TEST(errno_text(99999) == "Unknown error 99999");
}
