// Log-size caps that hold against a runaway writer: LogCapper watches the log files of the
// containers the daemon feeds it and cuts them back (or stops, kills or removes a
// session-owned container) when a log reaches its cap or the logs pass their total budget.
//
// Detection: inotify on each log's directory (a rotation replaces the live file, so the
// file itself cannot be watched), an fstat of the live file on each event, rate-limited to
// one round of checks per check gap (Options::min_check_interval); and every logs.check_interval a full
// re-measure of every log, as a backstop for anything inotify missed. Deciding is pure
// (logcap_policy.hpp). Cuts happen on the watcher thread itself, so a cut comes within
// microseconds of the check; a cut punches out the oldest part of the live file and keeps the
// newest half of the cap (logcap_policy.hpp CutPlan, logcap_file.hpp LogFile::cut), and sizes
// are the bytes on disk, since a punched file's apparent size keeps growing; stop, kill and remove go through the guarded door
// (guard.hpp: a fresh inspect, ownership under the current sessions.labels, dry run) on a
// worker thread, so a slow engine never delays another container's cut. The watcher's parts:
// logcap_file.hpp (one log on disk: the live fd, its identity, the sizes, the cut),
// logcap_inotify.hpp (the watches, events turned into per-container marks), logcap_records.hpp
// (the records, the coalescing of cuts, the engine actions' table).
//
// From the first second: what the capper needs to cap a log (its path, driver, cap label,
// name, session, and the live file's device and inode) is kept in a small file in the state
// dir (Options::persist_path). start() loads it and caps those logs at once, before the
// daemon's first list, which through a slow engine took 43 s in the chaos run while a 2 MiB
// log reached 19.5 MiB. An entry whose file is gone, or is another file now (device and
// inode), is dropped quietly. Until the engine's word on a loaded container arrives (add()),
// only its file is cut: a stop, kill or remove needs the door's inspect, so a log past its
// cap is cut then whatever logs.action says.
#pragma once

#include "config.hpp"
#include "guard.hpp"
#include "log.hpp"
#include "logcap_file.hpp"
#include "logcap_policy.hpp"
#include "unique_fd.hpp"

#include <reaper/engine.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

namespace reaperd {

// One container as the daemon knows it from its inspect info.
struct ContainerLog {
    std::string id;
    std::string name;
    std::string session;  // "" = not session-owned
    std::string log_path;    // inspect's LogPath ("" before the first start, or no file)
    std::string log_driver;  // HostConfig.LogConfig.Type
    // The most the engine's own rotation lets the log hold (reaper::engine_rotation_bound of
    // its log options); nullopt when the engine does not rotate it.
    std::optional<std::uint64_t> rotation_bound_bytes;
    reaper::Labels labels;
    // GET /info DockerRootDir: locates the local driver's files. May be "": the capper then
    // learns the root from any json-file container's LogPath.
    std::string docker_root_dir;
};

// Monotonic counters since the capper was made, for metrics.
struct LogCapCounters {
    std::uint64_t log_bytes_dropped = 0;
    std::uint64_t truncations = 0;
    std::uint64_t stops = 0;
    std::uint64_t kills = 0;
    std::uint64_t removals = 0;
    std::uint64_t action_failures = 0;  // engine calls that failed (retried later)
    std::uint64_t check_rounds = 0;     // times the watcher woke and re-measured logs
    // Containers in scope whose log directory or live file could not be opened at two
    // backstop rounds in a row (EACCES, a data root in another mount namespace...): a gauge.
    std::uint64_t log_unopenable = 0;
    // Warnings given for those: one per container, however often its log comes and goes.
    std::uint64_t log_open_failures = 0;
    // Cuts that truncated a live file rather than punching it: its file system refused the
    // punch, or its apparent size neared the file system's largest file.
    std::uint64_t cut_fallbacks = 0;
};

class LogCapper {
public:
    struct Options {
        LogsConfig logs;
        // The gap between two rounds of inotify-driven checks, which is what bounds the
        // capper's CPU while a log is being written: a writer keeps an event pending all the
        // time, so each round is one wake-up. The gap adapts: half the time the fastest log
        // needs to reach its mark at its current rate, within [min, max]. A runaway just cut
        // back is checked every max (it is far from its mark), then more often as it nears
        // the mark. At ~70 MB/s a log grows ~140 KB in 2 ms and ~700 KB in 10 ms: the latter
        // is inside the 1 MiB margin of a 10 MiB cap even for a writer that bursts from quiet
        // (rate 0, mark = cap). bench/logcap_bench measures the wake-ups and CPU.
        std::chrono::milliseconds min_check_interval{2};
        std::chrono::milliseconds max_check_interval{10};
        // How long a stopped container gets to exit before the engine kills it.
        std::chrono::seconds stop_grace{5};
        // After a failed stop/kill/remove, wait this long before trying again.
        std::chrono::milliseconds retry_interval{std::chrono::seconds{5}};
        // Truncations of one container closer together than this are logged as one record
        // (ACTION_COUNT, summed LOG_BYTES_DROPPED): a runaway cut ten times a second would
        // otherwise flood the journal. The first cut is always logged at once.
        std::chrono::milliseconds log_coalesce{std::chrono::seconds{1}};
        // Where the capper keeps what it needs to cap logs before the engine answers
        // (<state.dir>/logcap.json); "" = nowhere. Rewritten (temp file, rename) at most
        // once per persist_interval while it changes, and at stop().
        std::string persist_path;
        std::chrono::milliseconds persist_interval{std::chrono::seconds{1}};
        // The watcher's only source of `now`: check gaps, backstop rounds, retry windows,
        // coalescing windows and persist intervals are all decided against it. A test passes
        // a clock it moves forward itself, then calls settle(), instead of sleeping through a
        // window. Called on the watcher thread (and in start(), before it runs).
        std::function<std::chrono::steady_clock::time_point()> clock = &std::chrono::steady_clock::now;
        // How cuts reach the file system; a test injects a refusal (EOPNOTSUPP) here.
        logcap::CutCalls cut_calls = logcap::system_cut_calls();
        LogSink sink = [](Priority p, std::string_view id, std::string_view message,
                          std::vector<LogField> fields) { log(p, id, message, std::move(fields)); };
    };

    // Does not start the thread. Throws std::system_error if inotify is unavailable.
    // Stops, kills and removes go through `guard`, the daemon's one door: its config (labels,
    // reaper.dry_run, as the last reload left them) decides, not what the capper cached when
    // the container was added. In a dry run the capper cuts nothing either.
    LogCapper(Guard& guard, Options options);
    // A capper alone (tools, benchmarks): a door of its own on `engine`, with the default
    // sessions.labels and no dry run; its refusals go to options.sink.
    LogCapper(EnginePort& engine, Options options);
    ~LogCapper();  // stop()
    LogCapper(const LogCapper&) = delete;
    LogCapper& operator=(const LogCapper&) = delete;

    // Loads Options::persist_path (a file that does not parse is ignored with a warning)
    // and starts capping the logs it names, then starts the threads.
    void start();
    // Stops the threads; an engine call in flight is waited for. Pending coalesced records
    // are written. Idempotent.
    void stop();

    // Thread-safe; take effect on the capper's thread within milliseconds.
    // add() starts watching a container, or refreshes what is known of it (call it again
    // when a container starts: the engine sets LogPath then). A container not in scope
    // (unowned with scope `sessions`) is ignored; one whose driver writes no file the capper
    // can cut is reported once (warning) and not capped; a cap label that does not parse
    // is reported once (warning) and the default applies. A container the capper stopped,
    // killed or removed is acted on again only after it is added again (started again). One
    // the door refuses as not owned (sessions.labels changed since it was added) is treated
    // as unowned from then on: with scope `all` it is only cut, with `sessions` left alone.
    void add(ContainerLog container);
    void remove(const std::string& id);
    void reconfigure(const LogsConfig& logs);
    // The engine's full list came: `listed` are the containers that exist. Those loaded at
    // start() and not in it are gone and are forgotten; those in it stay capped (cut only)
    // until add() brings their info, which may come tens of seconds later through a slow
    // engine (the daemon inspects each container after the list).
    void forget_unlisted(std::set<std::string> listed);

    // For tests that drive Options::clock: wakes the watcher and waits until it has run
    // every message posted before this call, then a round of checks at the clock's time
    // after them (events queued on the log directories read, even inside the check gap; the
    // backstop, flushes and persisting if they are due), and was left with nothing posted and
    // no stop, kill or remove in flight (the worker's answers come back as messages, so they
    // are in). Returns false if that did not happen within `limit` (real time), e.g. the
    // capper is not started. Thread-safe; the only thing it does that the watcher would not
    // have done on its own is to read the events inside the check gap.
    bool settle(std::chrono::milliseconds limit = std::chrono::seconds{30});

    LogCapCounters counters() const;
    // Containers whose logs are being watched right now.
    std::size_t watched() const { return watched_.load(); }

private:
    struct Loop;
    // A stop, kill or remove for the worker thread.
    struct Job {
        std::string id;
        LogAction action = LogAction::stop;
        logcap::CapReason reason = logcap::CapReason::own_cap;
        std::uint64_t log_bytes_before = 0;
    };

    LogCapper(std::unique_ptr<Guard> own_guard, Guard* shared_guard, Options options);
    void run_watcher();
    void run_worker();
    // Queues `message` for the watcher; returns its number (see settle()).
    std::uint64_t post(std::function<void(Loop&)> message);
    void submit(Job job);

    std::unique_ptr<Guard> own_guard_;  // only for a capper alone
    Guard& guard_;
    Options options_;
    std::unique_ptr<Loop> loop_;  // the watcher's state; touched only on its thread

    std::mutex inbox_mutex_;
    std::deque<std::function<void(Loop&)>> inbox_;
    reaper::detail::UniqueFd wake_fd_;  // eventfd: the inbox has messages, or stop was asked
    // For settle(), guarded by inbox_mutex_: messages posted so far, how many of them the
    // watcher had run when it was last left with nothing posted and nothing in flight, and
    // the jobs submitted whose answer the watcher has not run yet.
    std::uint64_t posted_ = 0;
    std::uint64_t settled_through_ = 0;
    std::uint64_t jobs_in_flight_ = 0;
    std::condition_variable settled_cv_;

    std::mutex jobs_mutex_;
    std::condition_variable jobs_cv_;
    std::deque<Job> jobs_;
    bool stopping_ = false;

    std::thread watcher_;
    std::thread worker_;
    std::atomic<std::size_t> watched_{0};

    struct AtomicCounters {
        std::atomic<std::uint64_t> log_bytes_dropped{0}, truncations{0}, stops{0}, kills{0},
            removals{0}, action_failures{0}, check_rounds{0}, log_unopenable{0}, log_open_failures{0},
            cut_fallbacks{0};
    } counters_;
};

}  // namespace reaperd
