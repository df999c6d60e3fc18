// Waiting, in tests, for what another thread or process does.
#pragma once

#include <chrono>
#include <thread>

namespace reaper::test {

// Polls `condition` every `poll` until it holds (true) or `limit` has passed (false). For
// state another thread or process changes with nothing to wait on (a peer's socket closing, a
// counter a worker bumps); never for a deadline of the code under test, which takes a clock
// the test moves instead. The poll is real time, and the only sleep such a wait has: 2 ms for
// in-process state, longer where each poll asks an engine or a daemon (daemon_fixture.hpp).
template <class Condition>
bool eventually(Condition condition, std::chrono::milliseconds limit = std::chrono::seconds(30),
                std::chrono::milliseconds poll = std::chrono::milliseconds(2)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!condition()) {
        if (std::chrono::steady_clock::now() > deadline) return false;
        std::this_thread::sleep_for(poll);
    }
    return true;
}

}  // namespace reaper::test
