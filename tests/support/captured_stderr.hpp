// What code under test writes on stderr, for tests of the lines a person reads there.
#pragma once

#include <boost/test/unit_test.hpp>

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace reaper::test {

// Runs `emit` with fd 2 (and stdio's stderr, flushed around it) pointed at a temp file, and
// returns what it wrote. Not for tests whose threads write on stderr meanwhile.
template <typename F>
std::string captured_stderr(F emit) {
    char path[] = "/tmp/reaper-stderr-test.XXXXXX";
    const int file = mkstemp(path);
    BOOST_REQUIRE(file >= 0);
    std::fflush(stderr);
    const int saved = dup(STDERR_FILENO);
    dup2(file, STDERR_FILENO);
    emit();
    std::fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(file);
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    std::filesystem::remove(path);
    return text.str();
}

}  // namespace reaper::test
