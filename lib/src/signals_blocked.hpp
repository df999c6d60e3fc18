// Internal to libreaper (not installed): the library's own threads (a lease keeper, the
// engine proxy) must never take a signal meant for the application that links it.
#pragma once

#include <pthread.h>
#include <signal.h>

namespace reaper::detail {

// Blocks every signal on the calling thread while it lives: a thread started meanwhile
// inherits the full mask from its first instruction, with no window in which it could take
// a signal meant for the application.
class AllSignalsBlocked {
public:
    AllSignalsBlocked() {
        sigset_t all;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &previous_);
    }
    ~AllSignalsBlocked() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }
    AllSignalsBlocked(const AllSignalsBlocked&) = delete;
    AllSignalsBlocked& operator=(const AllSignalsBlocked&) = delete;

private:
    sigset_t previous_;
};

}  // namespace reaper::detail
