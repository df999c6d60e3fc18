#include "state.hpp"

#include "read_all.hpp"

#include <Poco/JSON/Array.h>
#include <Poco/JSON/Object.h>
#include <Poco/JSON/Parser.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include <fcntl.h>
#include <unistd.h>

namespace reaperd {

namespace fs = std::filesystem;

namespace {

constexpr int state_version = 1;

std::int64_t to_unix_ms(TimePoint t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}
TimePoint from_unix_ms(std::int64_t ms) {
    return TimePoint{std::chrono::duration_cast<Clock::duration>(std::chrono::milliseconds{ms})};
}

[[noreturn]] void throw_errno(const std::string& what) {
    throw std::runtime_error(what + ": " + std::strerror(errno));
}

void write_all(int fd, const std::string& data, const std::string& path) {
    std::size_t done = 0;
    while (done < data.size()) {
        ssize_t n = ::write(fd, data.data() + done, data.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            throw_errno("cannot write " + path);
        }
        done += static_cast<std::size_t>(n);
    }
}

std::string required_string(const Poco::JSON::Object::Ptr& o, const std::string& key,
                            const std::string& where) {
    if (!o->has(key) || !o->get(key).isString())
        throw StateCorrupt(where + ": \"" + key + "\" must be a string");
    return o->getValue<std::string>(key);
}

std::optional<TimePoint> optional_time(const Poco::JSON::Object::Ptr& o, const std::string& key,
                                       const std::string& where) {
    if (!o->has(key) || o->isNull(key)) return std::nullopt;
    if (!o->get(key).isInteger())
        throw StateCorrupt(where + ": \"" + key + "\" must be an integer (unix ms)");
    const auto ms = o->getValue<std::int64_t>(key);
    // The clock counts nanoseconds in 64 bits: a hand-edited time beyond that would overflow.
    constexpr auto clock_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::duration::max()).count();
    if (ms > clock_ms || ms < -clock_ms)
        throw StateCorrupt(where + ": \"" + key + "\" is out of range");
    return from_unix_ms(ms);
}

}  // namespace

std::string encode_state(const PersistedState& state) {
    Poco::JSON::Object root;
    root.set("version", state_version);
    Poco::JSON::Array sessions;
    for (const auto& s : state.sessions) {
        Poco::JSON::Object o;
        o.set("id", s.id);
        o.set("held_lease", s.held_lease);
        if (s.grace_deadline) o.set("grace_deadline_ms", to_unix_ms(*s.grace_deadline));
        if (s.ended_at) o.set("ended_at_ms", to_unix_ms(*s.ended_at));
        if (!s.end_reason.empty()) o.set("end_reason", s.end_reason);
        sessions.add(o);
    }
    root.set("sessions", sessions);
    Poco::JSON::Array pending;
    for (const auto& p : state.pending) {
        Poco::JSON::Object o;
        o.set("container", p.container);
        o.set("name", p.name);
        o.set("session", p.session);
        o.set("reason", p.reason);
        o.set("failures", p.failures);
        pending.add(o);
    }
    root.set("pending_reaps", pending);
    std::ostringstream out;
    root.stringify(out, 1);
    out << '\n';
    return out.str();
}

PersistedState decode_state(const std::string& text) {
    Poco::JSON::Object::Ptr root;
    try {
        Poco::JSON::Parser parser;
        auto parsed = parser.parse(text);
        root = parsed.extract<Poco::JSON::Object::Ptr>();
    } catch (const Poco::Exception& e) {
        throw StateCorrupt("not a JSON object: " + e.displayText());
    } catch (const std::exception& e) {
        throw StateCorrupt(std::string("not a JSON object: ") + e.what());
    }
    if (!root) throw StateCorrupt("not a JSON object");
    try {
        if (!root->has("version") || !root->get("version").isInteger() ||
            root->getValue<int>("version") != state_version)
            throw StateCorrupt("\"version\" must be " + std::to_string(state_version));
        PersistedState state;
        auto sessions = root->getArray("sessions");
        auto pending = root->getArray("pending_reaps");
        if (!sessions || !pending)
            throw StateCorrupt("\"sessions\" and \"pending_reaps\" must be arrays");
        for (std::size_t i = 0; i < sessions->size(); ++i) {
            std::string where = "sessions[" + std::to_string(i) + "]";
            auto o = sessions->getObject(static_cast<unsigned>(i));
            if (!o) throw StateCorrupt(where + ": must be an object");
            PersistedSession s;
            s.id = required_string(o, "id", where);
            s.held_lease = o->has("held_lease") && o->get("held_lease").isBoolean() &&
                           o->getValue<bool>("held_lease");
            s.grace_deadline = optional_time(o, "grace_deadline_ms", where);
            s.ended_at = optional_time(o, "ended_at_ms", where);
            if (o->has("end_reason")) s.end_reason = required_string(o, "end_reason", where);
            state.sessions.push_back(std::move(s));
        }
        for (std::size_t i = 0; i < pending->size(); ++i) {
            std::string where = "pending_reaps[" + std::to_string(i) + "]";
            auto o = pending->getObject(static_cast<unsigned>(i));
            if (!o) throw StateCorrupt(where + ": must be an object");
            PendingReap p;
            p.container = required_string(o, "container", where);
            if (p.container.empty()) throw StateCorrupt(where + ": \"container\" is empty");
            p.name = required_string(o, "name", where);
            p.session = required_string(o, "session", where);
            p.reason = required_string(o, "reason", where);
            if (o->has("failures")) {
                if (!o->get("failures").isInteger())
                    throw StateCorrupt(where + ": \"failures\" must be an integer");
                p.failures = o->getValue<unsigned>("failures");
            }
            state.pending.push_back(std::move(p));
        }
        return state;
    } catch (const StateCorrupt&) {
        throw;
    } catch (const Poco::Exception& e) {
        throw StateCorrupt(e.displayText());
    } catch (const std::exception& e) {
        throw StateCorrupt(e.what());
    }
}

StateStore::StateStore(std::string dir) : dir_(std::move(dir)), path_(dir_ + "/state.json") {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) throw std::runtime_error("cannot create state.dir " + dir_ + ": " + ec.message());
}

PersistedState StateStore::load() const {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return {};
        throw_unreadable(errno);
    }
    std::string text;
    const int error = read_all(fd, text);
    ::close(fd);
    if (error != 0) throw_unreadable(error);
    try {
        return decode_state(text);
    } catch (const StateCorrupt& e) {
        throw StateCorrupt(path_ + ": " + e.what());
    }
}

void StateStore::throw_unreadable(int error) const {
    throw StateUnreadable(path_ + ": cannot be read: " + std::strerror(error));
}

std::string StateStore::set_aside(TimePoint now) const {
    time_t seconds = Clock::to_time_t(now);
    std::tm tm{};
    gmtime_r(&seconds, &tm);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
    std::string aside = path_ + ".corrupt-" + stamp;
    std::error_code ec;
    fs::rename(path_, aside, ec);
    if (ec) throw std::runtime_error("cannot move " + path_ + " to " + aside + ": " + ec.message());
    return aside;
}

void StateStore::save(const PersistedState& state) const {
    std::string text = encode_state(state);
    std::string temp = path_ + ".tmp";
    int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) throw_errno("cannot create " + temp);
    try {
        write_all(fd, text, temp);
        if (::fsync(fd) != 0) throw_errno("cannot fsync " + temp);
    } catch (...) {
        ::close(fd);
        ::unlink(temp.c_str());
        throw;
    }
    if (::close(fd) != 0) throw_errno("cannot close " + temp);
    if (::rename(temp.c_str(), path_.c_str()) != 0) {
        int saved = errno;
        ::unlink(temp.c_str());
        errno = saved;
        throw_errno("cannot rename " + temp + " to " + path_);
    }
    int dir_fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd < 0) throw_errno("cannot open " + dir_);
    int rc = ::fsync(dir_fd);
    int saved = errno;
    ::close(dir_fd);
    errno = saved;
    if (rc != 0) throw_errno("cannot fsync " + dir_);
}

}  // namespace reaperd
