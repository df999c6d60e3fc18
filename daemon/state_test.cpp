#include "state.hpp"

#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <cstring>
#include <fstream>
#include <iterator>

#include <unistd.h>

using namespace reaperd;
namespace fs = std::filesystem;

namespace {
struct TempDir {
    fs::path path;
    TempDir() {
        char pattern[] = "/tmp/reaperd-state-test.XXXXXX";
        path = ::mkdtemp(pattern);
    }
    ~TempDir() { fs::remove_all(path); }
};

const TimePoint t0 = *parse_rfc3339("2026-11-30T12:00:00.250Z");

PersistedState sample() {
    PersistedState s;
    s.sessions.push_back({"leased", true, std::nullopt, std::nullopt, std::nullopt});
    s.sessions.push_back({"grace", false, t0 + std::chrono::seconds{10}, std::nullopt, std::nullopt});
    s.sessions.push_back({"ended", false, std::nullopt, t0, EndReason::lease_expired});
    PendingReap p;
    p.container = "0123abcd";
    p.name = "web-1";
    p.session = "ended";
    p.reason = ReapReason::session_ended;
    p.failures = 4;
    s.pending.push_back(p);
    return s;
}

void write(const fs::path& path, const std::string& text) {
    std::ofstream(path) << text;
}
}  // namespace

BOOST_AUTO_TEST_CASE(saves_and_loads_back_everything) {
    TempDir dir;
    StateStore store((dir.path / "sub").string());
    BOOST_TEST(store.load().sessions.empty());  // missing file: empty state
    store.save(sample());
    PersistedState back = store.load();
    BOOST_REQUIRE(back.sessions.size() == 3u);
    BOOST_TEST(back.sessions[0].held_lease);
    BOOST_TEST((*back.sessions[1].grace_deadline == t0 + std::chrono::seconds{10}));
    BOOST_TEST((*back.sessions[2].ended_at == t0));
    BOOST_TEST((back.sessions[2].end_reason == EndReason::lease_expired));
    BOOST_REQUIRE(back.pending.size() == 1u);
    BOOST_TEST(back.pending[0].container == "0123abcd");
    BOOST_TEST(back.pending[0].name == "web-1");
    BOOST_TEST(back.pending[0].failures == 4u);
    BOOST_TEST(!fs::exists(store.path() + ".tmp"));
    store.save({});  // overwrite
    BOOST_TEST(store.load().pending.empty());
}

// Sessions are read without Poco's DOM when laid out as this version writes them; anything
// else (an id that needs escapes here) takes Poco's path. Both give the same state.
BOOST_AUTO_TEST_CASE(the_fast_and_the_general_reader_agree) {
    PersistedState s;
    s.sessions.push_back({"plain", true, std::nullopt, std::nullopt, std::nullopt});
    s.sessions.push_back({"grace", false, t0 + std::chrono::seconds{10}, std::nullopt, std::nullopt});
    s.sessions.push_back({"ended", false, std::nullopt, t0 - std::chrono::hours{1}, EndReason::unclaimed});
    PendingReap p;
    p.container = "c1";
    p.name = "web-1";
    p.session = "ended";
    s.pending.push_back(p);
    PersistedState escaped = s;
    escaped.sessions.push_back({"quote\"and\\back\tslash", false, std::nullopt, t0, EndReason::end});
    for (const PersistedState* state : {&s, &escaped}) {
        TempDir dir;
        StateStore store(dir.path.string());
        store.save(*state);
        PersistedState back = store.load();
        BOOST_REQUIRE(back.sessions.size() == state->sessions.size());
        for (std::size_t i = 0; i < back.sessions.size(); ++i) {
            const auto& a = back.sessions[i];
            const auto& b = state->sessions[i];
            BOOST_TEST(a.id == b.id);
            BOOST_TEST(a.held_lease == b.held_lease);
            BOOST_TEST((a.grace_deadline == b.grace_deadline));
            BOOST_TEST((a.ended_at == b.ended_at));
            BOOST_TEST((a.end_reason == b.end_reason));
        }
        BOOST_REQUIRE(back.pending.size() == 1u);
        BOOST_TEST(back.pending[0].name == "web-1");
    }
}

BOOST_AUTO_TEST_CASE(corrupt_files_are_named_and_set_aside) {
    struct Case {
        const char* text;
        const char* expected;
    } cases[] = {
        {"", "not a JSON object"},
        {"{\"version\":1,\"sessions\":[", "not a JSON object"},
        {"[1,2]", "not a JSON object"},
        {"{\"version\":2,\"sessions\":[],\"pending_reaps\":[]}", "\"version\" must be 1"},
        {"{\"version\":1,\"sessions\":{},\"pending_reaps\":[]}", "must be arrays"},
        {"{\"version\":1,\"sessions\":[{\"id\":5}],\"pending_reaps\":[]}",
         "sessions[0]: \"id\" must be a string"},
        {"{\"version\":1,\"sessions\":[],\"pending_reaps\":[{\"container\":\"\",\"name\":\"\","
         "\"session\":\"\",\"reason\":\"\"}]}",
         "pending_reaps[0]: \"container\" is empty"},
        {"{\"version\":1,\"sessions\":[{\"id\":\"s\",\"ended_at_ms\":\"soon\"}],\"pending_reaps\":[]}",
         "\"ended_at_ms\" must be an integer"},
        // Laid out as this version writes (the fast path), and still named by the slow one.
        {"{\"version\":1,\"generation\":5,\n\"sessions\":[\n{\"id\":\"s\",\"ended_at_ms\":\"soon\"}],\n"
         "\"pending_reaps\":[]}\n",
         "sessions[0]: \"ended_at_ms\" must be an integer"},
        {"{\"version\":1,\"generation\":5,\n\"sessions\":[\n{\"id\":\"s\",\"end_reason\":\"bored\"}],\n"
         "\"pending_reaps\":[]}\n",
         "sessions[0]: \"end_reason\" is \"bored\""},
        {"{\"version\":1,\"generation\":5,\n\"sessions\":[\n{\"id\":\"s\"},\n{\"held_lease\":true}],\n"
         "\"pending_reaps\":[]}\n",
         "sessions[1]: \"id\" must be a string"},
    };
    for (const auto& c : cases) {
        TempDir dir;
        StateStore store(dir.path.string());
        write(store.path(), c.text);
        try {
            store.load();
            BOOST_ERROR("no error for " << c.text);
        } catch (const StateCorrupt& e) {
            std::string what = e.what();
            BOOST_TEST(what.find(store.path()) != std::string::npos, what);
            BOOST_TEST(what.find(c.expected) != std::string::npos, what);
        }
        std::string aside = store.set_aside(t0);
        BOOST_TEST(aside == store.path() + ".corrupt-20261130T120000Z");
        BOOST_TEST(fs::exists(aside));
        BOOST_TEST(!fs::exists(store.path()));
        BOOST_TEST(store.load().sessions.empty());
    }
}

BOOST_AUTO_TEST_CASE(an_unwritable_dir_fails_with_its_name_and_keeps_the_old_file) {
    if (::geteuid() == 0) {
        // root ignores permissions; check the error path through a file in the dir's place.
        TempDir dir;
        write(dir.path / "file", "x");
        BOOST_CHECK_THROW(StateStore((dir.path / "file" / "state").string()), std::runtime_error);
        return;
    }
    TempDir dir;
    StateStore store(dir.path.string());
    store.save(sample());
    fs::permissions(dir.path, fs::perms::owner_read | fs::perms::owner_exec);
    BOOST_CHECK_THROW(store.save({}), std::runtime_error);
    fs::permissions(dir.path, fs::perms::owner_all);
    BOOST_TEST(store.load().pending.size() == 1u);
}

// Unreadable is not corrupt: the content may be fine, so it must never be set aside and
// rebuilt over (issue 10). Root reads through permissions, so a directory in the file's
// place stands in for EACCES/EIO here.
BOOST_AUTO_TEST_CASE(a_state_file_that_cannot_be_read_is_unreadable_not_corrupt) {
    TempDir dir;
    StateStore store(dir.path.string());
    fs::create_directory(dir.path / "state.json");
    try {
        store.load();
        BOOST_FAIL("loaded");
    } catch (const StateCorrupt& e) {
        BOOST_FAIL(std::string("called corrupt: ") + e.what());
    } catch (const StateUnreadable& e) {
        BOOST_TEST(std::string(e.what()).find((dir.path / "state.json").string()) != std::string::npos, e.what());
        BOOST_TEST(std::string(e.what()).find("cannot be read") != std::string::npos, e.what());
    }
}

namespace {
std::string read_text(const std::string& path) {
    std::ifstream in(path);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

Registry with_tombstones(int n) {
    Registry r;
    for (int i = 0; i < n; ++i) r.end_session("s-" + std::to_string(i), EndReason::end, t0);
    return r;
}
}  // namespace

// A save after the first writes only what changed: one journal line per changed session or
// pending reap, and load() replays them over the snapshot.
BOOST_AUTO_TEST_CASE(changes_are_journaled_and_load_back) {
    TempDir dir;
    StateStore store(dir.path.string());
    Registry r = with_tombstones(100);
    store.save_changes(r);  // the first save is a snapshot
    BOOST_TEST(store.stats().compactions == 1u);
    BOOST_TEST(r.changed_sessions.empty());
    const auto snapshot = read_text(store.path());

    r.end_session("late", EndReason::end, t0 + std::chrono::seconds{1});
    r.lease_opened("leased", 7, t0);
    r.lease_opened("s-3", 8, t0);  // revived: no longer a tombstone
    r.forget_session("s-4");
    r.add_pending("c1", "web-1", "late", ReapReason::session_ended, t0);
    r.add_pending("c2", "web-2", "late", ReapReason::session_ended, t0);
    store.save_changes(r);
    r.pending.at("c1").failures = 2;
    r.pending.erase("c2");
    store.save_changes(r);
    BOOST_TEST(store.stats().compactions == 1u);
    BOOST_TEST(store.stats().journal_records == 6u + 2u);
    BOOST_TEST(read_text(store.path()) == snapshot);  // not rewritten

    PersistedState back = store.load();
    BOOST_TEST(back.warnings.empty());
    Registry restored;
    restored.restore(back, std::chrono::seconds{10}, t0);
    BOOST_TEST(restored.session_count() == 100u + 1u + 1u - 1u);
    BOOST_REQUIRE(restored.tombstone("late"));
    BOOST_TEST((restored.tombstone("late")->ended_at == t0 + std::chrono::seconds{1}));
    BOOST_TEST(!restored.tombstone("s-3"));
    BOOST_TEST(restored.sessions.at("s-3").ever_leased);
    BOOST_TEST(!restored.known("s-4"));
    BOOST_TEST((restored.tombstone("s-5")->reason == EndReason::end));
    BOOST_REQUIRE(restored.pending.size() == 1u);
    BOOST_TEST(restored.pending.at("c1").failures == 2u);
    BOOST_TEST(restored.pending.at("c1").name == "web-1");

    // Nothing changed: nothing written.
    const auto size = store.stats().journal_bytes;
    store.save_changes(r);
    BOOST_TEST(store.stats().journal_bytes == size);
    BOOST_TEST(fs::file_size(store.journal_path()) == size);
}

// A crash mid-append leaves a torn last line: it is skipped with a warning, everything
// before it loads. A bad line before the last is corruption.
BOOST_AUTO_TEST_CASE(a_torn_last_record_is_ignored_with_a_warning) {
    for (const char* tail : {"{\"session\":{\"id\":\"torn\",\"ended_at_ms\":17", "{\"sess", "\0\0\0\0",
                             "garbage\n"}) {
        TempDir dir;
        StateStore store(dir.path.string());
        Registry r = with_tombstones(2);
        store.save_changes(r);
        r.end_session("whole", EndReason::end, t0);
        store.save_changes(r);
        std::ofstream(store.journal_path(), std::ios::app) << std::string(tail, std::strlen(tail) ? std::strlen(tail) : 4);
        PersistedState back = store.load();
        BOOST_TEST(back.sessions.size() == 3u);
        BOOST_REQUIRE(back.warnings.size() == 1u);
        BOOST_TEST(back.warnings[0].find("torn last record") != std::string::npos, back.warnings[0]);
        BOOST_TEST(back.warnings[0].find(store.journal_path()) != std::string::npos, back.warnings[0]);
    }
    TempDir dir;
    StateStore store(dir.path.string());
    Registry r = with_tombstones(1);
    store.save_changes(r);
    std::ofstream(store.journal_path(), std::ios::app) << "{\"bogus\":1}\n{\"forget\":\"s-0\"}\n";
    try {
        store.load();
        BOOST_FAIL("loaded");
    } catch (const StateCorrupt& e) {
        BOOST_TEST(std::string(e.what()).find(store.journal_path() + ": line 2") != std::string::npos, e.what());
    }
    // set_aside() takes the journal along with the snapshot.
    store.set_aside(t0);
    BOOST_TEST(fs::exists(store.journal_path() + ".corrupt-20261130T120000Z"));
    BOOST_TEST(!fs::exists(store.journal_path()));
    BOOST_TEST(store.load().sessions.empty());
}

// The journal is folded into a new snapshot once it passes a quarter of the snapshot's size (at
// least 64 KiB); what loads is the same before and after.
// The file holds wall time: the loop's times plus the wall clock's lead over the loop's
// clock (registry.hpp, Clock), taken off again when loaded.
BOOST_AUTO_TEST_CASE(times_are_written_as_wall_time_and_loaded_on_the_loops_clock) {
    using namespace std::chrono_literals;
    TempDir dir;
    StateStore store(dir.path.string());
    PersistedState state;
    state.sessions.push_back({"in-grace", false, t0 + 10min, std::nullopt, std::nullopt});
    state.sessions.push_back({"ended", false, std::nullopt, t0, EndReason::end});
    store.save(state, 1h);
    auto find = [](const PersistedState& s, const std::string& id) {
        auto it = std::find_if(s.sessions.begin(), s.sessions.end(), [&](const auto& p) { return p.id == id; });
        BOOST_REQUIRE(it != s.sessions.end());
        return *it;
    };
    const PersistedState on_disk = decode_state(read_text(store.path()));
    BOOST_TEST((*find(on_disk, "in-grace").grace_deadline == t0 + 10min + 1h));
    BOOST_TEST((*find(on_disk, "ended").ended_at == t0 + 1h));
    const PersistedState back = store.load(1h);
    BOOST_TEST((*find(back, "in-grace").grace_deadline == t0 + 10min));
    BOOST_TEST((*find(back, "ended").ended_at == t0));
}

BOOST_AUTO_TEST_CASE(the_journal_is_compacted_into_a_snapshot) {
    TempDir dir;
    StateStore store(dir.path.string(), 4 * 1024);
    Registry r = with_tombstones(10);
    store.save_changes(r);
    int saves = 0;
    for (; store.stats().compactions == 1u && saves < 10000; ++saves) {
        r.end_session("e-" + std::to_string(saves), EndReason::end, t0);
        store.save_changes(r);
    }
    BOOST_TEST(store.stats().compactions == 2u);
    BOOST_TEST(saves > 30);  // 4 KiB of ~80-byte lines
    BOOST_TEST(store.stats().journal_records == 0u);
    BOOST_TEST(fs::file_size(store.journal_path()) < 100u);  // just the header
    PersistedState back = store.load();
    BOOST_TEST(back.sessions.size() == r.persisted().sessions.size());
    // Appends go on after it.
    r.end_session("after", EndReason::end, t0);
    store.save_changes(r);
    BOOST_TEST(store.load().sessions.size() == r.persisted().sessions.size());
}

// A crash between a compaction's two renames leaves the new snapshot beside the old
// journal: the journal names another generation, so its (older) changes are not replayed.
BOOST_AUTO_TEST_CASE(a_journal_of_another_snapshot_is_stale_and_ignored) {
    TempDir dir;
    StateStore store(dir.path.string());
    Registry r = with_tombstones(3);
    store.save_changes(r);
    r.end_session("x", EndReason::end, t0);
    store.save_changes(r);
    const auto old_journal = read_text(store.journal_path());
    r.forget_session("x");
    store.save(r.persisted());  // a compaction
    std::ofstream(store.journal_path(), std::ios::trunc) << old_journal;
    PersistedState back = store.load();
    BOOST_TEST(back.sessions.size() == 3u);  // "x" stays forgotten
    BOOST_REQUIRE(back.warnings.size() == 1u);
    BOOST_TEST(back.warnings[0].find("another snapshot") != std::string::npos, back.warnings[0]);
}

// The state file of the version before the journal (Poco's indented JSON, no generation)
// loads as it is, and the first save turns it into a snapshot with a journal.
BOOST_AUTO_TEST_CASE(a_state_file_of_the_previous_version_loads) {
    TempDir dir;
    StateStore store(dir.path.string());
    write(store.path(), R"({
 "pending_reaps" : [
  {
   "container" : "0123abcd",
   "failures" : 4,
   "name" : "web-1",
   "reason" : "session_ended",
   "session" : "ended"
  }
 ],
 "sessions" : [
  {
   "held_lease" : true,
   "id" : "leased"
  },
  {
   "ended_at_ms" : 1796040000250,
   "end_reason" : "lease_expired",
   "held_lease" : false,
   "id" : "ended"
  }
 ],
 "version" : 1
}
)");
    PersistedState back = store.load();
    BOOST_REQUIRE(back.sessions.size() == 2u);
    BOOST_TEST(back.sessions[0].held_lease);
    BOOST_TEST((*back.sessions[1].ended_at == t0));
    BOOST_REQUIRE(back.pending.size() == 1u);
    BOOST_TEST(back.pending[0].failures == 4u);
    Registry r;
    r.restore(back, std::chrono::seconds{10}, t0);
    store.save_changes(r);
    BOOST_TEST(fs::exists(store.journal_path()));
    BOOST_TEST(store.load().sessions.size() == 2u);
}

// Appends to a journal that is no longer at its path (the state dir moved, removed or
// replaced under the daemon) would vanish: the next save writes a snapshot there instead,
// or fails for all to see.
BOOST_AUTO_TEST_CASE(a_journal_removed_under_the_store_is_not_appended_to) {
    TempDir dir;
    StateStore store(dir.path.string());
    Registry r = with_tombstones(2);
    store.save_changes(r);
    fs::remove(store.journal_path());
    r.end_session("x", EndReason::end, t0);
    store.save_changes(r);
    BOOST_TEST(store.stats().compactions == 2u);
    BOOST_TEST(store.load().sessions.size() == 3u);
    fs::remove_all(dir.path);
    write(dir.path, "not a directory\n");
    r.end_session("y", EndReason::end, t0);
    BOOST_CHECK_THROW(store.save_changes(r), std::runtime_error);
    BOOST_TEST(r.changed_sessions.count("y") == 1u);  // kept for the next try
    fs::remove(dir.path);
    fs::create_directory(dir.path);
    store.save_changes(r);
    BOOST_TEST(store.load().sessions.size() == 4u);
}
