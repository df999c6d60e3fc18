#include "state.hpp"

#include "errno_text.hpp"
#include "read_all.hpp"
#include "unique_fd.hpp"

#include <Poco/JSON/Array.h>
#include <Poco/JSON/Object.h>
#include <Poco/JSON/Parser.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <optional>
#include <random>
#include <string_view>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <malloc.h>
#include <sys/stat.h>
#include <unistd.h>

namespace reaperd {

namespace fs = std::filesystem;

namespace {

constexpr int state_version = 1;
constexpr int journal_version = 1;

std::int64_t to_unix_ms(TimePoint t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}
TimePoint from_unix_ms(std::int64_t ms) {
    return TimePoint{std::chrono::duration_cast<Clock::duration>(std::chrono::milliseconds{ms})};
}

[[noreturn]] void throw_errno(const std::string& what) {
    throw std::runtime_error(what + ": " + reaper::detail::errno_text(errno));
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
    const reaper::detail::UniqueFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dir_fd) throw_errno("cannot open " + dir);
    if (::fsync(dir_fd.get()) != 0) throw_errno("cannot fsync " + dir);
}

// Writes `text` to `path`.tmp, fsyncs it and renames it over `path`. Returns the temp file's
// descriptor, still open for writing (O_APPEND), when `keep_open`; else none.
reaper::detail::UniqueFd replace_file(const std::string& path, const std::string& text, bool keep_open) {
    std::string temp = path + ".tmp";
    reaper::detail::UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600));
    if (!fd) throw_errno("cannot create " + temp);
    try {
        write_all(fd.get(), text, temp);
        if (::fsync(fd.get()) != 0) throw_errno("cannot fsync " + temp);
    } catch (...) {
        fd.reset();
        ::unlink(temp.c_str());
        throw;
    }
    if (!keep_open && !fd.close_checked()) throw_errno("cannot close " + temp);
    if (::rename(temp.c_str(), path.c_str()) != 0) {
        int saved = errno;
        fd.reset();
        ::unlink(temp.c_str());
        errno = saved;
        throw_errno("cannot rename " + temp + " to " + path);
    }
    return fd;
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

// `wall_offset` turns the loop's times into wall time (registry.hpp, steady_now()).
void append_session(std::string& out, const PersistedSession& s, Clock::duration wall_offset) {
    out += "{\"id\":";
    append_json_string(out, s.id);
    out += s.held_lease ? ",\"held_lease\":true" : ",\"held_lease\":false";
    if (s.grace_deadline)
        out += ",\"grace_deadline_ms\":" + std::to_string(to_unix_ms(*s.grace_deadline + wall_offset));
    if (s.ended_at) out += ",\"ended_at_ms\":" + std::to_string(to_unix_ms(*s.ended_at + wall_offset));
    if (s.end_reason) {
        out += ",\"end_reason\":";
        append_json_string(out, std::string(to_string(*s.end_reason)));
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
    append_json_string(out, std::string(to_string(p.reason)));
    out += ",\"failures\":" + std::to_string(p.failures) + "}";
}

std::string encode_snapshot(const PersistedState& state, std::uint64_t generation, Clock::duration wall_offset) {
    std::string out;
    out.reserve(64 + state.sessions.size() * 110 + state.pending.size() * 160);
    out += "{\"version\":" + std::to_string(state_version);
    if (generation != 0) out += ",\"generation\":" + std::to_string(generation);
    out += ",\n\"sessions\":[";
    for (std::size_t i = 0; i < state.sessions.size(); ++i) {
        out += i ? ",\n" : "\n";
        append_session(out, state.sessions[i], wall_offset);
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

// A vocabulary's value (vocabulary.hpp) by the name the file holds: the names written are
// the tables' own, so every state file written so far reads back.
template <class Enum, std::size_t N>
Enum required_name(const Poco::JSON::Object::Ptr& o, const std::string& key, const std::string& where,
                   const std::array<Named<Enum>, N>& table) {
    const std::string name = required_string(o, key, where);
    if (auto value = value_in(table, name)) return *value;
    std::string known;
    for (const auto& row : table) known += std::string(known.empty() ? "" : ", ") + std::string(row.name);
    throw StateCorrupt(where + ": \"" + key + "\" is \"" + name + "\", not one of " + known);
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
    if (o->has("end_reason")) s.end_reason = required_name(o, "end_reason", where, end_reason_names);
    return s;
}

PendingReap decode_pending(const Poco::JSON::Object::Ptr& o, const std::string& where) {
    if (!o) throw StateCorrupt(where + ": must be an object");
    PendingReap p;
    p.container = required_string(o, "container", where);
    if (p.container.empty()) throw StateCorrupt(where + ": \"container\" is empty");
    p.name = required_string(o, "name", where);
    p.session = required_string(o, "session", where);
    p.reason = required_name(o, "reason", where, reap_reason_names);
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

// ---- the fast path: sessions as this file writes them, without Poco's DOM ----
// 100,000 tombstones through the DOM took a load 1.2 s and left reaperd's heap ~100 MB larger
// (bench/tombstone_bench). A session line as append_session() writes it (flat, no escapes)
// is read here; anything else returns nullopt and the caller reads the whole file through
// Poco instead, which says what is wrong.

// Reads `"key":value` pairs of a flat object starting at text[pos] == '{'; advances `pos`
// past its '}'. Strings without escapes, integers, true and false only.
std::optional<PersistedSession> fast_session(std::string_view text, std::size_t& pos) {
    if (pos >= text.size() || text[pos] != '{') return std::nullopt;
    ++pos;
    const auto string_at = [&](std::string_view& out) {
        if (pos >= text.size() || text[pos] != '"') return false;
        const std::size_t close = text.find('"', pos + 1);
        if (close == std::string_view::npos) return false;
        out = text.substr(pos + 1, close - pos - 1);
        if (out.find('\\') != std::string_view::npos) return false;
        for (char c : out)
            if (static_cast<unsigned char>(c) < 0x20) return false;
        pos = close + 1;
        return true;
    };
    PersistedSession s;
    bool has_id = false;
    for (;;) {
        std::string_view key, value;
        if (!string_at(key) || pos >= text.size() || text[pos++] != ':') return std::nullopt;
        if (key == "id" || key == "end_reason") {
            if (!string_at(value)) return std::nullopt;
            if (key == "id") {
                s.id = std::string(value);
                has_id = true;
            } else if (auto reason = value_in(end_reason_names, value)) {
                s.end_reason = *reason;
            } else {
                return std::nullopt;
            }
        } else if (key == "held_lease") {
            s.held_lease = text.substr(pos, 4) == "true";
            if (!s.held_lease && text.substr(pos, 5) != "false") return std::nullopt;
            pos += s.held_lease ? 4 : 5;
        } else if (key == "grace_deadline_ms" || key == "ended_at_ms") {
            std::int64_t ms = 0;
            const char* begin = text.data() + pos;
            const auto [end, error] = std::from_chars(begin, text.data() + text.size(), ms);
            constexpr auto clock_ms =
                std::chrono::duration_cast<std::chrono::milliseconds>(Clock::duration::max()).count();
            if (error != std::errc() || ms > clock_ms || ms < -clock_ms) return std::nullopt;
            pos += static_cast<std::size_t>(end - begin);
            (key == "ended_at_ms" ? s.ended_at : s.grace_deadline) = from_unix_ms(ms);
        } else {
            return std::nullopt;
        }
        if (pos >= text.size()) return std::nullopt;
        if (text[pos] == '}') {
            ++pos;
            return has_id ? std::optional<PersistedSession>(std::move(s)) : std::nullopt;
        }
        if (text[pos++] != ',') return std::nullopt;
    }
}

// The sessions of a snapshot laid out as encode_snapshot() writes it, and the rest of the
// document with an empty "sessions" in their place (for Poco: version, generation and the
// pending reaps, which are few); nullopt for any other layout.
struct SplitSnapshot {
    std::vector<PersistedSession> sessions;
    std::string rest;
};
std::optional<SplitSnapshot> fast_split(const std::string& text) {
    const std::string head = "{\"version\":" + std::to_string(state_version) + ",\"generation\":";
    const std::string_view open = ",\n\"sessions\":[";
    if (text.compare(0, head.size(), head) != 0) return std::nullopt;
    const std::size_t open_at = text.find(open, head.size());
    if (open_at == std::string::npos || open_at > head.size() + 20) return std::nullopt;
    SplitSnapshot split;
    std::size_t pos = open_at + open.size();
    for (bool first = true;; first = false) {
        if (pos < text.size() && text[pos] == ']') break;
        if (!first && (pos >= text.size() || text[pos++] != ',')) return std::nullopt;
        if (pos >= text.size() || text[pos++] != '\n') return std::nullopt;
        auto s = fast_session(text, pos);
        if (!s) return std::nullopt;
        split.sessions.push_back(std::move(*s));
    }
    split.rest = text.substr(0, open_at + open.size()) + text.substr(pos);
    return split;
}

Snapshot decode_snapshot(const std::string& text) {
    std::optional<SplitSnapshot> split = fast_split(text);
    Poco::JSON::Object::Ptr root = parse_object(split ? split->rest : text);
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
        if (split) snapshot.state.sessions = std::move(split->sessions);
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

std::string encode_state(const PersistedState& state) { return encode_snapshot(state, 0, {}); }

PersistedState decode_state(const std::string& text) { return decode_snapshot(text).state; }

StateStore::StateStore(std::string dir, std::uint64_t min_journal_bytes)
    : dir_(std::move(dir)),
      path_(dir_ + "/state.json"),
      journal_path_(dir_ + "/state.journal"),
      min_journal_bytes_(min_journal_bytes) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) throw std::runtime_error("cannot create state.dir " + dir_ + ": " + ec.message());
}

StateStore::~StateStore() { close_journal(); }

void StateStore::close_journal() noexcept {
    journal_fd_.reset();
}

PersistedState StateStore::load(Clock::duration wall_offset) const {
    PersistedState state = read_files();
    for (auto& s : state.sessions) {
        if (s.grace_deadline) *s.grace_deadline -= wall_offset;
        if (s.ended_at) *s.ended_at -= wall_offset;
    }
    return state;
}

PersistedState StateStore::read_files() const {
    // Reads a whole file; nullopt if it does not exist.
    auto read = [this](const std::string& path) -> std::optional<std::string> {
        const reaper::detail::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
        if (!fd) {
            if (errno == ENOENT) return std::nullopt;
            throw_unreadable(path, errno);
        }
        std::string text;
        const int error = read_all(fd.get(), text);
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
            // The common record, {"session":{...}}, on the fast path; any other through Poco.
            const std::string_view session_record = "{\"session\":";
            std::size_t at = session_record.size();
            std::optional<PersistedSession> fast;
            if (text.compare(0, at, session_record) == 0) fast = fast_session(text, at);
            if (fast && text.size() == at + 1 && text[at] == '}') {
                std::string id = fast->id;
                replay.sessions[id] = std::move(*fast);
            } else {
                auto record = parse_object(text);
                corrupt_on_error([&] { replay.apply(record, where); });
            }
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
    throw StateUnreadable(path + ": cannot be read: " + reaper::detail::errno_text(error));
}

std::string StateStore::set_aside(TimePoint wall_now) const {
    time_t seconds = Clock::to_time_t(wall_now);
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

void StateStore::save(const PersistedState& state, Clock::duration wall_offset) {
    // Whatever happens below, appends wait for a snapshot this store wrote.
    close_journal();
    needs_snapshot_ = true;
    const std::uint64_t generation = new_generation();
    const std::string text = encode_snapshot(state, generation, wall_offset);
    replace_file(path_, text, false);
    // The snapshot's rename must be on disk before the journal's: a new journal beside the
    // old snapshot would be taken as stale, and the changes of the old journal lost.
    fsync_dir(dir_);
    const std::string header = journal_header(generation);
    reaper::detail::UniqueFd fd = replace_file(journal_path_, header, true);
    fsync_dir(dir_);
    journal_fd_ = std::move(fd);
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

void StateStore::save_changes(Registry& registry, Clock::duration wall_offset) {
    if (needs_snapshot_ || !still_at(journal_fd_.get(), journal_path_) ||
        stats_.journal_bytes > std::max(min_journal_bytes_, stats_.snapshot_bytes / 4)) {
        save(registry.persisted(), wall_offset);
        registry.changed_sessions.clear();
        // A compaction (and the load before the first) frees a copy of every session, in
        // small blocks that malloc keeps mapped: with 127,000 tombstones reaperd stayed at
        // 59 MB after start-up without this (bench/tombstone_bench).
        ::malloc_trim(0);
        return;
    }
    std::string batch;
    std::uint64_t records = 0;
    for (const auto& id : registry.changed_sessions) {
        if (auto p = registry.persisted_session(id)) {
            batch += "{\"session\":";
            append_session(batch, *p, wall_offset);
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
        write_all(journal_fd_.get(), batch, journal_path_);
        if (::fdatasync(journal_fd_.get()) != 0) throw_errno("cannot fdatasync " + journal_path_);
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
