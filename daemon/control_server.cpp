#include "control_server.hpp"

#include "errno_text.hpp"
#include "log.hpp"
#include "reaper/control.hpp"
#include "unique_fd.hpp"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <vector>

namespace reaperd {

namespace control = reaper::control;

namespace {

using Clock = std::chrono::steady_clock;

using reaper::detail::errno_text;
using reaper::detail::UniqueFd;

[[noreturn]] void fail(const std::string& path, const std::string& what, int code) {
    throw std::runtime_error("control socket " + path + ": " + what + ": " + errno_text(code));
}

sockaddr_un unix_address(const std::string& path) {
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    if (path.empty()) throw std::runtime_error("control.socket: the path is empty");
    if (path.size() >= sizeof address.sun_path) {
        throw std::runtime_error("control.socket: " + path + " is " + std::to_string(path.size()) +
                                 " bytes; a unix socket path holds at most " +
                                 std::to_string(sizeof address.sun_path - 1));
    }
    std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
    return address;
}

// A socket file left by a daemon that died can be removed; one that answers belongs to a
// live daemon, and anything else is not ours to delete.
void remove_stale_socket(const std::string& path, const sockaddr_un& address) {
    struct stat info {};
    if (::lstat(path.c_str(), &info) != 0) {
        if (errno == ENOENT) return;
        fail(path, "stat", errno);
    }
    if (!S_ISSOCK(info.st_mode)) {
        throw std::runtime_error("control socket " + path +
                                 ": the path exists and is not a socket; not removing it");
    }
    const UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!probe) fail(path, "socket", errno);
    const int rc = ::connect(probe.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address);
    const int code = errno;
    if (rc == 0) {
        throw std::runtime_error("control socket " + path +
                                 ": another process is listening on it (is reaperd already running?)");
    }
    if (code != ECONNREFUSED) fail(path, "probing the existing socket", code);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) fail(path, "removing the stale socket", errno);
}

gid_t resolve_group(const std::string& group) {
    std::vector<char> buffer(4096);
    for (;;) {
        struct group entry {};
        struct group* found = nullptr;
        const int rc = ::getgrnam_r(group.c_str(), &entry, buffer.data(), buffer.size(), &found);
        if (rc == ERANGE && buffer.size() < (1u << 20)) {
            buffer.resize(buffer.size() * 2);
            continue;
        }
        if (rc != 0) {
            throw std::runtime_error("control.group: looking up group \"" + group +
                                     "\": " + errno_text(rc));
        }
        if (found != nullptr) return found->gr_gid;
        break;
    }
    if (!group.empty() && std::all_of(group.begin(), group.end(), [](char c) {
            return c >= '0' && c <= '9';
        }) && group.size() < 10) {
        return static_cast<gid_t>(std::stoul(group));
    }
    throw ConfigValueError("control.group", "no such group \"" + group + "\"");
}

struct Connection {
    UniqueFd fd;
    std::uint64_t id = 0;
    std::string input;
    std::string output;
    std::size_t output_sent = 0;
    std::string lease_session;  // non-empty once this connection holds a lease
    bool proxy = false;         // that lease was taken with "proxy":true: it takes updates
    std::int64_t client = 0;    // ProxyReport::client
    bool closing = false;       // close once output is flushed; read nothing more
    bool waiting = false;       // an answer is being built on a desk; read nothing yet
    // Accepted, last complete request, or last answer queued: the idle deadline counts from
    // here (ControlServerLimits::idle_timeout). Partial lines and partial sends never move it.
    Clock::time_point last_progress;
    std::int64_t peer_pid = 0;   // SO_PEERCRED; 0 when the kernel does not say
    std::int64_t peer_uid = -1;  // SO_PEERCRED; -1 when the kernel does not say

    std::size_t unsent() const noexcept { return output.size() - output_sent; }
};

struct PeerCredentials {
    std::int64_t pid = 0;
    std::int64_t uid = -1;
};

// The process that connected `fd`, as the kernel recorded it at connect().
PeerCredentials peer_credentials(int fd) {
    ucred credentials{};
    socklen_t length = sizeof credentials;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) return {};
    return {credentials.pid, static_cast<std::int64_t>(credentials.uid)};
}

// REQUESTER_PID and REQUESTER_UID (when the kernel said), and the connection's id.
std::vector<LogField> requester_fields(const Connection& connection) {
    std::vector<LogField> fields;
    if (connection.peer_pid > 0) fields.push_back({"REQUESTER_PID", std::to_string(connection.peer_pid)});
    if (connection.peer_uid >= 0) fields.push_back({"REQUESTER_UID", std::to_string(connection.peer_uid)});
    fields.push_back({"CONNECTION_ID", std::to_string(connection.id)});
    return fields;
}

// Who asked for what that ends sessions, reaps or holds a lease: one journal line each.
void log_request(const Connection& connection, const control::Request& request) {
    auto fields = requester_fields(connection);
    std::string what = std::string("control: ") + control::to_string(request.op);
    if (!request.session.empty()) {
        what += " session " + request.session;
        fields.push_back({"SESSION_ID", request.session});
    }
    if (!request.container.empty()) {
        what += " container " + request.container;
        fields.push_back({"CONTAINER_REF", request.container});
    }
    what += " requested by pid " + (connection.peer_pid > 0 ? std::to_string(connection.peer_pid) : std::string("?")) +
            ", uid " + (connection.peer_uid >= 0 ? std::to_string(connection.peer_uid) : std::string("?"));
    log(Priority::info, {}, what, std::move(fields));
}

std::string describe_peer(const Connection& connection) {
    std::string text = "connection " + std::to_string(connection.id);
    text += connection.peer_pid > 0 ? " (pid " + std::to_string(connection.peer_pid) : " (pid unknown";
    text += connection.peer_uid >= 0 ? ", uid " + std::to_string(connection.peer_uid) + ")" : ", uid unknown)";
    return text;
}

}  // namespace

ControlServerLimits fit_to_descriptors(ControlServerLimits limits, std::uint64_t nofile_soft) {
    const std::uint64_t room = nofile_soft > reserved_descriptors + 1 ? nofile_soft - reserved_descriptors : 1;
    if (limits.max_connections > room) limits.max_connections = static_cast<std::size_t>(room);
    return limits;
}

void ControlHandler::proxy_reported(const std::string&, std::uint64_t, const ProxyReport&) {}

void ControlHandler::request_refused(const std::string&) {}

control::Reply ControlHandler::session_report(const std::string&) {
    throw Refused("this daemon does not answer session queries");
}

bool peer_admitted(std::int64_t peer_uid, std::int64_t daemon_uid, bool allow_root) noexcept {
    if (daemon_uid == 0) return true;
    return peer_uid == daemon_uid || (peer_uid == 0 && allow_root);
}

struct ControlServer::Impl {
    Impl(const ControlConfig& config, ControlHandler& handler, ControlServerLimits limits)
        : path(config.socket),
          allow_root(config.allow_root),
          handler(handler),
          limits(limits),
          max_connections_per_uid(limits.max_connections_per_uid),
          max_leases_per_uid(limits.max_leases_per_uid) {
        const auto address = unix_address(path);
        const auto parent = std::filesystem::path(path).parent_path();
        if (!parent.empty()) {
            std::error_code error;
            std::filesystem::create_directories(parent, error);
            if (error) {
                throw std::runtime_error("control socket " + path + ": creating " +
                                         parent.string() + ": " + error.message());
            }
        }
        remove_stale_socket(path, address);
        // Bound under a temporary name and renamed once listening: a client that waits for
        // the path to appear and then connects must never meet ECONNREFUSED (the file of a
        // plain bind() exists a moment before listen(); a test client met exactly that).
        const std::string binding = path + ".new";
        const auto binding_address = unix_address(binding);
        if (::unlink(binding.c_str()) != 0 && errno != ENOENT) fail(binding, "removing a stale one", errno);
        listener.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
        if (!listener) fail(path, "socket", errno);
        try {
            if (::bind(listener.get(), reinterpret_cast<const sockaddr*>(&binding_address), sizeof binding_address) !=
                0) {
                fail(binding, "bind", errno);
            }
            struct stat info {};
            if (::stat(binding.c_str(), &info) != 0) fail(binding, "stat after bind", errno);
            bound_device = info.st_dev;
            bound_inode = info.st_ino;
            if (::chmod(binding.c_str(), 0660) != 0) fail(binding, "chmod 0660", errno);
            if (!config.group.empty()) {
                const gid_t gid = resolve_group(config.group);
                if (::chown(binding.c_str(), static_cast<uid_t>(-1), gid) != 0) {
                    fail(binding, "chgrp " + config.group, errno);
                }
            }
            if (::listen(listener.get(), 512) != 0) fail(binding, "listen", errno);
            if (::rename(binding.c_str(), path.c_str()) != 0) fail(path, "renaming " + binding + " to it", errno);
            wake.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
            if (!wake) fail(path, "eventfd", errno);
            answers_ready.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
            if (!answers_ready) fail(path, "eventfd", errno);
        } catch (...) {
            struct stat info {};
            if (bound_inode != 0 && ::stat(binding.c_str(), &info) == 0 && info.st_dev == bound_device &&
                info.st_ino == bound_inode) {
                ::unlink(binding.c_str());
            }
            close_everything();
            throw;
        }
    }

    ~Impl() { stop(); }

    void start() {
        if (thread.joinable() || stopped) throw std::logic_error("ControlServer::start called twice");
        // Signals belong to the daemon's main thread; threads inherit this mask.
        sigset_t all;
        sigset_t previous;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &previous);
        thread = std::thread([this] { serve(); });
        answerer.thread = std::thread([this] { answer(answerer); });
        clerk.thread = std::thread([this] { answer(clerk); });
        resolver.thread = std::thread([this] { answer(resolver); });
        pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    }

    void stop() {
        if (stopped.exchange(true)) return;
        if (thread.joinable()) {
            const std::uint64_t one = 1;
            [[maybe_unused]] const auto n = ::write(wake.get(), &one, sizeof one);
            thread.join();
        }
        for (Desk* desk : {&answerer, &clerk, &resolver}) {
            if (!desk->thread.joinable()) continue;
            {
                std::lock_guard lock(questions_mutex);
                desk->questions.clear();
            }
            desk->cv.notify_all();
            desk->thread.join();
        }
        close_everything();
    }

    void close_everything() {
        connections.clear();
        by_uid.clear();
        connection_total = 0;
        if (listener) {
            listener.reset();
            struct stat info {};
            if (::stat(path.c_str(), &info) == 0 && info.st_dev == bound_device &&
                info.st_ino == bound_inode) {
                ::unlink(path.c_str());
            }
        }
        wake.reset();
        answers_ready.reset();
    }

    void serve() {
        std::vector<pollfd> fds;
        std::vector<int> closing_now;
        while (!stopped) {
            const auto now = Clock::now();
            fds.clear();
            fds.push_back({wake.get(), POLLIN, 0});
            fds.push_back({answers_ready.get(), POLLIN, 0});
            const bool accepting = now >= accept_paused_until;
            fds.push_back({accepting ? listener.get() : -1, POLLIN, 0});
            auto next_deadline = Clock::time_point::max();
            for (auto& [fd, connection] : connections) {
                short events = 0;
                if (reading(connection)) events |= POLLIN;
                if (connection.unsent() > 0) events |= POLLOUT;
                fds.push_back({fd, events, 0});
                if (times_out(connection)) {
                    next_deadline = std::min(next_deadline, connection.last_progress + limits.idle_timeout);
                }
            }
            if (!accepting) next_deadline = std::min(next_deadline, accept_paused_until);
            int timeout_ms = -1;
            if (next_deadline != Clock::time_point::max()) {
                const auto wait = std::chrono::ceil<std::chrono::milliseconds>(next_deadline - now);
                timeout_ms = static_cast<int>(std::clamp<long long>(wait.count(), 0, 60'000));
            }
            const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
            if (ready < 0) {
                if (errno == EINTR) continue;
                log(Priority::err, "control server: poll failed: " + errno_text(errno));
                std::this_thread::sleep_for(std::chrono::milliseconds{100});
                continue;
            }
            if (fds[0].revents != 0 || stopped) break;
            if (fds[1].revents & POLLIN) deliver_answers();
            if (fds[2].revents & POLLIN) accept_all();
            for (std::size_t i = 3; i < fds.size(); ++i) {
                if (fds[i].revents == 0) continue;
                const auto found = connections.find(fds[i].fd);
                if (found == connections.end()) continue;
                if (!service(found->first, found->second, fds[i].revents)) {
                    closing_now.push_back(found->first);
                }
            }
            const auto after = Clock::now();
            for (auto& [fd, connection] : connections) {
                const bool done = connection.closing && connection.unsent() == 0;
                const bool idle = times_out(connection) &&
                                  after - connection.last_progress >= limits.idle_timeout;
                if (connection.unsent() > limits.output_hard_bytes) {
                    log(Priority::warning,
                        "control server: closing " + describe_peer(connection) + ": " +
                            std::to_string(connection.unsent()) + " bytes of replies unsent, over the " +
                            std::to_string(limits.output_hard_bytes) + "-byte limit (the client does not read)");
                    closing_now.push_back(fd);
                } else if (done || idle) {
                    closing_now.push_back(fd);
                }
            }
            std::sort(closing_now.begin(), closing_now.end());
            closing_now.erase(std::unique(closing_now.begin(), closing_now.end()), closing_now.end());
            for (int fd : closing_now) close_connection(fd);
            closing_now.clear();
        }
    }

    void accept_all() {
        for (;;) {
            UniqueFd fd(::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
            if (!fd) {
                if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                    // The pending connection stays in the backlog; polling the listener now
                    // would spin, so wait a little for descriptors to come back.
                    log(Priority::warning, "control server: cannot accept a connection: " +
                                               errno_text(errno) + "; pausing for 100 ms");
                    accept_paused_until = Clock::now() + std::chrono::milliseconds{100};
                }
                return;  // EAGAIN (drained), ECONNABORTED, EINTR: poll again
            }
            if (connections.size() >= limits.max_connections) {
                handler.request_refused("connections");
                const auto reply = control::encode_error(
                    "too many connections (" + std::to_string(limits.max_connections) + ")");
                [[maybe_unused]] const auto n =
                    ::send(fd.get(), reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
                continue;
            }
            const auto peer = peer_credentials(fd.get());
            if (!peer_admitted(peer.uid, own_uid, allow_root)) {
                handler.request_refused("uid");
                log(Priority::warning, {},
                    "control server: refusing uid " + std::to_string(peer.uid) + ": this reaperd serves uid " +
                        std::to_string(own_uid) + " only (control.allow_root admits root)",
                    {{"REQUESTER_UID", std::to_string(peer.uid)}});
                const auto reply = control::encode_error("this reaperd serves uid " + std::to_string(own_uid) +
                                                         " only; uid " + std::to_string(peer.uid) + " is refused");
                [[maybe_unused]] const auto n =
                    ::send(fd.get(), reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
                continue;
            }
            const std::size_t per_uid = max_connections_per_uid.load();
            if (per_uid > 0 && peer.uid >= 0 && by_uid[peer.uid].connections >= per_uid) {
                auto& use = by_uid[peer.uid];
                handler.request_refused("connections_per_uid");
                const std::string problem = "too many connections from uid " + std::to_string(peer.uid) +
                                            " (" + std::to_string(per_uid) + ", control.max_connections_per_uid)";
                if (!use.connections_refusal_logged) {
                    use.connections_refusal_logged = true;
                    log(Priority::warning, {},
                        "control server: refusing connections: " + problem +
                            "; logged once until that uid holds fewer",
                        {{"REQUESTER_UID", std::to_string(peer.uid)}, {"LIMIT", std::to_string(per_uid)}});
                }
                const auto reply = control::encode_error(problem);
                [[maybe_unused]] const auto n =
                    ::send(fd.get(), reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
                continue;
            }
            if (peer.uid >= 0) ++by_uid[peer.uid].connections;
            Connection connection;
            const int key = fd.get();
            connection.fd = std::move(fd);
            connection.id = ++last_connection_id;
            connection.last_progress = Clock::now();
            connection.peer_pid = peer.pid;
            connection.peer_uid = peer.uid;
            connection.client = peer.pid > 0 ? peer.pid : -static_cast<std::int64_t>(connection.id);
            connections.emplace(key, std::move(connection));
            ++connection_total;
        }
    }

    // Reads, answers and writes what it can. False when the connection is finished now.
    // Whether to read (and answer) more from `connection` now: not while an answer is being
    // built, not once it is closing, and not while its unsent output is over the pause bound.
    bool reading(const Connection& connection) const noexcept {
        return !connection.closing && !connection.waiting &&
               connection.unsent() <= limits.output_pause_bytes;
    }

    // Whether the idle deadline applies: not to a lease (until it is closing), and not while
    // the daemon itself is composing the connection's answer.
    static bool times_out(const Connection& connection) noexcept {
        if (connection.closing) return true;
        return connection.lease_session.empty() && !connection.waiting;
    }

    bool service(int fd, Connection& connection, short revents) {
        if (revents & POLLNVAL) return false;
        if ((revents & (POLLIN | POLLHUP | POLLERR)) && reading(connection)) {
            if (!read_requests(fd, connection)) return false;
        } else if (revents & (POLLHUP | POLLERR)) {
            return false;  // gone while not read from: nothing more will be read or sent
        }
        if (connection.unsent() > 0 && !flush(fd, connection)) return false;
        // Lines already read while paused are answered once the client has read enough.
        if (reading(connection) && connection.input.find('\n') != std::string::npos) {
            handle_lines(connection);
            if (connection.unsent() > 0 && !flush(fd, connection)) return false;
        }
        return true;
    }

    bool read_requests(int fd, Connection& connection) {
        char buffer[16 * 1024];
        // Bounded per wake-up so one chatty client cannot starve the others.
        for (int round = 0; round < 8 && reading(connection); ++round) {
            const auto n = ::recv(fd, buffer, sizeof buffer, MSG_DONTWAIT);
            if (n == 0) return false;
            if (n < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return true;
                return false;
            }
            connection.input.append(buffer, static_cast<std::size_t>(n));
            handle_lines(connection);
        }
        return true;
    }

    void handle_lines(Connection& connection) {
        std::size_t start = 0;
        while (reading(connection)) {
            const auto end = connection.input.find('\n', start);
            if (end == std::string::npos) break;
            connection.last_progress = Clock::now();
            handle_request(connection, std::string_view(connection.input).substr(start, end - start));
            start = end + 1;
        }
        connection.input.erase(0, start);
        if (connection.closing) {
            connection.input.clear();
            return;
        }
        if (!reading(connection)) return;  // the rest is read after the answer, or the flush
        if (!connection.lease_session.empty() && !connection.proxy && !connection.input.empty()) {
            reject(connection, "lease connections take no further requests");
        } else if (connection.input.size() > control::max_message_bytes + 1) {
            reject(connection, "request exceeds " + std::to_string(control::max_message_bytes) +
                                   " bytes without a newline");
        }
    }

    void handle_request(Connection& connection, std::string_view line) {
        if (!connection.lease_session.empty() && !connection.proxy) {
            reject(connection, "lease connections take no further requests");
            return;
        }
        control::Request request;
        try {
            request = control::parse_request(line);
        } catch (const control::ProtocolViolation& e) {
            reject(connection, e.what());
            return;
        }
        if (!connection.lease_session.empty() && request.op != control::Op::Update) {
            reject(connection, "a proxy's lease connection takes no requests but \"update\"");
            return;
        }
        // Before the request is logged: a client refused in a loop must not flood the journal.
        if (request.op == control::Op::Lease && over_lease_limit(connection)) return;
        if (request.op == control::Op::Lease || request.op == control::Op::End ||
            request.op == control::Op::Orphan) {
            log_request(connection, request);
        }
        try {
            switch (request.op) {
            case control::Op::Lease:
                handler.lease_opened(request.session, connection.id);
                connection.lease_session = request.session;
                if (connection.peer_uid >= 0) ++by_uid[connection.peer_uid].leases;
                if (request.proxy) {
                    connection.proxy = true;
                    handler.proxy_reported(request.session, connection.id,
                                           {connection.client, request.labelled});
                }
                connection.output += lease_reply();
                break;
            case control::Op::Update:
                if (!connection.proxy) {
                    reject(connection, "op \"update\" belongs on the connection of a lease taken "
                                       "with \"proxy\":true");
                    return;
                }
                handler.proxy_reported(connection.lease_session, connection.id,
                                       {connection.client, request.labelled});
                connection.output += control::encode_ok();
                break;
            case control::Op::End:
            case control::Op::Session:
                ask(connection, std::move(request), clerk);
                break;
            case control::Op::Orphan:
                ask(connection, std::move(request), resolver);
                break;
            case control::Op::Status:
            case control::Op::Metrics:
                ask(connection, std::move(request), answerer);
                break;
            }
        } catch (const std::exception& e) {
            log(Priority::warning, std::string("control server: ") + control::to_string(request.op) +
                                       " failed: " + e.what());
            connection.output += control::encode_error(std::string(control::to_string(request.op)) +
                                                       " failed: " + e.what());
        }
    }

    std::string lease_reply() const {
        if (!terms_set) return control::encode_ok();
        control::Reply reply;
        reply.ok = true;
        reply.log_max_size = log_max_size_bytes.load();
        reply.log_rotate_at_create = log_rotate_at_create.load();
        return control::encode_reply(reply);
    }

    // Whether `connection`'s uid already holds max_leases_per_uid leases: if so, the lease it
    // asks for is refused with an error naming the limit and the connection closes. Logged
    // once per uid until it holds fewer leases again, so a client retrying in a loop cannot
    // flood the journal; every refusal is counted (ControlHandler::request_refused).
    bool over_lease_limit(Connection& connection) {
        const std::size_t limit = max_leases_per_uid.load();
        if (limit == 0 || connection.peer_uid < 0) return false;
        auto& use = by_uid[connection.peer_uid];
        if (use.leases < limit) return false;
        handler.request_refused("leases_per_uid");
        const std::string problem = "too many leases held by uid " + std::to_string(connection.peer_uid) + " (" +
                                    std::to_string(limit) + ", control.max_leases_per_uid)";
        if (!use.leases_refusal_logged) {
            use.leases_refusal_logged = true;
            auto fields = requester_fields(connection);
            fields.push_back({"LIMIT", std::to_string(limit)});
            log(Priority::warning, {},
                "control server: refusing leases: " + problem + "; logged once until that uid holds fewer",
                std::move(fields));
        }
        connection.output += control::encode_error(problem);
        connection.closing = true;
        return true;
    }

    // Status, metrics, ends and session queries wait for the daemon's main loop, which may be
    // busy for a while, and an orphan report for the engine's inspect: they are answered on
    // desks of their own (one thread each), so leases keep flowing meanwhile, an engine slow
    // to answer never delays a status or an end, and a status being composed never delays an
    // end.
    struct Desk;
    void ask(Connection& connection, control::Request request, Desk& desk) {
        connection.waiting = true;
        {
            std::lock_guard lock(questions_mutex);
            desk.questions.push_back({connection.fd.get(), connection.id, std::move(request), {}});
        }
        desk.cv.notify_one();
    }

    std::string reply_to(const control::Request& request) {
        const auto ok = [](control::Reply reply) {
            reply.ok = true;
            return control::encode_reply(reply);
        };
        switch (request.op) {
            case control::Op::Status:
                return control::encode_status_reply(handler.status_json({request.ended, request.limit, request.pending}));
            case control::Op::Metrics: return control::encode_metrics_reply(handler.metrics_text());
            case control::Op::Orphan: return ok(handler.orphan_reported(request.container, request.session));
            case control::Op::End: return ok(handler.end_session(request.session));
            case control::Op::Session: return ok(handler.session_report(request.session));
            case control::Op::Lease:
            case control::Op::Update: break;
        }
        throw std::logic_error("not a question for a desk");
    }

    void answer(Desk& desk) {
        for (;;) {
            Question question;
            {
                std::unique_lock lock(questions_mutex);
                desk.cv.wait(lock, [&] { return stopped || !desk.questions.empty(); });
                if (stopped) return;
                question = std::move(desk.questions.front());
                desk.questions.pop_front();
            }
            const auto op = question.request.op;
            try {
                question.reply = reply_to(question.request);
            } catch (const Refused& e) {
                auto reply = e.details();
                reply.ok = false;
                reply.error = e.what();
                question.reply = control::encode_reply(reply);
            } catch (const std::exception& e) {
                log(Priority::warning, std::string("control server: ") + control::to_string(op) +
                                           " failed: " + e.what());
                question.reply = control::encode_error(std::string(control::to_string(op)) +
                                                       " failed: " + e.what());
            }
            {
                std::lock_guard lock(questions_mutex);
                answers.push_back(std::move(question));
            }
            const std::uint64_t one = 1;
            [[maybe_unused]] const auto n = ::write(answers_ready.get(), &one, sizeof one);
        }
    }

    void deliver_answers() {
        std::uint64_t count = 0;
        [[maybe_unused]] const auto n = ::read(answers_ready.get(), &count, sizeof count);
        std::deque<Question> ready;
        {
            std::lock_guard lock(questions_mutex);
            ready.swap(answers);
        }
        for (auto& answered : ready) {
            const auto found = connections.find(answered.fd);
            // The asker may have gone, and its descriptor been reused, meanwhile.
            if (found == connections.end() || found->second.id != answered.connection_id) continue;
            auto& connection = found->second;
            connection.output += answered.reply;
            connection.waiting = false;
            connection.last_progress = Clock::now();
            handle_lines(connection);
        }
    }

    void reject(Connection& connection, const std::string& problem) {
        log(Priority::info, "control server: closing connection " + std::to_string(connection.id) +
                                ": " + problem);
        connection.output += control::encode_error(problem);
        connection.closing = true;
    }

    bool flush(int fd, Connection& connection) {
        while (connection.output_sent < connection.output.size()) {
            const auto n = ::send(fd, connection.output.data() + connection.output_sent,
                                  connection.output.size() - connection.output_sent,
                                  MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
                    compact(connection);
                    return true;
                }
                return false;
            }
            connection.output_sent += static_cast<std::size_t>(n);
        }
        connection.output.clear();
        connection.output_sent = 0;
        return true;
    }

    // Drops what has been sent, so a client that reads about as fast as it asks never has
    // the buffer hold everything ever sent to it.
    static void compact(Connection& connection) {
        if (connection.output_sent >= 64 * 1024 && connection.output_sent * 2 >= connection.output.size()) {
            connection.output.erase(0, connection.output_sent);
            connection.output_sent = 0;
        }
    }

    void close_connection(int fd) {
        const auto found = connections.find(fd);
        if (found == connections.end()) return;
        const auto session = std::move(found->second.lease_session);
        const auto id = found->second.id;
        if (const auto uid = found->second.peer_uid; uid >= 0) {
            const auto use = by_uid.find(uid);
            if (use != by_uid.end()) {
                if (!session.empty()) --use->second.leases;
                if (--use->second.connections == 0) {
                    by_uid.erase(use);
                } else {
                    // Below a limit again: the next refusal starts a new burst, and is logged.
                    if (use->second.leases < max_leases_per_uid.load()) use->second.leases_refusal_logged = false;
                    if (use->second.connections < max_connections_per_uid.load())
                        use->second.connections_refusal_logged = false;
                }
            }
        }
        connections.erase(found);  // closes fd
        --connection_total;
        if (!session.empty()) {
            try {
                handler.lease_closed(session, id);
            } catch (const std::exception& e) {
                log(Priority::err, "control server: lease_closed(" + session + ") failed: " + e.what());
            }
        }
    }

    std::string path;
    const bool allow_root;  // control.allow_root, for peer_admitted()
    ControlHandler& handler;
    ControlServerLimits limits;
    UniqueFd listener;
    UniqueFd wake;
    UniqueFd answers_ready;
    dev_t bound_device = 0;
    ino_t bound_inode = 0;
    std::thread thread;
    struct Question {
        int fd;
        std::uint64_t connection_id;
        control::Request request;
        std::string reply;
    };
    struct Desk {
        std::thread thread;
        std::condition_variable cv;
        std::deque<Question> questions;  // guarded by questions_mutex
    };
    std::mutex questions_mutex;
    Desk answerer;                 // status, metrics
    Desk clerk;                    // ends, session queries
    Desk resolver;                 // orphan reports
    std::deque<Question> answers;  // back to the server thread; guarded by questions_mutex
    std::atomic<bool> stopped{false};
    std::unordered_map<int, Connection> connections;  // only the server thread touches it
    // What each uid holds (SO_PEERCRED), while it holds a connection; likewise.
    struct UidUse {
        std::size_t connections = 0;
        std::size_t leases = 0;  // of those connections, the ones holding a lease
        bool connections_refusal_logged = false;  // a refusal was logged in this burst
        bool leases_refusal_logged = false;
    };
    std::unordered_map<std::int64_t, UidUse> by_uid;
    const std::int64_t own_uid = ::geteuid();
    // ControlServerLimits' per-uid limits; set_uid_limits() may change them from any thread.
    std::atomic<std::size_t> max_connections_per_uid;
    std::atomic<std::size_t> max_leases_per_uid;
    // set_lease_terms(): the lease reply's log fields, sent once terms_set.
    std::atomic<bool> terms_set{false};
    std::atomic<std::uint64_t> log_max_size_bytes{0};
    std::atomic<bool> log_rotate_at_create{false};
    std::atomic<std::size_t> connection_total{0};
    std::uint64_t last_connection_id = 0;
    Clock::time_point accept_paused_until{};
};

ControlServer::ControlServer(const ControlConfig& config, ControlHandler& handler,
                             ControlServerLimits limits)
    : impl_(std::make_unique<Impl>(config, handler, limits)) {}

ControlServer::~ControlServer() { stop(); }

void ControlServer::start() { impl_->start(); }

void ControlServer::stop() { impl_->stop(); }

void ControlServer::set_lease_terms(const LeaseTerms& terms) noexcept {
    impl_->log_max_size_bytes = terms.log_max_size_bytes;
    impl_->log_rotate_at_create = terms.log_rotate_at_create;
    impl_->terms_set = true;
}

void ControlServer::set_uid_limits(std::size_t max_connections_per_uid, std::size_t max_leases_per_uid) noexcept {
    impl_->max_connections_per_uid = max_connections_per_uid;
    impl_->max_leases_per_uid = max_leases_per_uid;
}

const std::string& ControlServer::socket_path() const noexcept { return impl_->path; }

std::size_t ControlServer::connection_count() const noexcept { return impl_->connection_total; }

}  // namespace reaperd
