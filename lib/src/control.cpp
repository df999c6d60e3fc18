#include "reaper/control.hpp"
#include "reaper/units.hpp"  // invalid_utf8_at

#include "errno_text.hpp"
#include "signals_blocked.hpp"
#include "unique_fd.hpp"
#include "user_defaults.hpp"

#include <Poco/Dynamic/Var.h>
#include <Poco/Exception.h>
#include <Poco/JSON/Array.h>
#include <Poco/JSON/Object.h>
#include <Poco/JSON/ParseHandler.h>
#include <Poco/JSON/Parser.h>
#include <Poco/Net/SocketAddress.h>
#include <Poco/Net/StreamSocket.h>
#include <Poco/Net/StreamSocketImpl.h>
#include <Poco/Timespan.h>

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <sstream>
#include <system_error>
#include <thread>

namespace reaper::control {

namespace {

// Requests are flat objects; replies nest one level for "status", which the daemon fills
// freely, so it gets more room.
constexpr std::size_t request_max_depth = 2;
constexpr std::size_t reply_max_depth = 64;

std::string quoted(std::string_view text) {
    std::string out = "\"";
    for (char c : text.substr(0, 64)) {
        const auto u = static_cast<unsigned char>(c);
        if (u >= 0x20 && u < 0x7f && c != '"' && c != '\\') {
            out += c;
        } else {
            char hex[8];
            std::snprintf(hex, sizeof hex, "\\x%02x", u);
            out += hex;
        }
    }
    if (text.size() > 64) out += "...";
    return out + "\"";
}

void validate_token(std::string_view what, std::string_view value, std::size_t max_bytes) {
    if (value.empty()) throw ProtocolViolation(std::string(what) + " is empty");
    if (value.size() > max_bytes) {
        throw ProtocolViolation(std::string(what) + " is " + std::to_string(value.size()) +
                                " bytes long; the limit is " + std::to_string(max_bytes));
    }
    for (std::size_t i = 0; i < value.size(); ++i) {
        const auto c = static_cast<unsigned char>(value[i]);
        if (c <= 0x20 || c >= 0x7f) {
            throw ProtocolViolation(std::string(what) + " " + quoted(value) +
                                    " has a space, control or non-ASCII character at byte " +
                                    std::to_string(i) + "; only printable ASCII is allowed");
        }
    }
}

// Parses one line as a JSON object, with the checks every message gets.
Poco::JSON::Object::Ptr parse_object(std::string_view line, std::size_t max_bytes,
                                     std::size_t max_depth, const char* what) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.size() > max_bytes) {
        throw ProtocolViolation(std::string(what) + " is " + std::to_string(line.size()) +
                                " bytes long; the limit is " + std::to_string(max_bytes));
    }
    if (line.find_first_not_of(" \t") == std::string_view::npos) {
        throw ProtocolViolation(std::string("empty ") + what);
    }
    if (const auto at = invalid_utf8_at(line); at != std::string_view::npos) {
        throw ProtocolViolation(std::string(what) + " is not valid UTF-8 (byte " +
                                std::to_string(at) + ")");
    }
    if (line.find('\0') != std::string_view::npos) {
        throw ProtocolViolation(std::string(what) + " contains a NUL byte");
    }
    // Poco's parser cannot take a bare scalar at the top level; only objects are messages.
    if (line[line.find_first_not_of(" \t")] != '{') {
        throw ProtocolViolation(std::string(what) + " is not a JSON object");
    }
    Poco::Dynamic::Var parsed;
    try {
        // Keeping the key order lets the daemon's status read the way it was written.
        Poco::JSON::Parser parser(new Poco::JSON::ParseHandler(true));
        parser.setDepth(max_depth);
        parsed = parser.parse(std::string(line));
    } catch (const Poco::Exception& e) {
        throw ProtocolViolation(std::string(what) + " is not valid JSON: " + e.message());
    } catch (const std::exception& e) {
        throw ProtocolViolation(std::string(what) + " is not valid JSON: " + e.what());
    }
    if (parsed.type() != typeid(Poco::JSON::Object::Ptr)) {
        throw ProtocolViolation(std::string(what) + " is not a JSON object");
    }
    return parsed.extract<Poco::JSON::Object::Ptr>();
}

std::string string_field(const Poco::JSON::Object& object, const std::string& name) {
    const auto value = object.get(name);
    if (!value.isString()) {
        throw ProtocolViolation("field \"" + name + "\" must be a string");
    }
    return value.extract<std::string>();
}

bool bool_field(const Poco::JSON::Object& object, const std::string& name) {
    const auto value = object.get(name);
    if (!value.isBoolean()) throw ProtocolViolation("field \"" + name + "\" must be a boolean");
    return value.extract<bool>();
}

// Poco gives JSON numbers as Int64, UInt64 or double; a bool also says isInteger().
std::optional<std::uint64_t> as_count(const Poco::Dynamic::Var& value) {
    if (value.isEmpty() || value.isBoolean() || value.isString() || !value.isInteger()) return std::nullopt;
    if (value.isSigned()) {
        const auto n = value.convert<std::int64_t>();
        if (n < 0) return std::nullopt;
        return static_cast<std::uint64_t>(n);
    }
    return value.convert<std::uint64_t>();
}

std::uint64_t count_field(const Poco::JSON::Object& object, const std::string& name) {
    const auto count = as_count(object.get(name));
    if (!count) throw ProtocolViolation("field \"" + name + "\" must be a non-negative integer");
    return *count;
}

// {"<kind>": n, ...}
KindCounts kind_counts_field(const Poco::JSON::Object& object, const std::string& name) {
    const auto inner = object.getObject(name);
    if (!inner) throw ProtocolViolation("field \"" + name + "\" must be an object of counts");
    KindCounts counts;
    for (const auto& [kind, value] : *inner) {
        const auto count = as_count(value);
        if (!count) {
            throw ProtocolViolation("field \"" + name + "\": " + quoted(kind) +
                                    " must be a non-negative integer");
        }
        counts[kind] = *count;
    }
    return counts;
}

// The request fields this side knows. A field not named here is ignored (a newer client's);
// one named here that the op does not take is an error.
enum Field : unsigned {
    session_field = 1u << 0,
    container_field = 1u << 1,
    proxy_field = 1u << 2,
    counts_fields = 1u << 3,  // containers_labelled, networks_labelled, volumes_labelled
    ended_field = 1u << 4,
    limit_field = 1u << 5,
    pending_field = 1u << 6,
};

struct CountField {
    const char* name;
    std::uint64_t LabelledCounts::*member;
};
constexpr std::array<CountField, 3> count_fields{{
    {"containers_labelled", &LabelledCounts::containers},
    {"networks_labelled", &LabelledCounts::networks},
    {"volumes_labelled", &LabelledCounts::volumes},
}};

std::optional<Field> known_field(const std::string& name) {
    if (name == "session") return session_field;
    if (name == "container") return container_field;
    if (name == "proxy") return proxy_field;
    if (name == "ended") return ended_field;
    if (name == "limit") return limit_field;
    if (name == "pending") return pending_field;
    for (const auto& field : count_fields) {
        if (name == field.name) return counts_fields;
    }
    return std::nullopt;
}

struct OpSpec {
    Op op;
    const char* name;
    unsigned takes;  // Field bits
    unsigned needs;  // Field bits
};

constexpr std::array<OpSpec, 7> op_specs{{
    {Op::Lease, "lease", session_field | proxy_field | counts_fields, session_field},
    {Op::Update, "update", counts_fields, 0},
    {Op::End, "end", session_field, session_field},
    {Op::Orphan, "orphan", session_field | container_field, container_field},
    {Op::Session, "session", session_field, session_field},
    {Op::Status, "status", ended_field | limit_field | pending_field, 0},
    {Op::Metrics, "metrics", 0, 0},
}};

const OpSpec& spec_of(Op op) {
    for (const auto& spec : op_specs) {
        if (spec.op == op) return spec;
    }
    throw ProtocolViolation("unknown op " + std::to_string(static_cast<int>(op)));
}

std::string stringify(const Poco::JSON::Object& object) {
    std::ostringstream out;
    object.stringify(out);
    return out.str();
}

std::string one_line(std::string json) {
    json += '\n';
    return json;
}

// ---- client side -------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;

using detail::errno_text;

std::string poco_error_text(const Poco::Exception& e) {
    if (e.code() > 0 && e.code() < 4096) return errno_text(e.code());
    return e.displayText();
}

// A unix stream socket that is close-on-exec from its creation, so a fork+exec in another
// thread can never inherit (and keep alive) a lease.
class CloexecUnixSocket : public Poco::Net::StreamSocket {
public:
    CloexecUnixSocket() : StreamSocket(new Poco::Net::StreamSocketImpl(create())) {}

private:
    static poco_socket_t create() {
        const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) throw Poco::IOException("socket", errno);
        return fd;
    }
};

// A LeaseKeeper was stopped while its attempt waited for the daemon's reply.
struct AttemptCancelled {};

// How long a cancelled attempt still waits for a reply. The daemon records a lease before it
// writes the reply, so an owner stopping just then (reaperctl hold whose stdin closed) would
// otherwise never hear of a lease the daemon granted; a reply on its way takes microseconds,
// and a silent daemon costs stop() no more than this.
constexpr std::chrono::milliseconds cancel_grace{50};

class Connection {
public:
    Connection(const std::string& path, std::chrono::milliseconds timeout)
        : path_(path), deadline_(Clock::now() + timeout) {
        if (path.size() >= sizeof(sockaddr_un::sun_path)) {
            throw DaemonUnreachable("cannot reach reaperd at " + path + ": socket path is " +
                                    std::to_string(path.size()) + " bytes; the limit is " +
                                    std::to_string(sizeof(sockaddr_un::sun_path) - 1));
        }
        try {
            const Poco::Net::SocketAddress address(Poco::Net::SocketAddress::UNIX_LOCAL, path);
            socket_ = CloexecUnixSocket();
            socket_.connect(address, remaining());
        } catch (const Poco::Exception& e) {
            throw DaemonUnreachable("cannot reach reaperd at " + path + ": " + poco_error_text(e));
        }
    }

    void send(const std::string& data) {
        std::size_t sent = 0;
        try {
            while (sent < data.size()) {
                socket_.setSendTimeout(remaining());
                const int n = socket_.sendBytes(data.data() + sent,
                                                static_cast<int>(data.size() - sent), MSG_NOSIGNAL);
                if (n <= 0) throw DaemonUnreachable(failure("the connection closed while sending"));
                sent += static_cast<std::size_t>(n);
            }
        } catch (const Poco::TimeoutException&) {
            throw DaemonUnreachable(failure("timed out sending the request"));
        } catch (const Poco::Exception& e) {
            throw DaemonUnreachable(failure(poco_error_text(e)));
        }
    }

    // Reads exactly one reply line; the daemon sends nothing after it unprompted. Throws
    // AttemptCancelled when `cancel_fd` (when not -1) becomes readable and the reply is not
    // in within cancel_grace.
    std::string receive_line(int cancel_fd) {
        std::string line;
        std::array<char, 4096> buffer;
        try {
            for (;;) {
                wait_readable(cancel_fd);
                const int n = socket_.receiveBytes(buffer.data(), static_cast<int>(buffer.size()));
                if (n <= 0) {
                    throw DaemonUnreachable(failure(
                        line.empty() ? "the daemon closed the connection without a reply"
                                     : "the daemon closed the connection in the middle of a reply"));
                }
                const std::string_view chunk(buffer.data(), static_cast<std::size_t>(n));
                const auto end = chunk.find('\n');
                line.append(chunk.substr(0, end));
                if (line.size() > max_reply_bytes) {
                    throw ControlError(failure("reply longer than " +
                                               std::to_string(max_reply_bytes) + " bytes"));
                }
                if (end != std::string_view::npos) return line;
            }
        } catch (const Poco::Exception& e) {
            throw DaemonUnreachable(failure(poco_error_text(e)));
        }
    }

    // One request, one reply. A request line is far smaller than a socket buffer, so only
    // the wait for the reply can block, and only that wait watches `cancel_fd`.
    Reply exchange(const Request& request, int cancel_fd = -1) {
        std::string line;
        try {
            send(encode_request(request));
            line = receive_line(cancel_fd);
        } catch (const DaemonUnreachable&) {
            // A daemon that refuses a connection (too many connections) answers and closes
            // before the request is written; its reply says more than "broken pipe".
            std::string early;
            try {
                early = receive_line(cancel_fd);
            } catch (const ControlError&) {
                // Nothing readable either: the send failure is the better message.
            }
            if (early.empty()) throw;
            line = early;
        }
        Reply reply;
        try {
            reply = parse_reply(line);
        } catch (const ProtocolViolation& e) {
            throw ControlError(failure(std::string("garbled reply: ") + e.what()));
        }
        if (!reply.ok) {
            auto message = "reaperd refused " + std::string(to_string(request.op)) + ": " + reply.error;
            throw ErrorReply(message, std::move(reply));
        }
        return reply;
    }

    Poco::Net::StreamSocket socket() const { return socket_; }

private:
    // Waits until the socket is readable or the deadline passes (DaemonUnreachable). Once
    // `cancel_fd` becomes readable, the wait goes on for cancel_grace at most, then throws
    // AttemptCancelled. poll() skips a cancel_fd of -1.
    void wait_readable(int cancel_fd) {
        for (;;) {
            const auto left =
                std::chrono::ceil<std::chrono::milliseconds>(deadline_ - Clock::now()).count();
            if (left <= 0) {
                if (cancelled_) throw AttemptCancelled{};
                throw DaemonUnreachable(failure("timed out waiting for the reply"));
            }
            std::array<pollfd, 2> fds{{{socket_.impl()->sockfd(), POLLIN, 0},
                                       {cancelled_ ? -1 : cancel_fd, POLLIN, 0}}};
            const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(left));
            if (ready < 0 && errno != EINTR) throw DaemonUnreachable(failure("poll: " + errno_text(errno)));
            if (fds[0].revents != 0) return;
            if (fds[1].revents != 0) {
                cancelled_ = true;
                deadline_ = std::min(deadline_, Clock::now() + cancel_grace);
            }
        }
    }

    Poco::Timespan remaining() const {
        const auto left =
            std::chrono::duration_cast<std::chrono::microseconds>(deadline_ - Clock::now());
        if (left.count() <= 0) throw DaemonUnreachable(failure("timed out"));
        return Poco::Timespan(left.count());
    }

    std::string failure(const std::string& what) const {
        return "talking to reaperd at " + path_ + ": " + what;
    }

    std::string path_;
    Clock::time_point deadline_;
    bool cancelled_ = false;  // cancel_fd fired: only cancel_grace is left
    Poco::Net::StreamSocket socket_;
};

class SocketLease final : public Lease {
public:
    SocketLease(Poco::Net::StreamSocket socket, std::string path, Reply reply)
        : socket_(std::move(socket)), fd_(socket_.impl()->sockfd()), path_(std::move(path)),
          reply_(std::move(reply)) {}
    ~SocketLease() override { release(); }

    void release() noexcept override {
        std::lock_guard lock(mutex_);
        std::lock_guard looking(look_mutex_);  // no alive() is polling the descriptor
        if (released_) return;
        released_ = true;
        try {
            socket_.close();
        } catch (...) {
            // Closing can only fail on an already broken socket; the lease is gone either way.
        }
    }

    bool alive() const override {
        // Several threads may ask at once (a LeaseKeeper's and its owner's, both woken by the
        // daemon closing): each looks for itself. look_mutex_ is never held across a wait.
        std::lock_guard lock(look_mutex_);
        if (released_) return false;
        // An update in progress: the connection is in use, and the daemon's answer, not a
        // close, may be what is readable. Its outcome tells soon enough.
        if (updating_) return true;
        pollfd p{fd_, POLLIN, 0};
        const int ready = ::poll(&p, 1, 0);
        if (ready <= 0) return true;
        if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return false;
        char byte;
        const auto n = ::recv(p.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0) return false;
        if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
        // The daemon sends nothing on a lease connection unasked; bytes mean it wrote an
        // error reply before closing.
        return false;
    }

    int native_handle() const noexcept override { return released_ ? -1 : fd_; }

    // The daemon's answer to the lease request.
    const Reply& reply() const noexcept { return reply_; }

    void update(const LabelledCounts& labelled, std::chrono::milliseconds timeout) override {
        update(labelled, timeout, -1);
    }

    // As above; once `cancel_fd` (when not -1) becomes readable, cancel_grace is left for the
    // answer, then AttemptCancelled.
    void update(const LabelledCounts& labelled, std::chrono::milliseconds timeout, int cancel_fd) {
        std::lock_guard lock(mutex_);
        if (released_) throw std::logic_error("update on a released lease");
        Updating updating(*this);
        Request request;
        request.op = Op::Update;
        request.labelled = labelled;
        const auto line = encode_request(request);
        auto deadline = Clock::now() + timeout;
        bool cancelled = false;
        const auto wait_for = [&](short events) {
            for (;;) {
                const auto left =
                    std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
                if (left <= 0) {
                    if (cancelled) throw AttemptCancelled{};
                    throw DaemonUnreachable(failure("timed out waiting for the answer to an update"));
                }
                std::array<pollfd, 2> fds{{{fd_, events, 0}, {cancelled ? -1 : cancel_fd, POLLIN, 0}}};
                const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(left));
                if (ready < 0 && errno != EINTR) throw DaemonUnreachable(failure("poll: " + errno_text(errno)));
                if (fds[0].revents != 0) return;
                if (fds[1].revents != 0) {
                    cancelled = true;
                    deadline = std::min(deadline, Clock::now() + cancel_grace);
                }
            }
        };
        for (std::size_t sent = 0; sent < line.size();) {
            const auto n = ::send(fd_, line.data() + sent, line.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n >= 0) {
                sent += static_cast<std::size_t>(n);
            } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                wait_for(POLLOUT);
            } else if (errno != EINTR) {
                throw DaemonUnreachable(failure(errno_text(errno)));
            }
        }
        std::string answer;
        std::array<char, 512> buffer;
        for (;;) {
            wait_for(POLLIN);
            const auto n = ::recv(fd_, buffer.data(), buffer.size(), MSG_DONTWAIT);
            if (n == 0) throw DaemonUnreachable(failure("the daemon closed the lease"));
            if (n < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
                throw DaemonUnreachable(failure(errno_text(errno)));
            }
            const std::string_view chunk(buffer.data(), static_cast<std::size_t>(n));
            const auto end = chunk.find('\n');
            answer.append(chunk.substr(0, end));
            if (answer.size() > max_message_bytes) throw ControlError(failure("answer to an update too long"));
            if (end != std::string_view::npos) break;
        }
        Reply reply;
        try {
            reply = parse_reply(answer);
        } catch (const ProtocolViolation& e) {
            throw ControlError(failure(std::string("garbled reply: ") + e.what()));
        }
        if (!reply.ok) {
            auto message = "reaperd refused update: " + reply.error;
            throw ErrorReply(message, std::move(reply));
        }
    }

private:
    std::string failure(const std::string& what) const {
        return "talking to reaperd at " + path_ + ": " + what;
    }

    // Marks an update's exchange for alive(), from its first byte sent to its answer read.
    class Updating {
    public:
        explicit Updating(SocketLease& lease) : lease_(lease) { set(true); }
        ~Updating() { set(false); }
        Updating(const Updating&) = delete;
        Updating& operator=(const Updating&) = delete;

    private:
        void set(bool updating) {
            std::lock_guard lock(lease_.look_mutex_);
            lease_.updating_ = updating;
        }
        SocketLease& lease_;
    };

    std::mutex mutex_;               // held for an update's whole exchange, and by release()
    mutable std::mutex look_mutex_;  // held by alive() while it looks, and to change the two below
    bool updating_ = false;
    std::atomic<bool> released_{false};  // written under both mutexes
    Poco::Net::StreamSocket socket_;
    const int fd_;
    const std::string path_;
    const Reply reply_;
};

// Takes a lease (plain, or with a proxy and its counts) on one new connection; the wait for
// the reply ends early (AttemptCancelled) when `cancel_fd` becomes readable (after
// cancel_grace at most).
std::unique_ptr<SocketLease> take_lease(const std::string& path, std::chrono::milliseconds timeout,
                                        const Request& request, int cancel_fd) {
    encode_request(request);  // an invalid session id fails before connecting
    Connection connection(path, timeout);
    auto reply = connection.exchange(request, cancel_fd);
    return std::make_unique<SocketLease>(connection.socket(), path, std::move(reply));
}

Request lease_request(const std::string& session, bool proxy, const LabelledCounts& labelled) {
    Request request{Op::Lease, session, {}};
    request.proxy = proxy;
    if (proxy) request.labelled = labelled;
    return request;
}

using detail::AllSignalsBlocked;
using detail::UniqueFd;

}  // namespace

const char* to_string(Op op) {
    for (const auto& spec : op_specs) {
        if (spec.op == op) return spec.name;
    }
    return "unknown";
}

void validate_session_id(std::string_view session) {
    validate_token("session id", session, max_session_id_bytes);
}

void validate_container(std::string_view container) {
    validate_token("container", container, max_container_bytes);
}

Request parse_request(std::string_view line) {
    const auto object = parse_object(line, max_message_bytes, request_max_depth, "request");
    if (!object->has("op")) throw ProtocolViolation("request has no \"op\" field");
    const auto op_name = string_field(*object, "op");
    const OpSpec* spec = nullptr;
    for (const auto& candidate : op_specs) {
        if (op_name == candidate.name) spec = &candidate;
    }
    if (spec == nullptr) {
        throw ProtocolViolation("unknown op " + quoted(op_name) +
                                "; expected lease, update, end, orphan, session, status or metrics");
    }
    for (const auto& [name, value] : *object) {
        const auto field = known_field(name);
        if (field && (spec->takes & *field) == 0) {
            throw ProtocolViolation("unexpected field " + quoted(name) + " for op \"" +
                                    spec->name + "\"");
        }
    }
    const auto needs = [&](Field field, const char* name) {
        if ((spec->needs & field) != 0) {
            throw ProtocolViolation(std::string("op \"") + spec->name + "\" needs a \"" + name +
                                    "\" field");
        }
    };
    Request request;
    request.op = spec->op;
    if ((spec->takes & session_field) != 0 && object->has("session")) {
        request.session = string_field(*object, "session");
        validate_session_id(request.session);
    } else {
        needs(session_field, "session");
    }
    if ((spec->takes & container_field) != 0 && object->has("container")) {
        request.container = string_field(*object, "container");
        validate_container(request.container);
    } else {
        needs(container_field, "container");
    }
    if ((spec->takes & proxy_field) != 0 && object->has("proxy")) {
        request.proxy = bool_field(*object, "proxy");
    }
    if ((spec->takes & ended_field) != 0 && object->has("ended")) {
        request.ended = bool_field(*object, "ended");
    }
    if ((spec->takes & limit_field) != 0 && object->has("limit")) {
        request.limit = count_field(*object, "limit");
    }
    if ((spec->takes & pending_field) != 0 && object->has("pending")) {
        request.pending = bool_field(*object, "pending");
    }
    if (request.ended && request.pending) {
        throw ProtocolViolation("\"ended\" and \"pending\" exclude each other; ask for one at a time");
    }
    if ((spec->takes & counts_fields) != 0) {
        for (const auto& field : count_fields) {
            if (!object->has(field.name)) continue;
            request.labelled.*field.member = count_field(*object, field.name);
            if ((spec->takes & proxy_field) != 0 && !request.proxy) {
                throw ProtocolViolation(std::string("field \"") + field.name +
                                        "\" needs \"proxy\":true");
            }
        }
    }
    return request;
}

std::string encode_request(const Request& request) {
    const auto& spec = spec_of(request.op);
    Poco::JSON::Object object(Poco::JSON_PRESERVE_KEY_ORDER);
    object.set("op", std::string(spec.name));
    if ((spec.takes & container_field) != 0) {
        validate_container(request.container);
        object.set("container", request.container);
    } else if (!request.container.empty()) {
        throw ProtocolViolation(std::string("op \"") + spec.name + "\" takes no container");
    }
    if ((spec.needs & session_field) != 0 ||
        ((spec.takes & session_field) != 0 && !request.session.empty())) {
        validate_session_id(request.session);
        object.set("session", request.session);
    } else if (!request.session.empty()) {
        throw ProtocolViolation(std::string("op \"") + spec.name + "\" takes no session");
    }
    if ((spec.takes & proxy_field) != 0) {
        if (request.proxy) object.set("proxy", true);
    } else if (request.proxy) {
        throw ProtocolViolation(std::string("op \"") + spec.name + "\" takes no proxy");
    }
    if ((spec.takes & ended_field) != 0) {
        if (request.ended) object.set("ended", true);
    } else if (request.ended) {
        throw ProtocolViolation(std::string("op \"") + spec.name + "\" takes no \"ended\"");
    }
    if ((spec.takes & limit_field) != 0) {
        if (request.limit) object.set("limit", static_cast<Poco::UInt64>(*request.limit));
    } else if (request.limit) {
        throw ProtocolViolation(std::string("op \"") + spec.name + "\" takes no \"limit\"");
    }
    if ((spec.takes & pending_field) != 0) {
        if (request.ended && request.pending) {
            throw ProtocolViolation("\"ended\" and \"pending\" exclude each other; ask for one at a time");
        }
        if (request.pending) object.set("pending", true);
    } else if (request.pending) {
        throw ProtocolViolation(std::string("op \"") + spec.name + "\" takes no \"pending\"");
    }
    const bool counts = (spec.takes & counts_fields) != 0 &&
                        ((spec.takes & proxy_field) == 0 || request.proxy);
    if (counts) {
        for (const auto& field : count_fields) {
            object.set(field.name, static_cast<Poco::UInt64>(request.labelled.*field.member));
        }
    } else if (request.labelled != LabelledCounts{}) {
        throw ProtocolViolation(std::string("op \"") + spec.name +
                                "\" takes no counts" +
                                ((spec.takes & proxy_field) != 0 ? " without a proxy" : ""));
    }
    return one_line(stringify(object));
}

std::string encode_ok() { return "{\"ok\":true}\n"; }

std::string encode_error(std::string_view message) {
    Poco::JSON::Object object(Poco::JSON_PRESERVE_KEY_ORDER);
    object.set("ok", false);
    // Messages quote client input; keep the reply valid UTF-8 whatever came in.
    std::string text(message);
    if (invalid_utf8_at(text) != std::string::npos) text = quoted(text);
    object.set("error", text);
    return one_line(stringify(object));
}

std::string encode_reply(const Reply& reply) {
    Poco::JSON::Object object(Poco::JSON_PRESERVE_KEY_ORDER);
    object.set("ok", reply.ok);
    if (!reply.ok) {
        std::string text = reply.error;
        if (invalid_utf8_at(text) != std::string::npos) text = quoted(text);
        object.set("error", text);
    }
    const auto text = [&](const char* name, const std::string& value) {
        if (value.empty()) return;
        // Container names and states come from the engine; keep the reply valid UTF-8.
        object.set(name, invalid_utf8_at(value) == std::string::npos ? value : quoted(value));
    };
    const auto flag = [&](const char* name, const std::optional<bool>& value) {
        if (value) object.set(name, *value);
    };
    const auto counts = [&](const char* name, const std::optional<KindCounts>& value) {
        if (!value) return;
        Poco::JSON::Object inner(Poco::JSON_PRESERVE_KEY_ORDER);
        for (const auto& [kind, count] : *value) inner.set(kind, static_cast<Poco::UInt64>(count));
        object.set(name, inner);
    };
    text("container", reply.container);
    text("name", reply.name);
    text("session", reply.session);
    flag("owned", reply.owned);
    flag("queued", reply.queued);
    flag("known", reply.known);
    flag("already_ended", reply.already_ended);
    text("state", reply.state);
    flag("ready", reply.ready);
    flag("dry_run", reply.dry_run);
    counts("reaps_queued", reply.reaps_queued);
    counts("remaining", reply.remaining);
    if (reply.log_max_size) object.set("log_max_size", static_cast<Poco::UInt64>(*reply.log_max_size));
    flag("log_rotate_at_create", reply.log_rotate_at_create);
    return one_line(stringify(object));
}

std::string encode_status_reply(std::string_view status_json) {
    Poco::JSON::Object::Ptr status;
    try {
        status = parse_object(status_json, max_reply_bytes, reply_max_depth, "status");
    } catch (const ProtocolViolation& e) {
        throw ProtocolViolation(std::string("the daemon's status is unusable: ") + e.what());
    }
    Poco::JSON::Object object(Poco::JSON_PRESERVE_KEY_ORDER);
    object.set("ok", true);
    object.set("status", status);
    return one_line(stringify(object));
}

std::string encode_metrics_reply(std::string_view metrics_text) {
    Poco::JSON::Object object(Poco::JSON_PRESERVE_KEY_ORDER);
    object.set("ok", true);
    object.set("metrics", std::string(metrics_text));
    return one_line(stringify(object));
}

Reply parse_reply(std::string_view line) {
    const auto object = parse_object(line, max_reply_bytes, reply_max_depth, "reply");
    const auto ok = object->get("ok");
    if (!ok.isBoolean()) throw ProtocolViolation("reply has no boolean \"ok\" field");
    Reply reply;
    reply.ok = ok.extract<bool>();
    reply.json = stringify(*object);
    const auto reply_field = [](const ProtocolViolation& e) {
        return ProtocolViolation(std::string("reply ") + e.what());
    };
    try {
        if (!reply.ok) {
            reply.error = object->has("error") ? string_field(*object, "error")
                                               : std::string("(no error message)");
        }
        if (object->has("status")) {
            const auto status = object->getObject("status");
            if (!status) throw ProtocolViolation("field \"status\" must be an object");
            reply.status_json = stringify(*status);
        }
        if (object->has("metrics")) reply.metrics = string_field(*object, "metrics");
        for (auto [name, member] : {std::pair{"container", &Reply::container},
                                    std::pair{"name", &Reply::name},
                                    std::pair{"session", &Reply::session},
                                    std::pair{"state", &Reply::state}}) {
            if (object->has(name)) reply.*member = string_field(*object, name);
        }
        for (auto [name, member] : {std::pair{"owned", &Reply::owned},
                                    std::pair{"queued", &Reply::queued},
                                    std::pair{"known", &Reply::known},
                                    std::pair{"already_ended", &Reply::already_ended},
                                    std::pair{"ready", &Reply::ready},
                                    std::pair{"dry_run", &Reply::dry_run},
                                    std::pair{"log_rotate_at_create", &Reply::log_rotate_at_create}}) {
            if (object->has(name)) reply.*member = bool_field(*object, name);
        }
        if (object->has("reaps_queued")) reply.reaps_queued = kind_counts_field(*object, "reaps_queued");
        if (object->has("remaining")) reply.remaining = kind_counts_field(*object, "remaining");
        if (object->has("log_max_size")) reply.log_max_size = count_field(*object, "log_max_size");
    } catch (const ProtocolViolation& e) {
        throw reply_field(e);
    }
    return reply;
}

std::uint64_t Reply::remaining_total() const {
    std::uint64_t total = 0;
    if (remaining) {
        for (const auto& [kind, count] : *remaining) total += count;
    }
    return total;
}

bool Reply::nothing_remains() const {
    return ok && ready.value_or(false) && remaining && remaining_total() == 0;
}

ErrorReply::ErrorReply(const std::string& what)
    : ControlError(what), reply_(std::make_shared<const Reply>(Reply{.error = what})) {}

ErrorReply::ErrorReply(const std::string& what, Reply reply)
    : ControlError(what), reply_(std::make_shared<const Reply>(std::move(reply))) {}

std::string socket_path_from_environment() {
    return defaults::client_socket(::getuid(), defaults::process_environment, defaults::socket_exists);
}

ControlClient::ControlClient(std::string socket_path, std::chrono::milliseconds timeout)
    : socket_path_(std::move(socket_path)), timeout_(timeout) {}

std::unique_ptr<Lease> ControlClient::lease(const std::string& session) {
    return take_lease(socket_path_, timeout_, lease_request(session, false, {}), -1);
}

std::unique_ptr<Lease> ControlClient::proxy_lease(const std::string& session,
                                                  const LabelledCounts& labelled) {
    return take_lease(socket_path_, timeout_, lease_request(session, true, labelled), -1);
}

Reply ControlClient::end(const std::string& session) {
    Request request{Op::End, session, {}};
    encode_request(request);
    return Connection(socket_path_, timeout_).exchange(request);
}

Reply ControlClient::report_orphan(const std::string& container_id, const std::string& session) {
    Request request{Op::Orphan, session, container_id};
    encode_request(request);
    return Connection(socket_path_, timeout_).exchange(request);
}

Reply ControlClient::session(const std::string& session) {
    Request request{Op::Session, session, {}};
    encode_request(request);
    return Connection(socket_path_, timeout_).exchange(request);
}

std::string ControlClient::status_json(const StatusQuery& query) {
    Request request{Op::Status, {}, {}};
    request.ended = query.ended;
    request.limit = query.limit;
    request.pending = query.pending;
    const auto reply = Connection(socket_path_, timeout_).exchange(request);
    if (reply.status_json.empty()) {
        throw ControlError("talking to reaperd at " + socket_path_ + ": status reply has no \"status\"");
    }
    return reply.status_json;
}

std::string ControlClient::metrics_text() {
    return Connection(socket_path_, timeout_).exchange(Request{Op::Metrics, {}, {}}).metrics;
}

// ---- LeaseKeeper ----------------------------------------------------------------------------

const char* to_string(LeaseEvent event) {
    switch (event) {
        case LeaseEvent::Lost: return "lost";
        case LeaseEvent::Failing: return "failing";
        case LeaseEvent::Taken: return "taken";
    }
    return "unknown";
}

// The keeper's thread and what it shares with the owner. lease_ is written only under
// mutex_ (by start() before the thread exists, then by the thread, then by stop() after the
// join); the thread reads it without the lock since no one else writes it meanwhile. The
// counts reported are shared under counts_mutex_; what was sent is the thread's own.
class LeaseKeeper::Worker {
public:
    Worker(const ControlClient& client, const std::string& session, const LeaseKeeperOptions& options)
        : path_(client.socket_path()),
          timeout_(client.timeout()),
          session_(session),
          options_(options),
          wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
          counts_changed_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
          settle_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
        if (!wake_ || !counts_changed_ || !settle_) {
            throw std::system_error(errno, std::generic_category(), "eventfd");
        }
    }
    ~Worker() { stop(); }
    Worker(const Worker&) = delete;
    Worker& operator=(const Worker&) = delete;

    std::exception_ptr start() {
        if (started_) throw std::logic_error("the lease keeper for " + session_ + " was already started");
        started_ = true;
        std::exception_ptr failure;
        try {
            auto lease = take(-1);
            std::lock_guard lock(mutex_);
            last_reply_ = lease->reply();
            lease_ = std::move(lease);
        } catch (const ControlError&) {
            failure = std::current_exception();
        }
        AllSignalsBlocked blocked;
        // The caller has the first failure; further failures of that run are not news. The
        // first wait is timed from this attempt, not from whenever the thread gets going.
        const auto next_attempt = options_.clock() + options_.first_retry;
        thread_ = std::thread([this, failing = failure != nullptr, next_attempt] {
            run(failing, next_attempt);
        });
        return failure;
    }

    bool holds() const {
        std::lock_guard lock(mutex_);
        return lease_ && lease_->alive();
    }

    std::optional<Reply> lease_reply() const {
        std::lock_guard lock(mutex_);
        return last_reply_;
    }

    void report(const LabelledCounts& labelled) {
        if (!options_.proxy) return;
        {
            std::lock_guard lock(counts_mutex_);
            if (counts_ == labelled) return;
            counts_ = labelled;
        }
        ::eventfd_write(counts_changed_.get(), 1);
    }

    bool settle(std::chrono::milliseconds limit) {
        std::unique_lock lock(settle_mutex_);
        const auto target = ++settles_asked_;
        ::eventfd_write(settle_.get(), 1);
        return settled_cv_.wait_for(lock, limit, [&] { return settled_through_ >= target; });
    }

    void stop() noexcept {
        if (thread_.joinable()) {
            // The counter stays non-zero, so every later wait of the thread ends at once.
            ::eventfd_write(wake_.get(), 1);
            thread_.join();
        }
        std::lock_guard lock(mutex_);
        lease_.reset();
    }

private:
    using Clock = std::chrono::steady_clock;

    void run(bool failing, Clock::time_point next_attempt) noexcept {
        // A name to find the thread by in `top -H`, gdb and the tests (15 characters at most).
        pthread_setname_np(pthread_self(), "reaper-lease");
        auto retry = options_.first_retry;
        for (;;) {
            if (lease_) {
                if (!hold()) return;
                {
                    std::lock_guard lock(mutex_);
                    lease_.reset();
                }
                notify(LeaseEvent::Lost, nullptr);
                failing = false;
                plain_only_ = false;  // the daemon may have been upgraded meanwhile
                retry = options_.first_retry;
                next_attempt = options_.clock() + retry;
                continue;
            }
            if (!sleep_until(next_attempt)) return;
            try {
                auto lease = take(wake_.get());
                {
                    std::lock_guard lock(mutex_);
                    last_reply_ = lease->reply();
                    lease_ = std::move(lease);
                }
                notify(LeaseEvent::Taken, nullptr);
            } catch (const AttemptCancelled&) {
                return;
            } catch (...) {
                if (!failing) notify(LeaseEvent::Failing, std::current_exception());
                failing = true;
                retry = std::min(retry * 2, options_.max_retry);
                next_attempt = options_.clock() + retry;
            }
        }
    }

    LabelledCounts reported() const {
        std::lock_guard lock(counts_mutex_);
        return counts_;
    }

    bool sends_counts() const { return options_.proxy && !plain_only_; }

    // One attempt; a proxy's lease request carries the counts so far. A daemon older than
    // proxies refuses the field (and closes): a plain lease then, without counts.
    std::unique_ptr<SocketLease> take(int cancel_fd) {
        if (sends_counts()) {
            const auto counts = reported();
            try {
                auto lease = take_lease(path_, timeout_, lease_request(session_, true, counts), cancel_fd);
                sent_ = counts;
                last_sent_ = options_.clock();
                return lease;
            } catch (const ErrorReply& e) {
                if (e.reply().error.find("unexpected field \"proxy\"") == std::string::npos) throw;
                plain_only_ = true;
            }
        }
        return take_lease(path_, timeout_, lease_request(session_, false, {}), cancel_fd);
    }

    // Sends changed counts; false when that failed (the lease is gone or in doubt).
    bool send(const LabelledCounts& counts, std::chrono::milliseconds timeout) {
        try {
            lease_->update(counts, timeout, wake_.get());
            sent_ = counts;
            last_sent_ = options_.clock();
            return true;
        } catch (...) {
            // Refused (the daemon closed the lease), unreachable, timed out or cancelled.
            return false;
        }
    }

    // Holds the lease until its connection closes or an update fails (true), or stop() is
    // called (false, after sending counts that changed since the last update). Changed counts
    // go out at most once per update_interval.
    bool hold() {
        for (;;) {
            int timeout_ms = -1;
            if (sends_counts()) {
                const auto counts = reported();
                if (counts != sent_) {
                    const auto now = options_.clock();
                    const auto due = last_sent_ + options_.update_interval;
                    if (now >= due) {
                        if (!send(counts, timeout_)) return !stopping();
                        continue;
                    }
                    timeout_ms = static_cast<int>(
                        std::chrono::ceil<std::chrono::milliseconds>(due - now).count());
                }
            }
            std::array<pollfd, 4> fds{{{lease_->native_handle(), POLLIN, 0},
                                       {wake_.get(), POLLIN, 0},
                                       {counts_changed_.get(), POLLIN, 0},
                                       {settle_.get(), POLLIN, 0}}};
            settled();
            if (::poll(fds.data(), fds.size(), timeout_ms) < 0) continue;  // EINTR
            if (fds[1].revents != 0) {
                if (sends_counts() && reported() != sent_) send(reported(), cancel_grace);
                return false;
            }
            if (fds[2].revents != 0) {
                eventfd_t drained;
                ::eventfd_read(counts_changed_.get(), &drained);
            }
            if (fds[3].revents != 0) settle_asked();
            if (fds[0].revents != 0 && !lease_->alive()) return true;
        }
    }

    bool stopping() const {
        pollfd wake{wake_.get(), POLLIN, 0};
        return ::poll(&wake, 1, 0) > 0;
    }

    // Sleeps until `when` on options.clock (true) or until stop() is called (false).
    bool sleep_until(Clock::time_point when) {
        for (;;) {
            const auto left = std::chrono::ceil<std::chrono::milliseconds>(when - options_.clock()).count();
            std::array<pollfd, 2> fds{{{wake_.get(), POLLIN, 0}, {settle_.get(), POLLIN, 0}}};
            if (left > 0) settled();
            const int timeout_ms = static_cast<int>(std::max<long long>(0, left));
            if (::poll(fds.data(), fds.size(), timeout_ms) < 0) continue;  // EINTR
            if (fds[0].revents != 0) return false;
            if (fds[1].revents != 0) {
                settle_asked();
                continue;
            }
            if (options_.clock() >= when) return true;
        }
    }

    // A settle() woke the thread: what is due at the clock's time from now on answers it.
    void settle_asked() {
        eventfd_t drained;
        ::eventfd_read(settle_.get(), &drained);
        std::lock_guard lock(settle_mutex_);
        settles_answering_ = settles_asked_;
    }

    // About to wait: everything due is done, so the settle() calls seen so far return.
    void settled() {
        std::lock_guard lock(settle_mutex_);
        if (settled_through_ == settles_answering_) return;
        settled_through_ = settles_answering_;
        settled_cv_.notify_all();
    }

    void notify(LeaseEvent event, const std::exception_ptr& error) const noexcept {
        if (!options_.observer) return;
        try {
            options_.observer(event, error);
        } catch (...) {
            // A failing observer must not end the keeping of the lease.
        }
    }

    const std::string path_;
    const std::chrono::milliseconds timeout_;
    const std::string session_;
    const LeaseKeeperOptions options_;
    UniqueFd wake_;            // written once by stop(); the thread polls it in every wait
    UniqueFd counts_changed_;  // written by report() when the counts change
    UniqueFd settle_;          // written by settle()
    mutable std::mutex mutex_;
    std::unique_ptr<SocketLease> lease_;
    std::optional<Reply> last_reply_;  // of the last lease taken; under mutex_
    mutable std::mutex counts_mutex_;
    LabelledCounts counts_;  // the latest reported; guarded by counts_mutex_
    std::mutex settle_mutex_;  // guards the three settle counts
    std::condition_variable settled_cv_;
    std::uint64_t settles_asked_ = 0;      // settle() calls so far
    std::uint64_t settles_answering_ = 0;  // those the thread has seen
    std::uint64_t settled_through_ = 0;    // those answered
    // The thread's own (start() writes them before the thread exists):
    LabelledCounts sent_;    // what the daemon last acknowledged
    Clock::time_point last_sent_{};
    bool plain_only_ = false;  // the daemon refused "proxy": it is older than proxies
    bool started_ = false;     // the owner's
    std::thread thread_;
};

LeaseKeeper::LeaseKeeper(ControlClient client, std::string session, LeaseKeeperOptions options)
    : client_(std::move(client)), session_(std::move(session)), options_(std::move(options)) {
    validate_session_id(session_);
    worker_ = std::make_unique<Worker>(client_, session_, options_);
}

LeaseKeeper::~LeaseKeeper() { stop(); }

std::exception_ptr LeaseKeeper::start() { return worker_->start(); }

bool LeaseKeeper::holds() const { return worker_->holds(); }

void LeaseKeeper::report_labelled(const LabelledCounts& labelled) { worker_->report(labelled); }

void LeaseKeeper::stop() noexcept { worker_->stop(); }

bool LeaseKeeper::settle(std::chrono::milliseconds limit) { return worker_->settle(limit); }

std::optional<Reply> LeaseKeeper::lease_reply() const { return worker_->lease_reply(); }

}  // namespace reaper::control
