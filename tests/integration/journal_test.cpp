// reaperd's log read back from a real journald: a standalone systemd-journald runs in a
// private mount namespace (its own tmpfs /run, so the host's /run is untouched), this
// executable is run again inside it as the program under test, and the records are read
// back with `journalctl -D STORAGE -o json`.
#include "log.hpp"
#include "private_journald.hpp"

#include <boost/test/unit_test.hpp>

#include <Poco/JSON/Object.h>
#include <Poco/JSON/Parser.h>

#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

// When this executable is started with REAPERD_LOG_EMIT=<run>, it is the program under test:
// it writes the records below (tagged TEST_RUN=<run>) and exits before the tests start.
const bool emitter_ran = [] {
    const char* run = std::getenv("REAPERD_LOG_EMIT");
    if (run == nullptr) return false;
    using reaperd::LogField;
    namespace id = reaperd::message_id;
    reaperd::log(reaperd::Priority::notice, id::container_reaped, "container reaped",
                 {{"CONTAINER_ID", "c0ffee0123456789"},
                  {"CONTAINER_NAME", "web-1"},
                  {"SESSION_ID", "session-42"},
                  {"ACTION", "remove"},
                  {"TEST_RUN", run}});
    reaperd::log(reaperd::Priority::warning, id::log_capped, "log capped\nsecond line",
                 {{"CONTAINER_ID", "c0ffee0123456789"},
                  {"SESSION_ID", "session-42"},
                  {"ACTION", "truncate"},
                  {"LOG_BYTES", "10485760"},
                  {"LOG_BYTES_DROPPED", "73400320"},
                  {"TEST_RUN", run}});
    std::fflush(stderr);
    std::_Exit(0);
}();

using reaper::test::file_text;

// The emitter runs three ways: stderr is a file and no JOURNAL_STREAM (the journal
// socket decides); JOURNAL_STREAM names a stream that is not our stderr (plain lines);
// stderr really is a journal stream and JOURNAL_STREAM names it (native records).
const char* const emitter_runs = R"(
env -u JOURNAL_STREAM -u REAPERD_LOG_TARGET REAPERD_LOG_EMIT=socket "$self" 2>"$dir/socket.err" </dev/null
env -u REAPERD_LOG_TARGET JOURNAL_STREAM=1:1 REAPERD_LOG_EMIT=foreign "$self" 2>"$dir/foreign.err" </dev/null
systemd-cat -t stream-wrapper env -u REAPERD_LOG_TARGET REAPERD_LOG_EMIT=stream bash -c \
  'export JOURNAL_STREAM=$(stat -L -c %d:%i /proc/self/fd/2); exec "$0"' "$self" </dev/null
)";

// One journald session for all cases.
const reaper::test::PrivateJournald& journal() {
    static reaper::test::PrivateJournald run("reaperd-journal-test", emitter_runs);
    return run;
}

std::string field(const Poco::JSON::Object::Ptr& record, const std::string& name) {
    if (!record->has(name)) return "<missing>";
    return record->getValue<std::string>(name);
}

}  // namespace

BOOST_AUTO_TEST_CASE(without_journal_stream_the_socket_gets_structured_records) {
    BOOST_REQUIRE(!emitter_ran);
    auto records = journal().records("TEST_RUN=socket");
    BOOST_TEST_INFO("driver output:\n" << journal().output());
    BOOST_REQUIRE_EQUAL(records.size(), 2u);

    const auto& reaped = records[0];
    BOOST_TEST(field(reaped, "MESSAGE") == "container reaped");
    BOOST_TEST(field(reaped, "MESSAGE_ID") == std::string(reaperd::message_id::container_reaped));
    BOOST_TEST(field(reaped, "PRIORITY") == "5");
    BOOST_TEST(field(reaped, "SYSLOG_IDENTIFIER") == "reaperd");
    BOOST_TEST(field(reaped, "CONTAINER_ID") == "c0ffee0123456789");
    BOOST_TEST(field(reaped, "CONTAINER_NAME") == "web-1");
    BOOST_TEST(field(reaped, "SESSION_ID") == "session-42");
    BOOST_TEST(field(reaped, "ACTION") == "remove");
    BOOST_TEST(field(reaped, "_TRANSPORT") == "journal");
    BOOST_TEST(field(reaped, "_PID") != "<missing>");

    const auto& capped = records[1];
    BOOST_TEST(field(capped, "MESSAGE") == "log capped\nsecond line");
    BOOST_TEST(field(capped, "MESSAGE_ID") == std::string(reaperd::message_id::log_capped));
    BOOST_TEST(field(capped, "PRIORITY") == "4");
    BOOST_TEST(field(capped, "ACTION") == "truncate");
    BOOST_TEST(field(capped, "LOG_BYTES") == "10485760");
    BOOST_TEST(field(capped, "LOG_BYTES_DROPPED") == "73400320");

    // Nothing went to stderr: the journal took every record.
    BOOST_TEST(file_text(journal().dir() / "socket.err").empty());
}

BOOST_AUTO_TEST_CASE(journal_stream_of_someone_else_means_plain_stderr_lines) {
    auto records = journal().records("TEST_RUN=foreign");
    BOOST_TEST(records.empty());
    auto err = file_text(journal().dir() / "foreign.err");
    BOOST_TEST(err.find("<5>notice: container reaped CONTAINER_ID=c0ffee0123456789") == 0u);
    BOOST_TEST(err.find("MESSAGE_ID=" + std::string(reaperd::message_id::log_capped)) !=
               std::string::npos);
}

BOOST_AUTO_TEST_CASE(stderr_that_is_the_journal_stream_gets_native_records) {
    auto records = journal().records("TEST_RUN=stream");
    BOOST_REQUIRE_EQUAL(records.size(), 2u);
    // Native (structured) records, not the stream's plain lines.
    BOOST_TEST(field(records[0], "_TRANSPORT") == "journal");
    BOOST_TEST(field(records[0], "SESSION_ID") == "session-42");
    BOOST_TEST(field(records[1], "LOG_BYTES_DROPPED") == "73400320");
}
