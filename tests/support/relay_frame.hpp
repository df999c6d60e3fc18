// The frame both engine proxies of the tests run in (tests/harness/engine_front.cpp and
// tests/chaos/fault_proxy.cpp): their flags, their stop signals, and an HTTP server on a unix
// socket that keeps connections as the engine's own server does.
#pragma once

#include <Poco/Net/HTTPRequestHandlerFactory.h>
#include <Poco/Net/HTTPServer.h>
#include <Poco/Net/HTTPServerParams.h>
#include <Poco/Net/ServerSocket.h>
#include <Poco/Net/SocketAddress.h>
#include <Poco/ThreadPool.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>

#include <pthread.h>
#include <sys/prctl.h>

namespace reaper::test::relay {

// argv's "--name value" pairs; nullopt when one of `required` is missing.
inline std::optional<std::map<std::string, std::string>> parse_flags(int argc, char** argv,
                                                                     std::initializer_list<const char*> required) {
    std::map<std::string, std::string> flags;
    for (int i = 1; i + 1 < argc; i += 2) flags[argv[i]] = argv[i + 1];
    for (const char* name : required)
        if (!flags.count(name)) return std::nullopt;
    return flags;
}

// Call first, before any thread starts. SIGPIPE is ignored (a client that left is an error to
// handle, not a signal that kills the proxy); SIGTERM and SIGINT are blocked in every thread,
// for wait_for_stop(); and the parent's death, even by SIGKILL (its clean-up cannot run then),
// sends SIGTERM.
inline sigset_t block_stop_signals() {
    std::signal(SIGPIPE, SIG_IGN);
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    return stop;
}

// Returns the signal that asked the proxy to stop.
inline int wait_for_stop(const sigset_t& stop) {
    int signal_number = 0;
    sigwait(&stop, &signal_number);
    return signal_number;
}

// Serves `factory` on a unix socket at `path` (a stale one replaced) from construction on.
// Idle connections are kept 300 s and without a request limit: the engine's own server keeps
// them without a limit, and reaperd's client keeps a few idle ones for reuse between resyncs.
class UnixHttpServer {
public:
    UnixHttpServer(const std::string& path, Poco::Net::HTTPRequestHandlerFactory::Ptr factory)
        : listener_(bound(path)), server_(factory, pool_, listener_, params()) {
        server_.start();
    }

private:
    static Poco::Net::ServerSocket bound(const std::string& path) {
        std::filesystem::remove(path);
        Poco::Net::ServerSocket listener;
        listener.bind(Poco::Net::SocketAddress(path));
        listener.listen(64);
        return listener;
    }
    static Poco::Net::HTTPServerParams::Ptr params() {
        Poco::Net::HTTPServerParams::Ptr params(new Poco::Net::HTTPServerParams);
        params->setKeepAlive(true);
        params->setMaxKeepAliveRequests(0);
        params->setKeepAliveTimeout(Poco::Timespan(300, 0));
        params->setTimeout(Poco::Timespan(300, 0));
        params->setMaxQueued(256);
        params->setMaxThreads(128);
        return params;
    }

    Poco::Net::ServerSocket listener_;
    Poco::ThreadPool pool_{2, 128};
    Poco::Net::HTTPServer server_;
};

// Removes the socket and ends the process at once: handlers may sit in relayed streams (an
// events stream, a blocked wait) that would hold a clean shutdown for as long as they last.
[[noreturn]] inline void end_now(const std::string& path) {
    std::filesystem::remove(path);
    std::fflush(nullptr);
    std::_Exit(0);
}

}  // namespace reaper::test::relay
