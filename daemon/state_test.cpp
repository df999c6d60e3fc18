#include "state.hpp"

#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <fstream>

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
    s.sessions.push_back({"leased", true, std::nullopt, std::nullopt, ""});
    s.sessions.push_back({"grace", false, t0 + std::chrono::seconds{10}, std::nullopt, ""});
    s.sessions.push_back({"ended", false, std::nullopt, t0, "lease_expired"});
    PendingReap p;
    p.container = "0123abcd";
    p.name = "web-1";
    p.session = "ended";
    p.reason = "session_ended";
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
    BOOST_TEST(back.sessions[2].end_reason == "lease_expired");
    BOOST_REQUIRE(back.pending.size() == 1u);
    BOOST_TEST(back.pending[0].container == "0123abcd");
    BOOST_TEST(back.pending[0].name == "web-1");
    BOOST_TEST(back.pending[0].failures == 4u);
    BOOST_TEST(!fs::exists(store.path() + ".tmp"));
    store.save({});  // overwrite
    BOOST_TEST(store.load().pending.empty());
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
