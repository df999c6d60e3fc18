// A stand-in for reaperd's control socket in unit tests: it accepts connections on a unix
// socket (in a temp dir, or on a given path), answers every valid request {"ok":true} (parsed
// with the real protocol code), records the requests and when they came, and knows which
// leases are held (a lease lasts while its connection is open; a proxy's lease takes updates
// on it). Destroying it closes every connection, as a stopping reaperd does. With
// refuse_proxies(), it answers a lease with "proxy" as a daemon older than proxies did, and
// closes. With set_lease_reply(), a lease is answered with that reply (reaperd's log terms).
#pragma once

#include <reaper/control.hpp>

#include "unique_fd.hpp"

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

namespace reaper::test {

class FakeControlServer {
public:
    // Listens in a temp dir of its own.
    FakeControlServer() : FakeControlServer(make_temp_dir() + "/control.sock", true) {}
    // Listens on `socket_path` (a daemon restarting on the same path: destroy, construct again).
    explicit FakeControlServer(std::string socket_path) : FakeControlServer(std::move(socket_path), false) {}
    ~FakeControlServer() {
        stopping_ = true;
        acceptor_.join();
        for (auto& t : connections_) t.join();
        listener_.reset();
        ::unlink(path_.c_str());
        if (owns_dir_) std::filesystem::remove_all(std::filesystem::path(path_).parent_path());
    }

    const std::string& socket_path() const { return path_; }

    static std::string make_temp_dir() {
        char dir_template[] = "/tmp/fake-reaperd.XXXXXX";
        if (!::mkdtemp(dir_template)) throw std::runtime_error("mkdtemp failed");
        return dir_template;
    }

    std::vector<control::Request> requests() {
        std::lock_guard lock(mutex_);
        return requests_;
    }
    void refuse_proxies() { refuse_proxies_ = true; }
    // What a lease is answered from now on (ok is set): e.g. log_max_size.
    void set_lease_reply(control::Reply reply) {
        std::lock_guard lock(mutex_);
        reply.ok = true;
        lease_reply_ = control::encode_reply(reply);
    }
    // Leases whose connection is still open, by session.
    int leases_held(const std::string& session) {
        std::lock_guard lock(mutex_);
        auto it = live_leases_.find(session);
        return it == live_leases_.end() ? 0 : it->second;
    }
private:
    FakeControlServer(std::string socket_path, bool owns_dir) : path_(std::move(socket_path)), owns_dir_(owns_dir) {
        listener_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
        sockaddr_un address{};
        address.sun_family = AF_UNIX;
        path_.copy(address.sun_path, sizeof address.sun_path - 1);
        if (::bind(listener_.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 || ::listen(listener_.get(), 16) != 0)
            throw std::runtime_error("fake control server: cannot listen on " + path_);
        acceptor_ = std::thread([this] { accept_loop(); });
    }

    void accept_loop() {
        while (!stopping_) {
            pollfd p{listener_.get(), POLLIN, 0};
            if (::poll(&p, 1, 20) <= 0) continue;
            int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
            if (fd < 0) continue;
            connections_.emplace_back([this, fd] { serve(fd); });
        }
    }

    void serve(int fd) {
        const reaper::detail::UniqueFd connection(fd);
        std::string buffer;
        std::vector<std::string> leases;
        char chunk[4096];
        bool stopping_connection = false;
        while (!stopping_ && !stopping_connection) {
            pollfd p{fd, POLLIN, 0};
            if (::poll(&p, 1, 20) <= 0) continue;
            auto n = ::read(fd, chunk, sizeof chunk);
            if (n <= 0) break;
            buffer.append(chunk, static_cast<std::size_t>(n));
            std::size_t newline;
            while ((newline = buffer.find('\n')) != std::string::npos) {
                auto line = buffer.substr(0, newline);
                buffer.erase(0, newline + 1);
                std::string reply;
                bool close = false;
                try {
                    auto request = control::parse_request(line);
                    std::lock_guard lock(mutex_);
                    requests_.push_back(request);
                    if (request.op == control::Op::Lease && request.proxy && refuse_proxies_) {
                        reply = control::encode_error("unexpected field \"proxy\" for op \"lease\"");
                        close = true;
                    } else {
                        reply = control::encode_ok();
                        if (request.op == control::Op::Lease) {
                            ++live_leases_[request.session];
                            leases.push_back(request.session);
                            reply = lease_reply_;
                        }
                    }
                } catch (const std::exception& e) {
                    reply = control::encode_error(e.what());
                }
                [[maybe_unused]] auto written = ::write(fd, reply.data(), reply.size());
                if (close) {
                    buffer.clear();
                    stopping_connection = true;
                    break;
                }
            }
        }
        {
            std::lock_guard lock(mutex_);
            for (const auto& session : leases) --live_leases_[session];
        }
    }

    std::string path_;
    bool owns_dir_;
    reaper::detail::UniqueFd listener_;
    std::atomic<bool> stopping_{false};
    std::thread acceptor_;
    std::vector<std::thread> connections_;  // only touched by the acceptor and the destructor
    std::mutex mutex_;
    std::vector<control::Request> requests_;
    std::map<std::string, int> live_leases_;
    std::string lease_reply_ = control::encode_ok();
    std::atomic<bool> refuse_proxies_{false};
};

}  // namespace reaper::test
