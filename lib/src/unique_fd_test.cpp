#include "unique_fd.hpp"

#include <boost/test/unit_test.hpp>

#include <cerrno>
#include <utility>

#include <fcntl.h>
#include <unistd.h>

using reaper::detail::UniqueFd;

namespace {

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

// A fresh descriptor (the lowest free number, as POSIX gives them).
int open_null() {
    const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    BOOST_REQUIRE(fd >= 0);
    return fd;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_destructor_closes_the_descriptor) {
    const int fd = open_null();
    { UniqueFd owner(fd); }
    BOOST_TEST(!is_open(fd));
}

// The number of a closed descriptor is handed out again at once; a second close would close
// whatever got it.
BOOST_AUTO_TEST_CASE(a_descriptor_is_closed_once_even_when_its_number_is_reused) {
    const int fd = open_null();
    int reused = -1;
    {
        UniqueFd owner(fd);
        owner.reset();
        BOOST_TEST(!owner);
        reused = open_null();
        BOOST_REQUIRE_EQUAL(reused, fd);
    }
    BOOST_TEST(is_open(reused));
    ::close(reused);
}

BOOST_AUTO_TEST_CASE(a_move_hands_the_descriptor_over_and_leaves_the_source_empty) {
    const int fd = open_null();
    UniqueFd target;
    BOOST_TEST(!target);
    {
        UniqueFd source(fd);
        BOOST_TEST(static_cast<bool>(source));
        UniqueFd middle(std::move(source));
        BOOST_TEST(source.get() == -1);
        target = std::move(middle);
        BOOST_TEST(middle.get() == -1);
    }
    BOOST_TEST(target.get() == fd);
    BOOST_TEST(is_open(fd));
    target = UniqueFd();
    BOOST_TEST(!is_open(fd));
}

BOOST_AUTO_TEST_CASE(move_assignment_closes_what_the_target_owned) {
    const int first = open_null();
    const int second = open_null();
    UniqueFd target(first);
    target = UniqueFd(second);
    BOOST_TEST(!is_open(first));
    BOOST_TEST(target.get() == second);
}

BOOST_AUTO_TEST_CASE(self_move_assignment_keeps_the_descriptor) {
    const int fd = open_null();
    UniqueFd owner(fd);
    UniqueFd& alias = owner;
    owner = std::move(alias);
    BOOST_TEST(owner.get() == fd);
    BOOST_TEST(is_open(fd));
}

BOOST_AUTO_TEST_CASE(release_gives_the_descriptor_up_without_closing_it) {
    const int fd = open_null();
    {
        UniqueFd owner(fd);
        BOOST_TEST(owner.release() == fd);
        BOOST_TEST(!owner);
    }
    BOOST_TEST(is_open(fd));
    ::close(fd);
}

BOOST_AUTO_TEST_CASE(reset_closes_the_old_descriptor_and_owns_the_new_one) {
    const int first = open_null();
    const int second = open_null();
    UniqueFd owner(first);
    owner.reset(second);
    BOOST_TEST(!is_open(first));
    BOOST_TEST(owner.get() == second);
    BOOST_TEST(is_open(second));
}

// A caller closes on its way out of a failed call and then reports that call's errno.
BOOST_AUTO_TEST_CASE(closing_keeps_errno) {
    UniqueFd owner(open_null());
    errno = ENOSPC;
    owner.reset();
    BOOST_TEST(errno == ENOSPC);

    errno = EACCES;
    { UniqueFd dying(open_null()); }
    BOOST_TEST(errno == EACCES);

    // Even when close itself fails: a number that is not open gives EBADF, which is dropped.
    UniqueFd stale(open_null());
    ::close(stale.get());
    errno = EROFS;
    stale.reset();
    BOOST_TEST(errno == EROFS);
}

BOOST_AUTO_TEST_CASE(close_checked_reports_closes_failure) {
    UniqueFd none;
    BOOST_TEST(none.close_checked());

    const int fd = open_null();
    UniqueFd owner(fd);
    BOOST_TEST(owner.close_checked());
    BOOST_TEST(!owner);
    BOOST_TEST(!is_open(fd));

    UniqueFd stale(open_null());
    ::close(stale.get());
    errno = 0;
    BOOST_TEST(!stale.close_checked());
    BOOST_TEST(errno == EBADF);
    BOOST_TEST(!stale);
}
