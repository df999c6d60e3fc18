#include "state.hpp"

#include "read_all.hpp"

#include <Poco/JSON/Array.h>
#include <Poco/JSON/Object.h>
#include <Poco/JSON/Parser.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <optional>
#include <random>
#include <system_error>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace reaperd {

namespace fs = std::filesystem;

namespace {

constexpr int state_version = 1;
constexpr int journal_version = 1;
// Compact when the journal passes a quarter of the snapshot, and never below this. A journal
// line costs more to load than a snapshot entry (each is parsed on its own): at half, the
// 4.8 MB journal beside 100,000 tombstones took the load to 1.4 s (bench/tombstone_bench).
constexpr std::uint64_t min_journal_bytes = 64 * 1024;

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

void fsync_dir(const std::string& dir) {
    int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd < 0) throw_errno("cannot open " + dir);
    int rc = ::fsync(dir_fd);
    int saved = errno;
    ::close(dir_fd);
    errno = saved;
    if (rc != 0) throw_errno("cannot fsync " + dir);
}

// Writes `text` to `path`.tmp, fsyncs it and renames it over `path`. Returns the temp file's
// descriptor, still open for writing (O_APPEND), when `keep_open`; else -1.
int replace_file(const std::string& path, const std::string& text, bool keep_open) {
    std::string temp = path + ".tmp";
    int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) throw_errno("cannot create " + temp);
    try {
        write_all(fd, text, temp);
        if (::fsync(fd) != 0) throw_errno("cannot fsync " + temp);
    } catch (...) {
        ::close(fd);
        ::unlink(temp.c_str());
        throw;
    }
    if (!keep_open && ::close(fd) != 0) throw_errno("cannot close " + temp);
    if (::rename(temp.c_str(), path.c_str()) != 0) {
        int saved = errno;
        if (keep_open) ::close(fd);
        ::unlink(temp.c_str());
        errno = saved;
        throw_errno("cannot rename " + temp + " to " + path);
    }
    return keep_open ? fd : -1;
}

// ---- encoding: by hand, one line per entry (Poco's DOM took most of a save's time) ----

void append_json_string(std::string& out, const std::string& s) {
    out += '"';
    for (char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (static_cast<unsigned char>(c) < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
                    out += buf;
                } else {
                    out += c;
                }
        }
    }
    out += '"';
}

void append_session(std::string& out, const PersistedSession& s) {
    out += "{\"id\":";
    append_json_string(out, s.id);
    out += s.held_lease ? ",\"held_lease\":true" : ",\"held_lease\":false";
    if (s.grace_deadline) out += ",\"grace_deadline_ms\":" + std::to_string(to_unix_ms(*s.grace_deadline));
    if (s.ended_at) out += ",\"ended_at_ms\":" + std::to_string(to_unix_ms(*s.ended_at));
    if (!s.end_reason.empty()) {
        out += ",\"end_reason\":";
        append_json_string(out, s.end_reason);
    }
    out += '}';
}

void append_pending(std::string& out, const PendingReap& p) {
    out += "{\"container\":";
    append_json_string(out, p.container);
    out += ",\"name\":";
    append_json_string(out, p.name);
    out += ",\"session\":";
    append_json_string(out, p.session);
    out += ",\"reason\":";
    append_json_string(out, p.reason);
    out += ",\"failures\":" + std::to_string(p.failures) + "}";
}

std::string encode_snapshot(const PersistedState& state, std::uint64_t generation) {
    std::string out;
    out.reserve(64 + state.sessions.size() * 110 + state.pending.size() * 160);
    out += "{\"version\":" + std::to_string(state_version);
    if (generation != 0) out += ",\"generation\":" + std::to_string(generation);
    out += ",\n\"sessions\":[";
    for (std::size_t i = 0; i < state.sessions.size(); ++i) {
        out += i ? ",\n" : "\n";
        append_session(out, state.sessions[i]);
    }
    out += "],\n\"pending_reaps\":[";
    for (std::size_t i = 0; i < state.pending.size(); ++i) {
        out += i ? ",\n" : "\n";
        append_pending(out, state.pending[i]);
    }
    out += "]}\n";
    return out;
}

bool same_saved(const PendingReap& a, const PendingReap& b) {
    return a.container == b.container && a.name == b.name && a.session == b.session &&
           a.reason == b.reason && a.failures == b.failures;
}

// ---- decoding ----

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

Poco::JSON::Object::Ptr parse_object(const std::string& text) {
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
    return root;
}

// Runs `f`, turning Poco's and the standard library's exceptions into StateCorrupt.
template <typename F>
auto corrupt_on_error(F&& f) {
    try {
        return f();
    } catch (const StateCorrupt&) {
        throw;
    } catch (const Poco::Exception& e) {
        throw StateCorrupt(e.displayText());
    } catch (const std::exception& e) {
        throw StateCorrupt(e.what());
    }
}

PersistedSession decode_session(const Poco::JSON::Object::Ptr& o, const std::string& where) {
    if (!o) throw StateCorrupt(where + ": must be an object");
    PersistedSession s;
    s.id = required_string(o, "id", where);
    s.held_lease = o->has("held_lease") && o->get("held_lease").isBoolean() &&
                   o->getValue<bool>("held_lease");
    s.grace_deadline = optional_time(o, "grace_deadline_ms", where);
    s.ended_at = optional_time(o, "ended_at_ms", where);
    if (o->has("end_reason")) s.end_reason = required_string(o, "end_reason", where);
    return s;
}

PendingReap decode_pending(const Poco::JSON::Object::Ptr& o, const std::string& where) {
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
    return p;
}

std::uint64_t optional_generation(const Poco::JSON::Object::Ptr& o, const std::string& where) {
    if (!o->has("generation")) return 0;
    if (!o->get("generation").isInteger() || o->getValue<std::int64_t>("generation") <= 0)
        throw StateCorrupt(where + "\"generation\" must be a positive integer");
    return static_cast<std::uint64_t>(o->getValue<std::int64_t>("generation"));
}

struct Snapshot {
    PersistedState state;
    std::uint64_t generation = 0;  // 0: written by a version without a journal
};

Snapshot decode_snapshot(const std::string& text) {
    Poco::JSON::Object::Ptr root = parse_object(text);
    return corrupt_on_error([&] {
        if (!root->has("version") || !root->get("version").isInteger() ||
            root->getValue<int>("version") != state_version)
            throw StateCorrupt("\"version\" must be " + std::to_string(state_version));
        Snapshot snapshot;
        snapshot.generation = optional_generation(root, "");
        auto sessions = root->getArray("sessions");
        auto pending = root->getArray("pending_reaps");
        if (!sessions || !pending)
            throw StateCorrupt("\"sessions\" and \"pending_reaps\" must be arrays");
        snapshot.state.sessions.reserve(sessions->size());
        for (std::size_t i = 0; i < sessions->size(); ++i)
            snapshot.state.sessions.push_back(decode_session(
                sessions->getObject(static_cast<unsigned>(i)), "sessions[" + std::to_string(i) + "]"));
        for (std::size_t i = 0; i < pending->size(); ++i)
            snapshot.state.pending.push_back(decode_pending(
                pending->getObject(static_cast<unsigned>(i)), "pending_reaps[" + std::to_string(i) + "]"));
        return snapshot;
    });
}

std::string journal_header(std::uint64_t generation) {
    return "{\"journal\":" + std::to_string(journal_version) +
           ",\"generation\":" + std::to_string(generation) + "}\n";
}

std::uint64_t new_generation() {
    // Random rather than counted: load() is read-only, so a store does not know the last one;
    // a stale journal must only never match. 52 bits stay exact in any JSON reader.
    std::random_device random;
    std::uint64_t g = (std::uint64_t{random()} << 32 | random()) & ((std::uint64_t{1} << 52) - 1);
    return g == 0 ? 1 : g;
}

// One change of a journal, applied to the state being rebuilt.
struct Replay {
    std::map<std::string, PersistedSession> sessions;
    std::map<std::string, PendingReap> pending;

    void apply(const Poco::JSON::Object::Ptr& o, const std::string& where) {
        if (o->has("session")) {
            PersistedSession s = decode_session(o->getObject("session"), where + " \"session\"");
            std::string id = s.id;
            sessions[id] = std::move(s);
        } else if (o->has("forget")) {
            sessions.erase(required_string(o, "forget", where));
        } else if (o->has("pending")) {
            PendingReap p = decode_pending(o->getObject("pending"), where + " \"pending\"");
            std::string id = p.container;
            pending[id] = std::move(p);
        } else if (o->has("done")) {
            pending.erase(required_string(o, "done", where));
        } else {
            throw StateCorrupt(where + ": not a journal record");
        }
    }
};

}  // namespace

std::string encode_state(const PersistedState& state) { return encode_snapshot(state, 0); }

PersistedState decode_state(const std::string& text) { return decode_snapshot(text).state; }

StateStore::StateStore(std::string dir)
    : dir_(std::move(dir)), path_(dir_ + "/state.json"), journal_path_(dir_ + "/state.journal") {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) throw std::runtime_error("cannot create state.dir " + dir_ + ": " + ec.message());
}

StateStore::~StateStore() { close_journal(); }

void StateStore::close_journal() noexcept {
    if (journal_fd_ >= 0) ::close(journal_fd_);
    journal_fd_ = -1;
}

PersistedState StateStore::load() const {
    // Reads a whole file; nullopt if it does not exist.
    auto read = [this](const std::string& path) -> std::optional<std::string> {
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            if (errno == ENOENT) return std::nullopt;
            throw_unreadable(path, errno);
        }
        std::string text;
        const int error = read_all(fd, text);
        ::close(fd);
        if (error != 0) throw_unreadable(path, error);
        return text;
    };
    std::optional<std::string> snapshot_text = read(path_);
    std::optional<std::string> journal = read(journal_path_);
    Snapshot snapshot;
    if (snapshot_text) {
        try {
            snapshot = decode_snapshot(*snapshot_text);
        } catch (const StateCorrupt& e) {
            throw StateCorrupt(path_ + ": " + e.what());
        }
    }
    if (!journal) return std::move(snapshot.state);

    // The header: written with the journal's first rename, so whole or absent.
    const std::size_t header_end = journal->find('\n');
    std::uint64_t generation = 0;
    try {
        if (header_end == std::string::npos) throw StateCorrupt("no header line");
        auto header = parse_object(journal->substr(0, header_end));
        generation = corrupt_on_error([&] {
            if (!header->has("journal") || !header->get("journal").isInteger() ||
                header->getValue<int>("journal") != journal_version)
                throw StateCorrupt("line 1: \"journal\" must be " + std::to_string(journal_version));
            return optional_generation(header, "line 1: ");
        });
        if (generation == 0) throw StateCorrupt("line 1: no \"generation\"");
    } catch (const StateCorrupt& e) {
        throw StateCorrupt(journal_path_ + ": " + e.what());
    }
    if (!snapshot_text || generation != snapshot.generation) {
        snapshot.state.warnings.push_back(
            journal_path_ + ": written after another snapshot than " + path_ +
            " (a compaction was cut short); its changes are in the snapshot; ignored");
        return std::move(snapshot.state);
    }

    if (header_end + 1 == journal->size()) return std::move(snapshot.state);  // no changes yet

    Replay replay;
    for (auto& s : snapshot.state.sessions) {
        std::string id = s.id;
        replay.sessions.emplace(std::move(id), std::move(s));
    }
    for (auto& p : snapshot.state.pending) {
        std::string id = p.container;
        replay.pending.emplace(std::move(id), std::move(p));
    }
    PersistedState state;
    std::size_t line = 1;
    for (std::size_t pos = header_end + 1; pos < journal->size(); ++line) {
        const std::size_t end = journal->find('\n', pos);
        const bool last = end == std::string::npos || end + 1 == journal->size();
        const std::string where = "line " + std::to_string(line + 1);
        std::string text = journal->substr(pos, end == std::string::npos ? std::string::npos : end - pos);
        pos = end == std::string::npos ? journal->size() : end + 1;
        try {
            if (end == std::string::npos) throw StateCorrupt("no end of line");
            auto record = parse_object(text);
            corrupt_on_error([&] { replay.apply(record, where); });
        } catch (const StateCorrupt& e) {
            // A crash mid-append leaves the last line torn; anything before it was fsync'd
            // whole, so a bad line elsewhere is corruption.
            if (!last) throw StateCorrupt(journal_path_ + ": " + where + ": " + e.what());
            state.warnings.push_back(journal_path_ + ": " + where +
                                     ": a torn last record (a crash while saving?), ignored: " + e.what());
        }
    }
    state.sessions.reserve(replay.sessions.size());
    for (auto& [id, s] : replay.sessions) state.sessions.push_back(std::move(s));
    for (auto& [id, p] : replay.pending) state.pending.push_back(std::move(p));
    for (auto& w : snapshot.state.warnings) state.warnings.push_back(std::move(w));
    return state;
}

void StateStore::throw_unreadable(const std::string& path, int error) const {
    throw StateUnreadable(path + ": cannot be read: " + std::strerror(error));
}

std::string StateStore::set_aside(TimePoint now) const {
    time_t seconds = Clock::to_time_t(now);
    std::tm tm{};
    gmtime_r(&seconds, &tm);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
    std::string aside = path_ + ".corrupt-" + stamp;
    std::error_code ec;
    if (fs::exists(path_, ec)) {
        fs::rename(path_, aside, ec);
        if (ec) throw std::runtime_error("cannot move " + path_ + " to " + aside + ": " + ec.message());
    }
    // The journal goes with it: it only means something on top of that snapshot.
    std::string journal_aside = journal_path_ + ".corrupt-" + stamp;
    if (fs::exists(journal_path_, ec)) {
        fs::rename(journal_path_, journal_aside, ec);
        if (ec)
            throw std::runtime_error("cannot move " + journal_path_ + " to " + journal_aside + ": " +
                                     ec.message());
    }
    return aside;
}

void StateStore::save(const PersistedState& state) {
    // Whatever happens below, appends wait for a snapshot this store wrote.
    close_journal();
    needs_snapshot_ = true;
    const std::uint64_t generation = new_generation();
    const std::string text = encode_snapshot(state, generation);
    replace_file(path_, text, false);
    // The snapshot's rename must be on disk before the journal's: a new journal beside the
    // old snapshot would be taken as stale, and the changes of the old journal lost.
    fsync_dir(dir_);
    const std::string header = journal_header(generation);
    int fd = replace_file(journal_path_, header, true);
    try {
        fsync_dir(dir_);
    } catch (...) {
        ::close(fd);
        throw;
    }
    journal_fd_ = fd;
    needs_snapshot_ = false;
    saved_pending_.clear();
    for (const auto& p : state.pending) saved_pending_[p.container] = p;
    ++stats_.compactions;
    stats_.snapshot_bytes = text.size();
    stats_.journal_bytes = header.size();
    stats_.journal_records = 0;
}

// True while `fd` is still the file at `path`: the state dir may have been moved, removed
// or replaced under the daemon, and appends to an unlinked file would vanish.
static bool still_at(int fd, const std::string& path) {
    struct stat held {}, named {};
    return ::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_dev == named.st_dev &&
           held.st_ino == named.st_ino;
}

void StateStore::save_changes(Registry& registry) {
    if (needs_snapshot_ || !still_at(journal_fd_, journal_path_) ||
        stats_.journal_bytes > std::max(min_journal_bytes, stats_.snapshot_bytes / 4)) {
        save(registry.persisted());
        registry.changed_sessions.clear();
        return;
    }
    std::string batch;
    std::uint64_t records = 0;
    for (const auto& id : registry.changed_sessions) {
        auto it = registry.sessions.find(id);
        std::optional<PersistedSession> p;
        if (it != registry.sessions.end()) p = Registry::persisted_session(it->second);
        if (p) {
            batch += "{\"session\":";
            append_session(batch, *p);
            batch += "}\n";
        } else {
            batch += "{\"forget\":";
            append_json_string(batch, id);
            batch += "}\n";
        }
        ++records;
    }
    // Pending reaps change in many places of the loop (a failure counted, a result, a list):
    // diffed here against what was saved, which stays small (one per container).
    std::vector<std::map<std::string, PendingReap>::const_iterator> gone;
    for (auto it = saved_pending_.begin(); it != saved_pending_.end(); ++it) {
        if (registry.pending.count(it->first)) continue;
        batch += "{\"done\":";
        append_json_string(batch, it->first);
        batch += "}\n";
        gone.push_back(it);
        ++records;
    }
    std::vector<const PendingReap*> changed;
    for (const auto& [id, reap] : registry.pending) {
        auto saved = saved_pending_.find(id);
        if (saved != saved_pending_.end() && same_saved(saved->second, reap)) continue;
        batch += "{\"pending\":";
        append_pending(batch, reap);
        batch += "}\n";
        changed.push_back(&reap);
        ++records;
    }
    if (batch.empty()) {
        registry.changed_sessions.clear();
        return;
    }
    try {
        write_all(journal_fd_, batch, journal_path_);
        if (::fdatasync(journal_fd_) != 0) throw_errno("cannot fdatasync " + journal_path_);
    } catch (...) {
        // The journal may now end in a torn record: never append after it.
        close_journal();
        needs_snapshot_ = true;
        throw;
    }
    registry.changed_sessions.clear();
    for (auto it : gone) saved_pending_.erase(it);
    for (const PendingReap* reap : changed) saved_pending_[reap->container] = *reap;
    stats_.journal_bytes += batch.size();
    stats_.journal_records += records;
}

}  // namespace reaperd
