// Log caps against the real engine: LogCapper driven in-process with a real Client, on
// containers whose logs the private dockerd writes (json-file, local, rotated, none); then
// the same through a running reaperd child.
#include "daemon_fixture.hpp"
#include "engine.hpp"
#include "logcap/logcap.hpp"
#include "logcap/logcap_file.hpp"

#include <reaper/client.hpp>

#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <mutex>
#include <thread>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace reaperd;
using namespace std::chrono_literals;
using reaper::test::engine;
using reaper::test::unique_name;
using reaperd::itest::eventually;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::uint64_t MiB = 1024 * 1024;
const std::string session_label = "reaperd.session";

// `lines` json log lines of ~201 bytes each (130 characters of text), then quiet.
std::vector<std::string> burst_of(int lines) {
    return {"sh", "-c",
            "yes 0123456789012345678901234567890123456789012345678901234567890123456789"
            "012345678901234567890123456789012345678901234567890123456789 | head -n " +
                std::to_string(lines) + "; exec sleep 600"};
}
// ~3 MB of json log, then quiet: a writer that passes a small cap once and keeps running.
const std::vector<std::string> burst_then_sleep = burst_of(15000);
// A runaway: about 70 MB/s of json log here.
const std::vector<std::string> runaway = {"yes"};

struct Records {
    std::mutex mutex;
    std::vector<std::map<std::string, std::string>> fields;
    std::vector<std::string> messages;
    LogSink sink() {
        return [this](Priority, std::string_view, std::string_view message, std::vector<LogField> f) {
            std::map<std::string, std::string> m;
            for (auto& field : f) m[field.name] = field.value;
            std::lock_guard lock(mutex);
            fields.push_back(std::move(m));
            messages.emplace_back(message);
        };
    }
    std::size_t count(const std::string& field, const std::string& value) {
        std::lock_guard lock(mutex);
        return static_cast<std::size_t>(std::count_if(fields.begin(), fields.end(), [&](const auto& m) {
            auto it = m.find(field);
            return it != m.end() && it->second == value;
        }));
    }
};

struct Fixture {
    reaper::Client client{engine().client_options()};
    reaperd::EngineAdapter port{client};  // what reaperd's main gives its capper
    std::string root = engine().data_root();  // the engine's DockerRootDir (GET /info)
    Records records;
    std::vector<std::string> created;

    ~Fixture() {
        for (const auto& id : created) {
            try {
                client.remove(id, {true, true});
            } catch (const std::exception&) {
            }
        }
    }

    std::string run(const std::vector<std::string>& cmd, const std::string& session,
                    reaper::LogConfig log = {}, reaper::Labels labels = {}) {
        reaper::ContainerSpec spec;
        spec.name = unique_name("logcap");
        spec.image = reaper::test::PrivateEngine::image;
        spec.cmd = cmd;
        spec.labels = std::move(labels);
        spec.labels["reaper.test"] = "logcap";
        if (!session.empty()) spec.labels[session_label] = session;
        spec.log_config = std::move(log);
        auto id = client.create(spec);
        created.push_back(id);
        client.start(id);
        return id;
    }

    ContainerLog describe(const std::string& id) {
        auto info = client.inspect(id);
        ContainerLog c;
        c.id = info.id;
        c.name = info.name;
        auto label = info.labels.find(session_label);
        if (label != info.labels.end()) c.session = label->second;
        c.log_path = info.log_path;
        c.log_driver = info.log_driver;
        c.labels = info.labels;
        c.docker_root_dir = root;
        return c;
    }

    LogCapper::Options options(LogAction action, LogScope scope, std::uint64_t max_size_bytes) {
        LogCapper::Options o;
        o.logs.max_size_bytes = max_size_bytes;
        o.logs.action = action;
        o.logs.scope = scope;
        o.logs.check_interval = 1s;
        o.stop_grace = 1s;
        o.sink = records.sink();
        return o;
    }

    bool running(const std::string& id) {
        try {
            return client.inspect(id).state.running;
        } catch (const reaper::NotFound&) {
            return false;
        }
    }
    bool exists(const std::string& id) {
        try {
            client.inspect(id);
            return true;
        } catch (const reaper::NotFound&) {
            return false;
        }
    }
};

std::uint64_t size_of(const fs::path& path) {
    std::error_code ec;
    auto n = fs::file_size(path, ec);
    return ec ? 0 : n;
}

// The bytes a file holds on disk: a punched cut leaves its apparent size growing.
std::uint64_t allocated_of(const fs::path& path) { return logcap::allocated_bytes(path.string()); }

// The live file plus its rotations, as the capper counts them: the bytes on disk.
std::uint64_t log_bytes(const ContainerLog& c) {
    fs::path live = c.log_path;
    std::uint64_t total = allocated_of(live);
    std::error_code ec;
    for (auto& entry : fs::directory_iterator(live.parent_path(), ec))
        if (is_rotation(entry.path().filename().string(), live.filename().string()))
            total += allocated_of(entry.path());
    return total;
}

// Samples the log's size at 100 Hz for `duration`; returns the largest seen.
std::uint64_t max_size_over(const ContainerLog& c, std::chrono::milliseconds duration) {
    std::uint64_t max = 0;
    auto end = Clock::now() + duration;
    for (auto next = Clock::now(); next < end; next += 10ms) {
        max = std::max(max, log_bytes(c));
        std::this_thread::sleep_until(next);
    }
    return max;
}

}  // namespace

BOOST_AUTO_TEST_CASE(truncate_keeps_a_runaway_running_and_its_log_under_the_cap) {
    Fixture f;
    LogCapper capper(f.port, f.options(LogAction::truncate, LogScope::sessions, 10 * MiB));
    capper.start();
    auto id = f.run(runaway, "s-truncate");
    auto c = f.describe(id);
    BOOST_TEST_REQUIRE(!c.log_path.empty());
    capper.add(c);
    auto max = max_size_over(c, 5s);
    BOOST_TEST_MESSAGE("max bytes on disk over 5 s: " << max << " bytes; cuts: " << capper.counters().truncations);
    // Capped, not uncapped (~350 MB in these 5 s). A cut keeps the newest half of the cap now
    // (issue 21), so a runaway has 7/16 of the cap between its mark and the cap; how far past
    // it the log gets is the capper thread's wait for a core: 11.4 MB at a load average of
    // 9.4 on the 2 cores, 14.4 MB at 6.5 beside an ASan build. logcap_readers_test holds the
    // 1.1x bound, run alone.
    BOOST_TEST(max <= 2 * 10 * MiB);
    BOOST_TEST(capper.counters().truncations > 0u);
    BOOST_TEST(capper.counters().log_bytes_dropped >= 5 * MiB);  // a cut comes at 9/16 of the cap or later
    BOOST_TEST(f.running(id));
    BOOST_TEST(f.records.count("ACTION", "truncate") > 0u);
    BOOST_TEST(f.records.count("CUT_METHOD", "punch_hole") > 0u);
    // The writer is still writing, at the same offsets: the apparent size only grows.
    auto before = f.client.inspect(id).state.started_at;
    const auto apparent = size_of(c.log_path);
    BOOST_TEST(eventually([&] { return size_of(c.log_path) > apparent; }));
    BOOST_TEST(f.client.inspect(id).state.started_at == before);
}

BOOST_AUTO_TEST_CASE(stop_kill_and_remove_act_on_session_owned_containers_only) {
    for (auto action : {LogAction::stop, LogAction::kill, LogAction::remove}) {
        BOOST_TEST_CONTEXT("action " << to_string(action)) {
            Fixture f;
            LogCapper capper(f.port, f.options(action, LogScope::all, 1 * MiB));
            capper.start();
            auto owned = f.run(burst_then_sleep, "s-" + std::string(to_string(action)));
            auto unowned = f.run(burst_then_sleep, "");
            capper.add(f.describe(owned));
            auto bystander = f.describe(unowned);
            capper.add(bystander);
            if (action == LogAction::remove)
                BOOST_TEST(eventually([&] { return !f.exists(owned); }));
            else
                BOOST_TEST(eventually([&] { return !f.running(owned); }));
            BOOST_TEST(eventually([&] { return f.records.count("CONTAINER_ID", unowned) > 0; }));
            BOOST_TEST(f.running(unowned));
            // The first record can be a cut in the middle of the burst; the cut after its
            // last line brings the log under the cap.
            BOOST_TEST(eventually([&] { return log_bytes(bystander) < 1 * MiB; }));
            // The record follows the engine call on the capper's worker thread, so it may
            // land a moment after the container's state changed.
            auto acted = std::string(to_string(action));
            BOOST_TEST(eventually([&] { return f.records.count("ACTION", acted) >= 1u; }));
            BOOST_TEST(f.records.count("ACTION", acted) == 1u);
        }
    }
}

BOOST_AUTO_TEST_CASE(scope_all_truncates_an_unlabeled_runaway_and_never_stops_it) {
    Fixture f;
    LogCapper capper(f.port, f.options(LogAction::remove, LogScope::all, 4 * MiB));
    capper.start();
    auto id = f.run(runaway, "");
    auto c = f.describe(id);
    auto started = f.client.inspect(id).state.started_at;
    capper.add(c);
    auto max = max_size_over(c, 3s);
    BOOST_TEST_MESSAGE("max log size over 3 s: " << max << " bytes");
    BOOST_TEST(capper.counters().truncations > 0u);
    BOOST_TEST(capper.counters().stops + capper.counters().kills + capper.counters().removals == 0u);
    BOOST_TEST(f.running(id));
    BOOST_TEST(f.client.inspect(id).state.started_at == started);
    BOOST_TEST(f.records.count("ACTION", "remove") == 0u);
}

BOOST_AUTO_TEST_CASE(a_container_without_a_log_file_is_skipped_with_a_message) {
    Fixture f;
    LogCapper capper(f.port, f.options(LogAction::truncate, LogScope::sessions, 1 * MiB));
    capper.start();
    auto id = f.run(burst_then_sleep, "s-none", reaper::LogConfig{"none", {}});
    auto c = f.describe(id);
    BOOST_TEST(c.log_driver == "none");
    capper.add(c);
    capper.add(c);
    BOOST_TEST_REQUIRE(eventually([&] { return f.records.count("CONTAINER_ID", id) > 0; }));
    std::this_thread::sleep_for(1500ms);
    BOOST_TEST(f.records.count("CONTAINER_ID", id) == 1u);
    BOOST_TEST(f.records.count("LOG_DRIVER", "none") == 1u);
    BOOST_TEST(capper.watched() == 0u);
    BOOST_TEST(f.running(id));
}

BOOST_AUTO_TEST_CASE(rotated_files_count_toward_the_cap) {
    Fixture f;
    // The engine reads max-size as decimal: it rotates at 1,000,000 bytes and keeps 3 files.
    // The burst writes 13,000 json lines of ~201 bytes (2.61 MB), which settle as two full
    // rotations and a 0.61 MB live file: only counting the rotations brings that over a
    // 2 MiB (2.10 MB) cap, and it stays over once the burst is done. A burst of 15,000 lines
    // settled at 2.01 MB after a third rotation dropped the oldest file: a capper slowed down
    // by a loaded machine (CI) could miss the moment it was over and never cut.
    LogCapper capper(f.port, f.options(LogAction::truncate, LogScope::sessions, 2 * MiB));
    capper.start();
    auto id = f.run(burst_of(13000), "s-rotate",
                    reaper::LogConfig{"json-file", {{"max-size", "1m"}, {"max-file", "3"}}});
    auto c = f.describe(id);
    capper.add(c);
    BOOST_TEST_REQUIRE(eventually([&] { return capper.counters().truncations > 0u; }));
    BOOST_TEST(eventually([&] { return log_bytes(c) < 2 * MiB; }));
    // A cut deletes rotations, oldest first, until what is left fits the newest half it keeps;
    // the live file (under 1 MB) is never over that half: at least one whole rotation goes
    // (1,003,520 bytes on disk; two when the cut came after the second rotation).
    BOOST_TEST(capper.counters().log_bytes_dropped >= 1000000u);
    BOOST_TEST(f.running(id));
}

BOOST_AUTO_TEST_CASE(the_local_driver_is_capped) {
    Fixture f;
    LogCapper capper(f.port, f.options(LogAction::truncate, LogScope::sessions, 1 * MiB));
    capper.start();
    auto id = f.run(runaway, "s-local", reaper::LogConfig{"local", {}});
    auto c = f.describe(id);
    BOOST_TEST(c.log_driver == "local");
    capper.add(c);
    BOOST_TEST_REQUIRE(eventually([&] { return capper.counters().truncations > 0u; }));
    BOOST_TEST(f.running(id));
}

BOOST_AUTO_TEST_CASE(a_label_overrides_the_default_and_a_broken_one_falls_back_with_one_warning) {
    Fixture f;
    LogCapper capper(f.port, f.options(LogAction::truncate, LogScope::sessions, 8 * MiB));
    capper.start();
    auto small = f.run(burst_then_sleep, "s-label", {}, {{logcap::max_size_label, "1MiB"}});
    auto broken = f.run(burst_then_sleep, "s-label", {}, {{logcap::max_size_label, "a lot"}});
    auto s = f.describe(small);
    auto b = f.describe(broken);
    capper.add(s);
    capper.add(b);
    capper.add(b);
    BOOST_TEST_REQUIRE(eventually([&] { return f.records.count("ACTION", "truncate") > 0; }));
    BOOST_TEST(f.records.count("CONTAINER_ID", small) >= 1u);
    // The broken label's container gets the 8 MiB default: its 2.9 MB stays.
    BOOST_TEST(eventually([&] { return log_bytes(b) > 2 * MiB; }));
    std::this_thread::sleep_for(1500ms);
    BOOST_TEST(log_bytes(b) > 2 * MiB);
    BOOST_TEST(f.records.count("LABEL_VALUE", "a lot") == 1u);
    std::lock_guard lock(f.records.mutex);
    bool named = std::any_of(f.records.messages.begin(), f.records.messages.end(), [&](const auto& m) {
        return m.find(b.name) != std::string::npos && m.find("a lot") != std::string::npos;
    });
    BOOST_TEST(named);
}

// ---- the same, through a running reaperd ---------------------------------------------------
namespace {

std::string started_at(const std::string& id) {
    return itest::engine_client().inspect(id).state.started_at;
}

}  // namespace

BOOST_AUTO_TEST_CASE(reaperd_truncates_an_unowned_runaway_and_stops_only_the_owned_writer) {
    itest::Reaperd daemon("", "logs:\n  max_size: 10MiB\n  action: stop\n  scope: all\n");
    daemon.start();
    Fixture f;
    auto owned = f.run(burst_then_sleep, "s-daemon", {}, {{logcap::max_size_label, "1MiB"}});
    auto unowned = f.run(runaway, "");
    auto started = started_at(unowned);
    auto c = f.describe(unowned);
    // From its first cut on, the log stays within 3x the cap. Before it,
    // reaperd has to hear of the container from the engine's events and look it up: at 70 MB/s
    // a 10 MiB cap leaves 150 ms for that, which a machine at load average 8 overran once
    // (15.4 MB). After it, each cut comes at the mark (5.9 MB here) and has ~65 ms of writing
    // before the cap, since a cut keeps half the cap: within the cap on an idle machine; 11.9
    // and 13.5 MB with the suite, a CPU-bound job and builds beside it (load ~8 on 2 cores),
    // 16.5 and 17.9 MB beside one CPU-bound job (load ~4), where a bare loop polling the size
    // every 1 ms and punching stays within ~1.4x (README, Log-size caps). Uncapped: ~350 MB in
    // those 5 s.
    const std::string first_cut = "CONTAINER_ID=" + unowned + " CONTAINER_NAME=" + c.name +
                                  " SESSION_ID=\"\" ACTION=truncate";
    BOOST_TEST_REQUIRE(eventually([&] { return daemon.log_count(first_cut) >= 1u; }));
    auto max = max_size_over(c, 5s);
    BOOST_TEST_MESSAGE("reaperd: max unowned log size over 5 s after its first cut: " << max << " bytes");
    BOOST_TEST(max <= 30 * MiB);
    BOOST_TEST(eventually([&] { return !f.running(owned); }));
    BOOST_TEST(f.running(unowned));
    BOOST_TEST(started_at(unowned) == started);
    // The stop is recorded once the engine has answered it, which can be a moment after the
    // container is seen stopped (CI's run read the log in between once).
    const std::string stopped = "CONTAINER_ID=" + owned + " ";
    BOOST_TEST(eventually([&] { return daemon.log_count("ACTION=stop") >= 1u; }), daemon.log_text());
    BOOST_TEST(daemon.log_count("ACTION=stop") == 1u);
    BOOST_TEST(daemon.log_count(stopped) >= 1u);
    BOOST_TEST(daemon.log_count("MESSAGE_ID=" + std::string(message_id::log_capped)) >= 2u);
    BOOST_TEST(daemon.terminate() == 0);
}

BOOST_AUTO_TEST_CASE(reaperd_reports_a_container_without_a_log_file_once) {
    itest::Reaperd daemon("", "logs:\n  max_size: 1MiB\n");
    daemon.start();
    Fixture f;
    auto id = f.run(burst_then_sleep, "s-daemon-none", reaper::LogConfig{"none", {}});
    BOOST_TEST(eventually([&] { return daemon.log_count("LOG_DRIVER=none") > 0; }));
    std::this_thread::sleep_for(2s);
    BOOST_TEST(daemon.log_count("LOG_DRIVER=none") == 1u);
    BOOST_TEST(daemon.log_count("CONTAINER_ID=" + id) == 1u);
    BOOST_TEST(f.running(id));
    BOOST_TEST(daemon.terminate() == 0);
}

BOOST_AUTO_TEST_CASE(reaperd_caps_the_local_driver_with_no_json_file_container_around) {
    // reaperd asks the engine for its data root (GET /info); it used to learn it only from a
    // json-file container's LogPath, which left a host of local-driver containers uncapped.
    Fixture f;
    reaper::ListOptions all;
    all.all = true;
    for (const auto& c : f.client.list_containers(all))  // this test process's own engine
        if (f.client.inspect(c.id).log_driver == "json-file") f.client.remove(c.id, {true, true});
    itest::Reaperd daemon("", "logs:\n  max_size: 1MiB\n");
    daemon.start();
    auto id = f.run(runaway, "s-daemon-local", reaper::LogConfig{"local", {}});
    BOOST_TEST(eventually([&] { return daemon.log_count("CONTAINER_ID=" + id) > 0; }));
    BOOST_TEST(eventually([&] { return daemon.log_count("ACTION=truncate") > 0; }));
    BOOST_TEST(daemon.log_count("not capped") == 0u);
    BOOST_TEST(f.running(id));
    BOOST_TEST(daemon.terminate() == 0);
}

// An engine that takes every connection and never answers: a unix socket listening, never
// accepting (the kernel completes the connects and buffers the requests). reaperd waits
// engine.request_timeout on each call, then retries with backoff: never ready.
class SilentEngine {
public:
    SilentEngine() {
        char pattern[] = "/tmp/reaperd-silent.XXXXXX";
        dir_ = ::mkdtemp(pattern);
        path_ = dir_ + "/docker.sock";
        fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_un address{};
        address.sun_family = AF_UNIX;
        std::snprintf(address.sun_path, sizeof address.sun_path, "%s", path_.c_str());
        BOOST_REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
        BOOST_REQUIRE(::listen(fd_, 128) == 0);
    }
    ~SilentEngine() {
        ::close(fd_);
        std::error_code ec;
        fs::remove_all(dir_, ec);
    }
    std::string address() const { return "unix://" + path_; }

private:
    std::string dir_, path_;
    int fd_ = -1;
};

// Issue 11: a restarted reaperd used to cap nothing until its first full list, which took
// 43 s behind the chaos run's slow proxy (a 2 MiB log reached 19.5 MiB meanwhile). Now the
// logs known from the last run are capped from its first second, the engine answering or not.
BOOST_AUTO_TEST_CASE(a_restarted_reaperd_caps_known_logs_before_the_engine_answers) {
    const std::string logs_yaml = "logs:\n  max_size: 1MiB\n  action: stop\n";
    Fixture f;
    // A paced writer, ~1.2 MB of json log per round, with rounds 0.1 s apart: past a 1 MiB
    // cap within a second. No pipe: `yes | head` hangs here once head exits (the writer
    // inherits SIGPIPE ignored and yes goes on), which is why burst_then_sleep writes once.
    auto id = f.run({"sh", "-c", "while :; do seq 1 20000; sleep 0.1; done"},
                    "s-restart", {}, {{logcap::max_size_label, "1MiB"}});
    auto c = f.describe(id);
    BOOST_TEST_REQUIRE(!c.log_path.empty());

    itest::Reaperd first("", logs_yaml);
    first.start();
    // Stopped at once: the first reaperd sees it, and its persisted list names it.
    BOOST_TEST_REQUIRE(eventually([&] { return !f.running(id); }), first.log_text());
    std::string persisted = first.dir + "/state/logcap.json";
    BOOST_TEST_REQUIRE(eventually([&] {
        std::ifstream in(persisted);
        std::stringstream text;
        text << in.rdbuf();
        return text.str().find(id) != std::string::npos;
    }));
    first.sigkill();

    SilentEngine silent;
    itest::Reaperd second("", logs_yaml, silent.address());
    fs::copy(first.dir + "/state", second.dir + "/state", fs::copy_options::recursive);
    second.start(false);
    f.client.start(id);  // writing again, and the engine tells the new reaperd nothing
    std::uint64_t max = 0;
    unsigned samples = 0;
    auto end = Clock::now() + 6s;
    for (auto next = Clock::now(); next < end; next += 100ms) {
        max = std::max(max, log_bytes(c));
        ++samples;
        std::this_thread::sleep_until(next);
    }
    BOOST_TEST_MESSAGE("restarted reaperd, engine silent: max log " << max << " bytes in " << samples
                                                                    << " samples (cap " << MiB << ")");
    // Each burst of the writer is ~1.2 MB of json at once: a cut that comes one burst late
    // leaves about the cap and a burst (2.15 MB seen at load ~8); uncapped ~70 MB in 6 s.
    BOOST_TEST(max <= 3 * MiB);
    BOOST_TEST(!second.ready());  // all along without a word from the engine
    BOOST_TEST(f.running(id));    // stop needs the engine: it was cut instead
    BOOST_TEST(second.log_count("capping 1 logs known from") == 1u);
    BOOST_TEST(second.log_count("CONTAINER_ID=" + id) >= 1u);
    BOOST_TEST(second.log_count("ACTION=truncate") >= 1u);
    BOOST_TEST(second.log_count("ACTION=stop") == 0u);
}
