// Does reaperd keep up under load? 200 sessions hold leases at once while about 2,000
// containers are created over 5 minutes and sessions keep turning over.
//
// Starts a private engine, measures what it can do here (create, create+start and
// force-remove rates with the same number of client threads the load uses), then starts
// reaperd on it as a child process (shipped defaults, but a temp state dir and control
// socket, and a short lease_grace) and plays the load:
//   - `sessions` slots, each holding one session with one lease over the control socket
//     (so `sessions` leases are open at all times). Container creations are spread evenly
//     over the run and dealt round-robin to the slots; each creation makes one container
//     labelled reaperd.session=<its slot's session> (busybox, network none); every other one
//     is also started (`sleep`) while fewer than `max_running` of ours run and the creation
//     is less than 1 s behind its schedule (an engine behind schedule skips starts, which
//     cost it most, so creations stay evenly spread; the count skipped is printed).
//   - a session makes 1 to 3 containers (random; fewer when each slot gets fewer than 10
//     creations), then ends at its slot's next turn and a new
//     session takes the slot: 45% by dropping the lease (reaped after lease_grace), 45% by an
//     explicit `end` (reaped at once), 10% by an `end` followed by one more container under
//     the ended id (the tombstone must catch it). 10% of turns also drop a session's lease
//     and take it again at once (within the grace: nothing may be reaped).
//   - sentinels that must survive: unlabelled containers (one running) and a session that
//     never takes a lease (unclaimed; left alone by default).
// Meanwhile it follows the engine's event stream (every destroy stamped with the moment it
// reached this process) and samples reaperd's RSS, fds, backlog and registry every second.
// A late container's latency runs from its creation, so it includes reaperd learning of it:
// reaperd registers it from its create event's labels; its log info is looked up off the
// event path (an inspect, which the engine answers for a starting container only once the
// start is done).
//
// After the load: waits (bounded) until reaperd has reaped every container of every ended
// session and its registry (`status`, as `reaperctl status --json` shows it) matches the
// engine's labelled containers, session by session; then checks that nothing was removed too
// early (a live session's container, or one inside its lease_grace), that every live
// session's container and every sentinel is still there, and every session's state; then
// drops the remaining leases and times the drain. Prints a table and a verdict.
//
// Usage: load_bench [--seconds N] [--sessions N] [--containers N] [--max-running N]
//                   [--threads N] [--lease-grace-ms N] [--settle-seconds N] [--seed N]
//                   [--history N] [--engine-percent N] [--max-engine-percent N]
// (defaults 300, 200, 2000, 300, 8, 1000, 120, 1, 0, 0, 0). --max-engine-percent N sizes a load
// asked for above N% of what the engine sustains down to N%, and says so. --engine-percent N makes the containers
// N% of what the engine was measured to sustain for the load's mix in the same run (instead of
// --containers): a load this machine's engine can carry. --history N first ends N sessions that
// never had a container, so the load runs against N tombstones, as reaperd would after hours
// of such a load (tombstones live sessions.tombstone_ttl, 24h by default). Exit status 0 when every check held,
// 1 when one failed, 2 when the bench could not run, 64 on a usage error.
#include "engine.hpp"
#include "reaperd_child.hpp"

#include <reaper/client.hpp>
#include <reaper/control.hpp>

#include <Poco/JSON/Array.h>
#include <Poco/JSON/Object.h>
#include <Poco/JSON/Parser.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

const std::string session_label = "reaperd.session";
// A creation this late (the engine behind schedule) is not started.
constexpr double max_lateness_to_start_ms = 1000;

double ms_between(Clock::time_point from, Clock::time_point to) {
    return std::chrono::duration<double, std::milli>(to - from).count();
}
double seconds_between(Clock::time_point from, Clock::time_point to) { return ms_between(from, to) / 1000; }

double percentile(std::vector<double> values, double p) {
    if (values.empty()) return NAN;
    std::sort(values.begin(), values.end());
    auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * double(values.size())));  // nearest rank
    return values[std::clamp<std::size_t>(rank, 1, values.size()) - 1];
}

// ---- /proc ---------------------------------------------------------------------------------

// utime + stime of a process so far (all its threads), in seconds.
double cpu_seconds(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto paren = text.rfind(')');
    if (paren == std::string::npos) throw std::runtime_error("cannot read /proc/" + std::to_string(pid) + "/stat");
    // Fields after the command name (which may hold spaces) start after the last ')'.
    std::istringstream rest(text.substr(paren + 2));
    std::vector<std::string> fields;
    for (std::string f; rest >> f;) fields.push_back(f);
    if (fields.size() < 13) throw std::runtime_error("short /proc/" + std::to_string(pid) + "/stat");
    // fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    return (std::stod(fields[11]) + std::stod(fields[12])) / double(::sysconf(_SC_CLK_TCK));
}

// A "Vm...:" line of /proc/PID/status in MB (the kernel's "kB" is KiB).
double vm_mb(pid_t pid, const std::string& key) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(in, line);)
        if (line.rfind(key + ":", 0) == 0) return double(std::stoull(line.substr(key.size() + 1))) * 1024 / 1e6;
    throw std::runtime_error(key + " not found for pid " + std::to_string(pid));
}

std::size_t fd_count(pid_t pid) {
    std::size_t n = 0;
    for ([[maybe_unused]] auto& entry : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) ++n;
    return n;
}

// ---- reaperd as a child process --------------------------------------------------------------

// Its files go in `dir` (inside the private engine's temp dir, which the harness removes
// however this process ends).
class Reaperd : public bench::ReaperdChild {
public:
    Reaperd(const std::string& engine_address, std::string dir, std::chrono::milliseconds lease_grace)
        : ReaperdChild(engine_address, std::move(dir),
                       "sessions:\n  lease_grace: " + std::to_string(lease_grace.count()) + "ms\n") {}

    // The size of its state file now, in bytes (0 if there is none).
    std::uintmax_t state_bytes() const {
        std::error_code ec;
        auto n = fs::file_size(dir() + "/state/state.json", ec);
        return ec ? 0 : n;
    }
};

// ---- the engine's event stream --------------------------------------------------------------

// Every container event of the engine: counted by action, destroys stamped with the moment
// they reached this process, and our running containers followed (start .. die) by label.
class EventRecorder {
public:
    explicit EventRecorder(reaper::Client& engine) {
        reaper::EventsOptions options;
        options.filters = {{"type", {"container"}}};
        stream_ = engine.events(options);
        thread_ = std::thread([this] { run(); });
    }
    ~EventRecorder() {
        stream_->cancel();
        thread_.join();
    }

    std::size_t running() const {
        std::lock_guard lock(mutex_);
        return running_.size();
    }
    std::size_t peak_running() const {
        std::lock_guard lock(mutex_);
        return peak_running_;
    }
    std::size_t peak_existing() const {
        std::lock_guard lock(mutex_);
        return peak_existing_;
    }
    std::map<std::string, Clock::time_point> destroyed() const {
        std::lock_guard lock(mutex_);
        return destroyed_;
    }
    std::map<std::string, std::size_t> counts() const {
        std::lock_guard lock(mutex_);
        return counts_;
    }
    std::optional<std::string> failure() const {
        std::lock_guard lock(mutex_);
        return failure_;
    }

private:
    void run() {
        try {
            while (auto event = stream_->next()) {
                auto now = Clock::now();
                std::lock_guard lock(mutex_);
                ++counts_[event->action];
                bool ours = event->attributes.count(session_label) > 0;
                if (event->action == "destroy") destroyed_.emplace(event->id, now);
                if (!ours) continue;
                if (event->action == "create") existing_.insert(event->id);
                else if (event->action == "destroy") existing_.erase(event->id);
                else if (event->action == "start") running_.insert(event->id);
                else if (event->action == "die") running_.erase(event->id);
                peak_existing_ = std::max(peak_existing_, existing_.size());
                peak_running_ = std::max(peak_running_, running_.size());
            }
        } catch (const std::exception& e) {
            std::lock_guard lock(mutex_);
            failure_ = e.what();
        }
    }

    std::unique_ptr<reaper::EventStream> stream_;
    mutable std::mutex mutex_;
    std::map<std::string, std::size_t> counts_;
    std::map<std::string, Clock::time_point> destroyed_;
    std::set<std::string> existing_;
    std::set<std::string> running_;
    std::size_t peak_existing_ = 0;
    std::size_t peak_running_ = 0;
    std::optional<std::string> failure_;
    std::thread thread_;
};

// ---- options ---------------------------------------------------------------------------------

struct Options {
    int seconds = 300;
    std::size_t sessions = 200;
    std::size_t containers = 2000;
    std::size_t max_running = 300;
    unsigned threads = 8;
    std::chrono::milliseconds lease_grace{1000};
    int settle_seconds = 120;
    unsigned seed = 1;
    std::size_t history = 0;  // ended sessions seeded before the load, as after hours of use
    // When set, the containers are this share of what the engine was measured to sustain for
    // the load's mix in this run (replacing `containers`): issue 11's "or the most this
    // machine's engine sustains". 0: `containers` as given.
    unsigned engine_percent = 0;
    // When set, at most this share of what the engine was measured to sustain: a load asked
    // for above it is sized down to it, saying so, so that the engine keeps headroom and a
    // slow minute of the machine's is not read as reaperd's lag (issue 23: at 94%, one run's
    // engine stopped answering for 30 s and more). 0: no cap.
    unsigned max_engine_percent = 0;
};

Options parse_options(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        auto value = [&](long min) -> long {
            if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a number");
            char* end = nullptr;
            long v = std::strtol(argv[++i], &end, 10);
            if (*end != '\0' || v < min)
                throw std::invalid_argument(arg + " needs a whole number >= " + std::to_string(min) + ", not " + argv[i]);
            return v;
        };
        if (arg == "--seconds") o.seconds = int(value(1));
        else if (arg == "--sessions") o.sessions = std::size_t(value(1));
        else if (arg == "--containers") o.containers = std::size_t(value(1));
        else if (arg == "--max-running") o.max_running = std::size_t(value(0));
        else if (arg == "--threads") o.threads = unsigned(value(1));
        else if (arg == "--lease-grace-ms") o.lease_grace = std::chrono::milliseconds(value(0));
        else if (arg == "--settle-seconds") o.settle_seconds = int(value(1));
        else if (arg == "--seed") o.seed = unsigned(value(0));
        else if (arg == "--history") o.history = std::size_t(value(0));
        else if (arg == "--engine-percent") {
            o.engine_percent = unsigned(value(1));
            if (o.engine_percent > 100) throw std::invalid_argument("--engine-percent is at most 100");
        }
        else if (arg == "--max-engine-percent") {
            o.max_engine_percent = unsigned(value(1));
            if (o.max_engine_percent > 100) throw std::invalid_argument("--max-engine-percent is at most 100");
        }
        else throw std::invalid_argument("unknown argument " + arg);
    }
    return o;
}

// ---- engine capacity, measured before reaperd starts ------------------------------------------

struct Capacity {
    double create_per_s = 0;        // create only
    double create_start_per_s = 0;  // create, then start
    double remove_per_s = 0;        // force-remove of running containers
    std::vector<double> remove_ms;  // each of those calls
};

reaper::ContainerSpec sleeper(const std::string& prefix, reaper::Labels labels) {
    reaper::ContainerSpec spec;
    spec.name = reaper::test::unique_name(prefix);
    spec.image = reaper::test::PrivateEngine::image;
    spec.cmd = {"sleep", "3600"};
    spec.labels = std::move(labels);
    return spec;
}

// Runs `work(i)` for i in [0, n) on `threads` threads, each with its own engine client;
// returns the wall time in seconds.
double in_parallel(const reaper::ClientOptions& client_options, unsigned threads, std::size_t n,
                   const std::function<void(reaper::Client&, std::size_t)>& work) {
    std::atomic<std::size_t> next{0};
    std::mutex error_mutex;
    std::string error;
    auto t0 = Clock::now();
    std::vector<std::thread> workers;
    for (unsigned w = 0; w < threads; ++w) {
        workers.emplace_back([&] {
            reaper::Client engine(client_options);
            for (std::size_t i; (i = next++) < n;) {
                try {
                    work(engine, i);
                } catch (const std::exception& e) {
                    std::lock_guard lock(error_mutex);
                    error = e.what();
                }
            }
        });
    }
    for (auto& w : workers) w.join();
    if (!error.empty()) throw std::runtime_error("measuring the engine: " + error);
    return seconds_between(t0, Clock::now());
}

Capacity measure_capacity(const reaper::ClientOptions& client_options, unsigned threads) {
    constexpr std::size_t n = 24;
    Capacity c;
    std::vector<std::string> created(n), started(n);
    c.create_per_s = double(n) / in_parallel(client_options, threads, n, [&](reaper::Client& e, std::size_t i) {
        created[i] = e.create(sleeper("probe", {}));
    });
    c.create_start_per_s = double(n) / in_parallel(client_options, threads, n, [&](reaper::Client& e, std::size_t i) {
        started[i] = e.create(sleeper("probe", {}));
        e.start(started[i]);
    });
    in_parallel(client_options, threads, n, [&](reaper::Client& e, std::size_t i) {
        e.remove(created[i], {.force = true, .volumes = true});
    });
    c.remove_ms.resize(n);
    c.remove_per_s = double(n) / in_parallel(client_options, threads, n, [&](reaper::Client& e, std::size_t i) {
        auto t0 = Clock::now();
        e.remove(started[i], {.force = true, .volumes = true});
        c.remove_ms[i] = ms_between(t0, Clock::now());
    });
    return c;
}

// ---- the load ----------------------------------------------------------------------------------

enum class EndMode { lease_drop, end, end_then_late };
const char* to_string(EndMode m) {
    switch (m) {
        case EndMode::lease_drop: return "lease dropped";
        case EndMode::end: return "explicit end";
        case EndMode::end_then_late: return "end + late container";
    }
    return "?";
}

struct SessionRecord {
    bool ended = false;
    EndMode mode = EndMode::lease_drop;
    // When reaperd may reap its containers: the `end` sent, or the lease closed + lease_grace.
    Clock::time_point due{};
    // Lease drops and retakes within the grace, each [closed, taken again] (never reapable).
    std::vector<std::pair<Clock::time_point, Clock::time_point>> reconnects;
};

struct ContainerRecord {
    std::string session;
    bool started = false;
    bool late = false;  // created under an already ended session
    Clock::time_point created{};
};

// What the load did, for the checks at the end. Shared by the worker threads.
class Book {
public:
    void session_started(const std::string& id) {
        std::lock_guard lock(mutex_);
        sessions_[id];
    }
    void session_ended(const std::string& id, EndMode mode, Clock::time_point due) {
        std::lock_guard lock(mutex_);
        auto& s = sessions_[id];
        s.ended = true;
        s.mode = mode;
        s.due = due;
    }
    void reconnected(const std::string& id, Clock::time_point closed, Clock::time_point retaken) {
        std::lock_guard lock(mutex_);
        sessions_[id].reconnects.emplace_back(closed, retaken);
    }
    void container(const std::string& id, ContainerRecord record) {
        std::lock_guard lock(mutex_);
        containers_[id] = std::move(record);
    }
    void error(const std::string& what) {
        std::lock_guard lock(mutex_);
        if (errors_.size() < 5) errors_.push_back(what);
        ++error_count_;
    }
    void start_skipped() {
        std::lock_guard lock(mutex_);
        ++starts_skipped_;
    }
    std::size_t starts_skipped() const {
        std::lock_guard lock(mutex_);
        return starts_skipped_;
    }
    void lateness(double ms) {
        std::lock_guard lock(mutex_);
        lateness_ms_.push_back(ms);
    }

    std::map<std::string, SessionRecord> sessions() const {
        std::lock_guard lock(mutex_);
        return sessions_;
    }
    std::map<std::string, ContainerRecord> containers() const {
        std::lock_guard lock(mutex_);
        return containers_;
    }
    std::vector<double> lateness_ms() const {
        std::lock_guard lock(mutex_);
        return lateness_ms_;
    }
    std::size_t error_count() const {
        std::lock_guard lock(mutex_);
        return error_count_;
    }
    std::vector<std::string> errors() const {
        std::lock_guard lock(mutex_);
        return errors_;
    }

private:
    mutable std::mutex mutex_;
    std::map<std::string, SessionRecord> sessions_;
    std::map<std::string, ContainerRecord> containers_;
    std::vector<double> lateness_ms_;
    std::vector<std::string> errors_;
    std::size_t error_count_ = 0;
    std::size_t starts_skipped_ = 0;
};

// One of the `sessions` places: the session it holds now, its lease, and how many more
// containers that session makes before it ends.
struct Slot {
    std::mutex mutex;
    std::string session;
    std::unique_ptr<reaper::control::Lease> lease;
    int remaining = 0;
    unsigned generation = 0;
    std::mt19937 random;
};

class Load {
public:
    Load(const Options& options, const reaper::ClientOptions& client_options, const Reaperd& reaperd,
         const EventRecorder& events, Book& book)
        : options_(options), client_options_(client_options), reaperd_(reaperd), events_(events), book_(book),
          slots_(options.sessions) {
        for (std::size_t i = 0; i < slots_.size(); ++i) slots_[i].random.seed(options.seed * 100003u + unsigned(i));
        // Each slot gets containers/sessions creations; sessions of 1..max (mean (1+max)/2)
        // turn each slot over about 5 times, so a slot holds one or two containers at a time:
        // 1..3 for the default 2,000 over 200.
        double per_slot = double(options.containers) / double(options.sessions);
        max_containers_per_session_ = std::max(1, int(std::lround(0.4 * per_slot - 1)));
    }

    // Opens every slot's first session and its lease (all leases are open before the load).
    void open_sessions() {
        auto control = reaperd_.control();
        for (std::size_t i = 0; i < slots_.size(); ++i) new_session(i, control);
    }

    // Plays the creations evenly over the run on the worker threads; returns when done.
    void run() {
        start_ = Clock::now();
        std::vector<std::thread> workers;
        for (unsigned t = 0; t < options_.threads; ++t) workers.emplace_back([this] { work(); });
        for (auto& w : workers) w.join();
    }

    // The sessions still leased, by slot.
    std::vector<std::string> live_sessions() {
        std::vector<std::string> ids;
        for (auto& slot : slots_) {
            std::lock_guard lock(slot.mutex);
            if (slot.lease) ids.push_back(slot.session);
        }
        return ids;
    }

    // Drops every lease left (the drain); returns when the last one was closed.
    Clock::time_point drop_all_leases() {
        Clock::time_point last{};
        for (auto& slot : slots_) {
            std::lock_guard lock(slot.mutex);
            if (!slot.lease) continue;
            last = Clock::now();
            slot.lease->release();
            slot.lease.reset();
            book_.session_ended(slot.session, EndMode::lease_drop, last + options_.lease_grace);
        }
        return last;
    }

private:
    // Takes the next creation, waits for its moment, does it; until all are done. A failed
    // turn is counted (and fails the run), the next goes on.
    void work() {
        std::unique_ptr<reaper::Client> engine;
        try {
            engine = std::make_unique<reaper::Client>(client_options_);
        } catch (const std::exception& e) {
            book_.error(std::string("engine client: ") + e.what());
            return;
        }
        auto control = reaperd_.control();
        const double spacing_s = double(options_.seconds) / double(options_.containers);
        for (std::size_t j; (j = next_++) < options_.containers;) {
            auto due = start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(double(j) * spacing_s));
            std::this_thread::sleep_until(due);
            double late_ms = ms_between(due, Clock::now());
            book_.lateness(late_ms);
            try {
                turn(j % slots_.size(), j, late_ms, *engine, control);
            } catch (const std::exception& e) {
                book_.error(e.what());
            }
        }
    }

    void new_session(std::size_t index, reaper::control::ControlClient& control) {
        Slot& slot = slots_[index];
        slot.session = "load-" + std::to_string(index) + "-" + std::to_string(slot.generation++);
        slot.remaining = std::uniform_int_distribution<int>(1, max_containers_per_session_)(slot.random);
        book_.session_started(slot.session);
        slot.lease = control.lease(slot.session);
    }

    // One container creation for slot `index`: ends its session first if that one made all
    // its containers, and sometimes drops and retakes the lease.
    void turn(std::size_t index, std::size_t j, double late_ms, reaper::Client& engine,
              reaper::control::ControlClient& control) {
        Slot& slot = slots_[index];
        std::lock_guard lock(slot.mutex);
        if (slot.lease && slot.remaining <= 0) end_session(slot, engine, control);
        if (!slot.lease) new_session(index, control);
        std::uniform_real_distribution<double> uniform(0, 1);
        if (uniform(slot.random) < 0.1) {
            auto closed = Clock::now();
            slot.lease->release();
            slot.lease = control.lease(slot.session);
            book_.reconnected(slot.session, closed, Clock::now());
        }
        // Starting is what costs the engine most (a shim and a process): when it has fallen
        // behind the schedule, creations go on without starts so they stay evenly spread.
        bool start = j % 2 == 0 && events_.running() < options_.max_running;
        if (start && late_ms > max_lateness_to_start_ms) {
            start = false;
            book_.start_skipped();
        }
        create(engine, slot.session, start, false);
        --slot.remaining;
    }

    void end_session(Slot& slot, reaper::Client& engine, reaper::control::ControlClient& control) {
        double pick = std::uniform_real_distribution<double>(0, 1)(slot.random);
        EndMode mode = pick < 0.45 ? EndMode::lease_drop : pick < 0.9 ? EndMode::end : EndMode::end_then_late;
        auto now = Clock::now();
        if (mode == EndMode::lease_drop) {
            book_.session_ended(slot.session, mode, now + options_.lease_grace);
            slot.lease->release();
        } else {
            book_.session_ended(slot.session, mode, now);
            control.end(slot.session);
            slot.lease->release();
            if (mode == EndMode::end_then_late) create(engine, slot.session, false, true);
        }
        slot.lease.reset();
    }

    void create(reaper::Client& engine, const std::string& session, bool start, bool late) {
        ContainerRecord record;
        record.session = session;
        record.late = late;
        auto id = engine.create(sleeper("load", {{session_label, session}}));
        record.created = Clock::now();
        book_.container(id, record);
        if (start) {
            engine.start(id);
            record.started = true;
            book_.container(id, record);
        }
    }

    const Options& options_;
    const reaper::ClientOptions& client_options_;
    const Reaperd& reaperd_;
    const EventRecorder& events_;
    Book& book_;
    std::vector<Slot> slots_;
    int max_containers_per_session_ = 1;
    std::atomic<std::size_t> next_{0};
    Clock::time_point start_{};
};

// ---- sampling reaperd ----------------------------------------------------------------------

// reaperd_<name> from its Prometheus text (0 if missing).
double metric(const std::string& text, const std::string& name) {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);)
        if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
    return 0;
}


struct Sample {
    double rss_mb = 0;
    std::size_t fds = 0;
};

// Samples reaperd's RSS and fds every second, its backlog (pending reaps, from `metrics`,
// which costs reaperd far less than `status`) every 5 s, and calls `progress` every 30 s
// until progress_done(). Also times one engine inspect of `probe` a second: reaperd's
// watcher makes such calls (on 4 threads, off the event path) for the log info of each
// container it caps; an inspect the engine does not answer within the request timeout is
// the engine's own stall, counted. With the backlog it reads whether reaperd found the
// engine slow (reaperd_engine_slow) and its removal timeouts so far.
class Sampler {
public:
    Sampler(const Reaperd& reaperd, const reaper::ClientOptions& client_options, std::string probe,
            std::function<void()> progress)
        : reaperd_(reaperd), engine_(client_options), probe_(std::move(probe)), progress_(std::move(progress)) {
        thread_ = std::thread([this] { run(); });
    }
    ~Sampler() {
        {
            std::lock_guard lock(mutex_);
            stopping_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    double peak_rss_mb() const {
        std::lock_guard lock(mutex_);
        return peak_rss_mb_;
    }
    std::size_t peak_fds() const {
        std::lock_guard lock(mutex_);
        return peak_fds_;
    }
    std::size_t peak_pending() const {
        std::lock_guard lock(mutex_);
        return peak_pending_;
    }
    double slowest_metrics_ms() const {
        std::lock_guard lock(mutex_);
        return slowest_metrics_ms_;
    }
    void progress_done() { progress_done_ = true; }
    std::vector<double> inspect_ms() const {
        std::lock_guard lock(mutex_);
        return inspect_ms_;
    }
    std::size_t inspect_timeouts() const {
        std::lock_guard lock(mutex_);
        return inspect_timeouts_;
    }
    // Metrics samples (every 5 s) in which reaperd said the engine was slow, of all taken.
    std::pair<std::size_t, std::size_t> slow_samples() const {
        std::lock_guard lock(mutex_);
        return {slow_samples_, metrics_samples_};
    }

private:
    void run() {
        for (unsigned tick = 0;; ++tick) {
            try {
                auto t_inspect = Clock::now();
                try {
                    engine_.inspect(probe_);
                } catch (const reaper::Timeout&) {
                    std::lock_guard lock(mutex_);
                    if (!progress_done_) ++inspect_timeouts_;
                }
                double inspect_ms = ms_between(t_inspect, Clock::now());
                double rss = vm_mb(reaperd_.pid(), "VmRSS");
                std::size_t fds = fd_count(reaperd_.pid());
                std::optional<std::size_t> pending;
                bool slow = false;
                double metrics_ms = 0;
                if (tick % 5 == 0) {
                    auto t0 = Clock::now();
                    const auto text = reaperd_.control().metrics_text();
                    metrics_ms = ms_between(t0, Clock::now());
                    pending = std::size_t(metric(text, "reaperd_pending_reaps"));
                    slow = metric(text, "reaperd_engine_slow") > 0;
                }
                std::lock_guard lock(mutex_);
                if (!progress_done_) inspect_ms_.push_back(inspect_ms);
                peak_rss_mb_ = std::max(peak_rss_mb_, rss);
                peak_fds_ = std::max(peak_fds_, fds);
                if (pending) {
                    peak_pending_ = std::max(peak_pending_, *pending);
                    if (!progress_done_) {
                        ++metrics_samples_;
                        if (slow) ++slow_samples_;
                    }
                }
                slowest_metrics_ms_ = std::max(slowest_metrics_ms_, metrics_ms);
            } catch (const std::exception&) {
                // reaperd gone: the main thread reports that.
            }
            if (tick > 0 && tick % 30 == 0 && !progress_done_) progress_();
            std::unique_lock lock(mutex_);
            if (cv_.wait_for(lock, 1s, [this] { return stopping_; })) return;
        }
    }

    const Reaperd& reaperd_;
    reaper::Client engine_;
    std::string probe_;
    std::function<void()> progress_;
    std::vector<double> inspect_ms_;
    std::size_t inspect_timeouts_ = 0;
    std::size_t slow_samples_ = 0;
    std::size_t metrics_samples_ = 0;
    mutable std::mutex mutex_;
    std::condition_variable cv_;
    bool stopping_ = false;
    double peak_rss_mb_ = 0;
    std::size_t peak_fds_ = 0;
    std::size_t peak_pending_ = 0;
    double slowest_metrics_ms_ = 0;
    std::atomic<bool> progress_done_{false};
    std::thread thread_;
};

// ---- checks ---------------------------------------------------------------------------------

// The engine's session-owned containers: id -> session.
std::map<std::string, std::string> labelled_containers(reaper::Client& engine) {
    reaper::ListOptions options;
    options.all = true;
    options.filters = {{"label", {session_label}}};
    std::map<std::string, std::string> out;
    for (const auto& c : engine.list_containers(options)) out[c.id] = c.labels.at(session_label);
    return out;
}

// The engine's own force-remove under the load: every 3 s, creates and starts an unlabelled
// container (no session: reaperd leaves it alone) and times the force-remove of it, as
// reaperd's reaps do of theirs. The calibration before the load times the same call on an
// idle engine, where it took a third of what it did under the load at 5x (172 vs 843 ms
// median), so the ends' latency is compared with the engine's under the same load.
class RemoveProbe {
public:
    explicit RemoveProbe(const reaper::ClientOptions& client_options) : engine_(client_options) {
        thread_ = std::thread([this] { run(); });
    }
    ~RemoveProbe() { stop(); }
    void stop() {
        {
            std::lock_guard lock(mutex_);
            stopping_ = true;
        }
        cv_.notify_all();
        if (thread_.joinable()) thread_.join();
    }
    std::vector<double> remove_ms() const {
        std::lock_guard lock(mutex_);
        return remove_ms_;
    }
    // Probe calls (create, start or remove) the engine did not answer within the timeout.
    std::size_t timeouts() const {
        std::lock_guard lock(mutex_);
        return timeouts_;
    }

private:
    void run() {
        for (;;) {
            {
                std::unique_lock lock(mutex_);
                if (cv_.wait_for(lock, 3s, [this] { return stopping_; })) return;
            }
            try {
                auto id = engine_.create(sleeper("remove-probe", {}));
                engine_.start(id);
                auto t0 = Clock::now();
                engine_.remove(id, {.force = true, .volumes = true});
                double ms = ms_between(t0, Clock::now());
                std::lock_guard lock(mutex_);
                remove_ms_.push_back(ms);
            } catch (const reaper::Timeout&) {
                // An engine too busy to answer: that sample is missing, the stall counted.
                std::lock_guard lock(mutex_);
                ++timeouts_;
            } catch (const std::exception&) {
                // Another failure: that sample is missing, the load goes on.
            }
        }
    }

    reaper::Client engine_;
    std::vector<double> remove_ms_;
    std::size_t timeouts_ = 0;
    mutable std::mutex mutex_;
    std::condition_variable cv_;
    bool stopping_ = false;
    std::thread thread_;
};

struct RegistryView {
    std::size_t tracked = 0;
    std::size_t pending = 0;
    std::map<std::string, std::size_t> containers_by_session;  // sessions with containers
    std::map<std::string, std::string> state_by_session;
    std::map<std::string, std::size_t> leases_by_session;
};

RegistryView registry_view(const Reaperd& reaperd, const reaper::control::StatusQuery& query = {false, 1'000'000}) {
    auto status = reaperd.status(query);
    RegistryView view;
    view.tracked = status->getValue<std::size_t>("tracked_containers");
    view.pending = status->getValue<std::size_t>("pending_reaps");
    auto sessions = status->getArray("sessions");
    for (std::size_t i = 0; i < sessions->size(); ++i) {
        auto s = sessions->getObject(unsigned(i));
        auto id = s->getValue<std::string>("id");
        if (auto n = s->getValue<std::size_t>("containers")) view.containers_by_session[id] = n;
        view.state_by_session[id] = s->getValue<std::string>("state");
        view.leases_by_session[id] = s->getValue<std::size_t>("leases");
    }
    return view;
}

// Differences between reaperd's registry and the engine, and leftovers of ended sessions;
// empty when everything agrees.
std::vector<std::string> compare(const RegistryView& view, const std::map<std::string, std::string>& engine_has,
                                 const std::map<std::string, SessionRecord>& sessions) {
    std::vector<std::string> problems;
    std::map<std::string, std::size_t> engine_by_session;
    for (const auto& [id, session] : engine_has) {
        ++engine_by_session[session];
        auto s = sessions.find(session);
        if (s != sessions.end() && s->second.ended)
            problems.push_back("container " + id.substr(0, 12) + " of ended session " + session + " is still on the engine");
    }
    if (view.tracked != engine_has.size())
        problems.push_back("reaperd tracks " + std::to_string(view.tracked) + " containers, the engine has " +
                           std::to_string(engine_has.size()) + " labelled ones");
    std::set<std::string> all;
    for (const auto& [s, n] : engine_by_session) all.insert(s);
    for (const auto& [s, n] : view.containers_by_session) all.insert(s);
    for (const auto& s : all) {
        auto e = engine_by_session.count(s) ? engine_by_session.at(s) : 0;
        auto r = view.containers_by_session.count(s) ? view.containers_by_session.at(s) : 0;
        if (e != r)
            problems.push_back("session " + s + ": reaperd counts " + std::to_string(r) + " containers, the engine has " +
                               std::to_string(e));
    }
    if (view.pending != 0) problems.push_back(std::to_string(view.pending) + " reaps still pending in reaperd");
    for (const auto& [id, record] : sessions) {
        auto it = view.state_by_session.find(id);
        std::string state = it == view.state_by_session.end() ? "(not listed)" : it->second;
        const char* want = record.ended ? "ended" : "leased";
        if (state != want) problems.push_back("session " + id + " is " + state + " in reaperd, expected " + want);
    }
    return problems;
}

// Containers removed when they must not have been: a live session's (never ended, or
// removed before its end was due) or one removed between a lease drop and its retake.
std::vector<std::string> early_removals(const std::map<std::string, ContainerRecord>& containers,
                                        const std::map<std::string, SessionRecord>& sessions,
                                        const std::map<std::string, Clock::time_point>& destroyed) {
    constexpr auto slack = 10ms;  // clock granularity between reaperd's deadline and ours
    std::vector<std::string> problems;
    for (const auto& [id, c] : containers) {
        auto d = destroyed.find(id);
        if (d == destroyed.end()) continue;
        const auto& s = sessions.at(c.session);
        if (!s.ended) {
            problems.push_back("container " + id.substr(0, 12) + " of live session " + c.session + " was removed");
        } else if (d->second + slack < s.due) {
            problems.push_back("container " + id.substr(0, 12) + " of session " + c.session + " (" + to_string(s.mode) +
                               ") was removed " + std::to_string(int(ms_between(d->second, s.due))) +
                               " ms before its end was due");
        }
    }
    return problems;
}

// ---- the report -------------------------------------------------------------------------------

struct Latencies {
    std::vector<double> end_ms, drop_ms, late_ms;
};

// Reap latencies of the load's ended sessions: from the moment the end was due to the
// container's destroy event here (late containers: from their creation).
Latencies reap_latencies(const std::map<std::string, ContainerRecord>& containers,
                         const std::map<std::string, SessionRecord>& sessions,
                         const std::map<std::string, Clock::time_point>& destroyed,
                         const std::set<std::string>& drained_sessions) {
    Latencies l;
    for (const auto& [id, c] : containers) {
        auto d = destroyed.find(id);
        const auto& s = sessions.at(c.session);
        if (d == destroyed.end() || !s.ended || drained_sessions.count(c.session)) continue;
        if (c.late) l.late_ms.push_back(ms_between(c.created, d->second));
        else if (s.mode == EndMode::lease_drop) l.drop_ms.push_back(ms_between(s.due, d->second));
        else l.end_ms.push_back(ms_between(s.due, d->second));
    }
    return l;
}

void latency_row(const char* what, const std::vector<double>& ms) {
    if (ms.empty()) {
        std::printf("  %-44s %6s\n", what, "none");
        return;
    }
    std::printf("  %-44s %6zu %8.0f %8.0f %8.0f %8.0f\n", what, ms.size(), percentile(ms, 50), percentile(ms, 90),
                percentile(ms, 99), percentile(ms, 100));
}

std::pair<std::size_t, std::size_t> log_warnings_errors(const std::string& log) {
    std::size_t warnings = 0, errors = 0;
    std::istringstream in(log);
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("<4>", 0) == 0) ++warnings;
        else if (line.size() > 2 && line[0] == '<' && line[1] <= '3' && line[2] == '>') ++errors;
    }
    return {warnings, errors};
}

// Waits until `done` holds, polling every `interval`; true if it did within `limit`.
bool poll(std::chrono::seconds limit, const std::function<bool()>& done,
          std::chrono::milliseconds interval = std::chrono::seconds(1)) {
    auto deadline = Clock::now() + limit;
    for (;;) {
        try {
            if (done()) return true;
        } catch (const std::exception&) {
            // reaperd busy or not answering: try again.
        }
        if (Clock::now() > deadline) return false;
        std::this_thread::sleep_for(interval);
    }
}

}  // namespace

int main(int argc, char** argv) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows through a pipe
    Options options;
    try {
        options = parse_options(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr,
                     "%s\nusage: %s [--seconds N] [--sessions N] [--containers N] [--max-running N] [--threads N]\n"
                     "       [--lease-grace-ms N] [--settle-seconds N] [--seed N] [--history N] [--engine-percent N]\n"
                     "       [--max-engine-percent N]\n",
                     e.what(), argv[0]);
        return 64;
    }
    std::vector<std::string> failures;
    auto fail = [&](const std::string& what) {
        failures.push_back(what);
        std::printf("  FAILED: %s\n", what.c_str());
    };
    try {
        auto wall0 = Clock::now();
        auto& private_engine = reaper::test::engine();
        auto client_options = private_engine.client_options();
        reaper::Client engine(client_options);
        auto version = engine.version();
        pid_t dockerd = 0;
        std::ifstream(private_engine.dir() + "/docker.pid") >> dockerd;

        std::printf("engine %s (API %s, vfs, private); %u cores, load average now:", version.version.c_str(),
                    version.api_version.c_str(), std::thread::hardware_concurrency());
        double load[3] = {0, 0, 0};
        if (::getloadavg(load, 3) == 3) std::printf(" %.2f %.2f %.2f", load[0], load[1], load[2]);
        std::printf("\n\nmeasuring the engine with %u client threads (24 containers each way)...\n", options.threads);
        auto capacity = measure_capacity(client_options, options.threads);
        // Half the creations are also started: the load's mix costs, per container, the mean
        // of a create and a create+start, plus a force-remove.
        double mix_per_s = 1 / (0.5 / capacity.create_per_s + 0.5 / capacity.create_start_per_s +
                                1 / capacity.remove_per_s);
        if (options.engine_percent > 0) {
            options.containers = std::max<std::size_t>(
                1, std::size_t(std::llround(mix_per_s * options.engine_percent / 100 * options.seconds)));
            std::printf("  --engine-percent %u: %zu containers, %u%% of what this engine sustains for the mix\n",
                        options.engine_percent, options.containers, options.engine_percent);
        }
        if (options.max_engine_percent > 0) {
            const auto most = std::max<std::size_t>(
                1, std::size_t(std::llround(mix_per_s * options.max_engine_percent / 100 * options.seconds)));
            if (options.containers > most) {
                std::printf("  SIZED DOWN: %zu containers asked for are %.0f%% of what this engine sustains now; "
                            "the load makes %zu (--max-engine-percent %u), so that a lag is reaperd's, not the "
                            "engine's\n",
                            options.containers, 100 * double(options.containers) / options.seconds / mix_per_s, most,
                            options.max_engine_percent);
                options.containers = most;
            }
        }
        double rate = double(options.containers) / options.seconds;
        std::printf("  create %.1f/s, create+start %.1f/s, force-remove (running) %.1f/s (each call: median %.0f ms)\n",
                    capacity.create_per_s, capacity.create_start_per_s, capacity.remove_per_s,
                    percentile(capacity.remove_ms, 50));
        std::printf("  the load: %zu creations in %d s = %.1f/s, half started, each removed again: %.0f%% of the "
                    "%.1f/s the engine manages for that mix\n",
                    options.containers, options.seconds, rate, 100 * rate / mix_per_s, mix_per_s);
        if (rate > 0.8 * mix_per_s)
            std::printf("  WARNING: that leaves the engine little headroom; a lag here is the engine's, not reaperd's\n");

        EventRecorder events(engine);
        Reaperd reaperd(private_engine.address(), private_engine.dir() + "/reaperd-load", options.lease_grace);
        std::printf("\nreaperd pid %d, lease_grace %lld ms, other settings default (concurrency 16, resync 60 s, "
                    "log caps on)\n",
                    int(reaperd.pid()), static_cast<long long>(options.lease_grace.count()));

        // reaperd's status (as `reaperctl status --json`), timed: it is built on reaperd's main loop.
        double slowest_status_ms = 0;
        auto view = [&] {
            auto t = Clock::now();
            auto v = registry_view(reaperd);
            slowest_status_ms = std::max(slowest_status_ms, ms_between(t, Clock::now()));
            return v;
        };

        // Sentinels: never to be touched.
        std::vector<std::string> sentinels;
        sentinels.push_back(engine.create(sleeper("sentinel", {})));
        engine.start(sentinels.back());
        sentinels.push_back(engine.create(sleeper("sentinel", {{"purpose", "unlabelled"}})));
        const std::string unclaimed = "load-unclaimed";
        std::vector<std::string> unclaimed_ids;
        unclaimed_ids.push_back(engine.create(sleeper("sentinel", {{session_label, unclaimed}})));
        engine.start(unclaimed_ids.back());
        unclaimed_ids.push_back(engine.create(sleeper("sentinel", {{session_label, unclaimed}})));
        if (!poll(60s, [&] { return view().tracked == unclaimed_ids.size(); }))
            throw std::runtime_error("reaperd did not track the sentinels; its log:\n" + reaperd.log_tail(40));

        if (options.history > 0) {
            auto t = Clock::now();
            auto control = reaperd.control();
            for (std::size_t i = 0; i < options.history; ++i) control.end("history-" + std::to_string(i));
            // Answered before the loop takes them in: wait until it has.
            if (!poll(120s, [&] { return view().state_by_session.size() >= options.history; }))
                throw std::runtime_error("reaperd did not take in the history's tombstones");
            std::printf("history: %zu ended sessions (tombstones) seeded in %.1f s; state file %.0f KB\n", options.history,
                        seconds_between(t, Clock::now()), double(reaperd.state_bytes()) / 1000);
        }

        Book book;
        Load load_player(options, client_options, reaperd, events, book);
        double rss_start = vm_mb(reaperd.pid(), "VmRSS");
        std::size_t fds_start = fd_count(reaperd.pid());
        double cpu_start = cpu_seconds(reaperd.pid());
        double dockerd_cpu_start = dockerd > 0 ? cpu_seconds(dockerd) : 0;
        auto events_start = events.counts();
        load_player.open_sessions();
        auto leases_open = view();
        std::size_t leased = 0;
        for (const auto& [id, n] : leases_open.leases_by_session) leased += n;
        std::printf("%zu leases open on %zu sessions (reaperd counts %zu leases); playing the load for %d s...\n",
                    options.sessions, options.sessions, leased, options.seconds);

        auto t0 = Clock::now();
        Sampler sampler(reaperd, client_options, sentinels.front(), [&] {
            try {
                auto now_view = registry_view(reaperd);  // this thread's own: `view` is the main thread's
                std::printf("  %3.0f s: %zu containers created, reaperd tracks %zu, %zu reaps pending, %zu of ours "
                            "running, RSS %.1f MB\n",
                            seconds_between(t0, Clock::now()), book.containers().size(), now_view.tracked, now_view.pending,
                            events.running(), vm_mb(reaperd.pid(), "VmRSS"));
            } catch (const std::exception& e) {
                std::printf("  status failed: %s\n", e.what());
            }
        });
        RemoveProbe remove_probe(client_options);
        load_player.run();
        remove_probe.stop();
        sampler.progress_done();
        auto t_load_end = Clock::now();
        double load_s = seconds_between(t0, t_load_end);
        auto live = load_player.live_sessions();
        std::printf("load done in %.1f s: %zu containers created; %zu sessions still leased\n", load_s,
                    book.containers().size(), live.size());
        if (reaperd.exited()) throw std::runtime_error("reaperd exited during the load; its log:\n" + reaperd.log_tail(60));

        // ---- convergence: every ended session reaped, the registry equal to the engine --------
        std::vector<std::string> problems;
        // Checked every 100 ms, in two steps. The time is when a check that found them equal
        // began: first with a plain status (live sessions, counts, pending reaps: what
        // `reaperctl status` shows), the live sessions' records and the engine's list; a
        // container left of an ended session shows there as a count the engine has and reaperd
        // does not list. Then the whole registry, every ended session's state included, must
        // agree too. That whole status of a few thousand sessions takes up to a second and more
        // itself under this load (1.4 s measured as "equal after" with it alone at 1,000
        // leases): the bench's cost, not reaperd's lag.
        std::map<std::string, SessionRecord> live_sessions;
        for (const auto& [id, record] : book.sessions())
            if (!record.ended) live_sessions.emplace(id, record);
        auto t_converged = Clock::now();
        bool converged = poll(
            std::chrono::seconds(options.settle_seconds),
            [&] {
                auto t_check = Clock::now();
                problems = compare(registry_view(reaperd, {}), labelled_containers(engine), live_sessions);
                if (problems.empty()) t_converged = t_check;
                return problems.empty();
            },
            100ms);
        if (converged)
            converged = poll(
                std::chrono::seconds(options.settle_seconds),
                [&, missed = false]() mutable {
                    auto t_check = Clock::now();
                    problems = compare(view(), labelled_containers(engine), book.sessions());
                    // Equal only from a later check (the plain one missed something): its time.
                    if (problems.empty() && missed) t_converged = t_check;
                    missed = missed || !problems.empty();
                    return problems.empty();
                },
                100ms);
        double settle_s = seconds_between(t_load_end, t_converged);
        auto event_counts = events.counts();
        double cpu_load = cpu_seconds(reaperd.pid()) - cpu_start;
        double dockerd_cpu_load = dockerd > 0 ? cpu_seconds(dockerd) - dockerd_cpu_start : 0;
        double rss_after_load = vm_mb(reaperd.pid(), "VmRSS");
        std::printf("\nchecks after the load\n");
        if (converged) {
            std::printf("  ok: reaperd's registry matches the engine %.1f s after the load ended (every ended session "
                        "reaped, counts equal per session, no reap pending)\n",
                        settle_s);
        } else {
            std::string shown;
            for (std::size_t i = 0; i < problems.size() && i < 10; ++i) shown += "\n    " + problems[i];
            fail("reaperd's registry did not match the engine within " + std::to_string(options.settle_seconds) +
                 " s after the load (" + std::to_string(problems.size()) + " differences):" + shown);
        }

        auto sessions = book.sessions();
        auto containers = book.containers();
        auto destroyed = events.destroyed();
        auto early = early_removals(containers, sessions, destroyed);
        if (early.empty()) std::printf("  ok: no container removed before its session's end was due\n");
        else {
            std::string shown;
            for (std::size_t i = 0; i < early.size() && i < 10; ++i) shown += "\n    " + early[i];
            fail(std::to_string(early.size()) + " containers removed too early:" + shown);
        }
        auto engine_has = labelled_containers(engine);
        std::size_t live_containers = 0, missing = 0;
        for (const auto& [id, c] : containers) {
            if (sessions.at(c.session).ended) continue;
            ++live_containers;
            if (!engine_has.count(id)) ++missing;
        }
        if (missing == 0)
            std::printf("  ok: all %zu containers of the %zu still-leased sessions are on the engine\n", live_containers,
                        live.size());
        else
            fail(std::to_string(missing) + " of the " + std::to_string(live_containers) +
                 " containers of still-leased sessions are gone");
        std::size_t sentinels_left = 0;
        for (const auto& id : sentinels) sentinels_left += destroyed.count(id) ? 0 : 1;
        for (const auto& id : unclaimed_ids) sentinels_left += destroyed.count(id) || !engine_has.count(id) ? 0 : 1;
        if (sentinels_left == sentinels.size() + unclaimed_ids.size())
            std::printf("  ok: the %zu sentinels (unlabelled, and an unclaimed session's) are untouched\n", sentinels_left);
        else
            fail("only " + std::to_string(sentinels_left) + " of " + std::to_string(sentinels.size() + unclaimed_ids.size()) +
                 " sentinels are left");
        if (book.error_count())
            fail(std::to_string(book.error_count()) + " turns of the load failed, e.g.: " + book.errors().front());
        if (auto f = events.failure()) fail("the engine's event stream failed: " + *f);

        // ---- the drain: the remaining leases dropped -------------------------------------------
        std::set<std::string> drained(live.begin(), live.end());
        std::size_t drain_containers = 0;
        for (const auto& [id, c] : containers) drain_containers += drained.count(c.session) && !destroyed.count(id);
        auto last_drop = load_player.drop_all_leases();
        auto drain_due = last_drop + options.lease_grace;
        bool drained_ok = poll(std::chrono::seconds(options.settle_seconds), [&] {
            auto now_has = labelled_containers(engine);
            auto now_view = view();
            return now_has.size() == unclaimed_ids.size() && now_view.tracked == unclaimed_ids.size() &&
                   now_view.pending == 0;
        });
        destroyed = events.destroyed();
        Clock::time_point last_destroy = drain_due;
        for (const auto& [id, c] : containers)
            if (drained.count(c.session) && destroyed.count(id)) last_destroy = std::max(last_destroy, destroyed.at(id));
        double drain_s = seconds_between(drain_due, last_destroy);
        if (drained_ok)
            std::printf("  ok: drain: the last %zu leases dropped; their %zu containers reaped %.1f s after the grace "
                        "(%.1f containers/s)\n",
                        live.size(), drain_containers, drain_s, drain_s > 0 ? double(drain_containers) / drain_s : 0.0);
        else
            fail("drain: the containers of the last " + std::to_string(live.size()) + " sessions were not all reaped within " +
                 std::to_string(options.settle_seconds) + " s");
        std::this_thread::sleep_for(2s);  // let reaperd close the dropped lease connections
        std::size_t fds_end = fd_count(reaperd.pid());
        double rss_end = vm_mb(reaperd.pid(), "VmRSS");
        double hwm = vm_mb(reaperd.pid(), "VmHWM");
        double cpu_total = cpu_seconds(reaperd.pid()) - cpu_start;
        auto final_view = view();
        std::size_t leases_left = 0;
        for (const auto& [id, n] : final_view.leases_by_session) leases_left += n;
        if (leases_left) fail("reaperd still counts " + std::to_string(leases_left) + " leases after all were dropped");
        // The engine client keeps up to 4 idle connections: a few more fds than at the start is
        // not a leak; one per lease or per container would be.
        if (fds_end > fds_start + 6)
            fail("reaperd holds " + std::to_string(fds_end) + " fds after the drain, " + std::to_string(fds_start) +
                 " before the load");
        auto metrics = reaperd.control().metrics_text();
        auto [warnings, errors] = log_warnings_errors(reaperd.log_text());

        // ---- the table -------------------------------------------------------------------------
        auto latencies = reap_latencies(containers, sessions, destroyed, drained);
        auto count = [&](const std::map<std::string, std::size_t>& m, const char* k) {
            auto it = m.find(k);
            return it == m.end() ? std::size_t{0} : it->second;
        };
        auto delta = [&](const char* k) { return count(event_counts, k) - count(events_start, k); };
        std::size_t followed = delta("create") + delta("start") + delta("destroy");
        std::size_t all_events = 0;
        for (const auto& [k, n] : event_counts) all_events += n - count(events_start, k.c_str());
        double window_s = seconds_between(t0, t_converged);
        std::size_t started = 0, late = 0, reconnects = 0, ended = 0;
        for (const auto& [id, c] : containers) {
            started += c.started;
            late += c.late;
        }
        std::map<EndMode, std::size_t> by_mode;
        for (const auto& [id, s] : sessions) {
            reconnects += s.reconnects.size();
            if (s.ended && !drained.count(id)) {
                ++ended;
                ++by_mode[s.mode];
            }
        }
        auto lateness = book.lateness_ms();

        std::printf("\nload: %zu sessions leased at once, %zu containers in %.0f s (%zu started; %zu starts skipped, "
                    "the engine being behind schedule), max %zu running\n",
                    options.sessions, containers.size(), load_s, started, book.starts_skipped(), options.max_running);
        std::printf("  %-44s %s\n", "sessions ended during the load",
                    (std::to_string(ended) + " (" + std::to_string(by_mode[EndMode::lease_drop]) + " lease dropped, " +
                     std::to_string(by_mode[EndMode::end]) + " explicit end, " +
                     std::to_string(by_mode[EndMode::end_then_late]) + " end + late container); " +
                     std::to_string(reconnects) + " lease drop+retake within the grace")
                        .c_str());
        std::printf("  %-44s %zu existing, %zu running\n", "peak containers of ours at once", events.peak_existing(),
                    events.peak_running());
        std::printf("  %-44s p50 %.0f, p99 %.0f, max %.0f\n", "creation lateness vs even schedule (ms)",
                    percentile(lateness, 50), percentile(lateness, 99), percentile(lateness, 100));
        std::printf("\nreap latency (ms): from the end being due (end sent; lease closed + lease_grace; late container\n"
                    "created) to its destroy event seen on the engine's stream\n");
        std::printf("  %-44s %6s %8s %8s %8s %8s\n", "", "n", "p50", "p90", "p99", "max");
        std::vector<double> all = latencies.end_ms;
        all.insert(all.end(), latencies.drop_ms.begin(), latencies.drop_ms.end());
        latency_row("explicit end", latencies.end_ms);
        latency_row("lease dropped (after the grace)", latencies.drop_ms);
        latency_row("late container (from its creation)", latencies.late_ms);
        latency_row("all ends", all);
        std::printf("  %-44s %6zu %8.0f %8.0f %8.0f %8.0f\n", "baseline: engine force-remove call (calib.)",
                    capacity.remove_ms.size(), percentile(capacity.remove_ms, 50), percentile(capacity.remove_ms, 90),
                    percentile(capacity.remove_ms, 99), percentile(capacity.remove_ms, 100));
        const auto probe_ms = remove_probe.remove_ms();
        std::printf("  %-44s %6zu %8.0f %8.0f %8.0f %8.0f\n", "engine force-remove call during the load",
                    probe_ms.size(), percentile(probe_ms, 50), percentile(probe_ms, 90), percentile(probe_ms, 99),
                    percentile(probe_ms, 100));
        // Whose stall: the engine's own probes beside what reaperd said of the engine, so a
        // lag reads as the engine's or reaperd's at a glance (issue 23).
        const auto [slow, sampled] = sampler.slow_samples();
        const std::size_t engine_timeouts = remove_probe.timeouts() + sampler.inspect_timeouts();
        std::printf("\nthe engine's own stalls (its probes, beside what reaperd saw)\n");
        std::printf("  %-44s %zu force-remove probes, %zu inspects (one a second) got no answer in time\n",
                    "probe timeouts", remove_probe.timeouts(), sampler.inspect_timeouts());
        std::printf("  %-44s %zu of %zu samples (every 5 s); %.0f removal timeouts\n", "reaperd found the engine slow",
                    slow, sampled, metric(metrics, "reaperd_removal_timeouts_total"));
        std::printf("  %-44s %s\n", "verdict on the engine",
                    engine_timeouts > 0 ? "it stalled: its own probes timed out; a lag in this run is the engine's first"
                    : slow > 0           ? "slow at times (reaperd's removals), its probes answered"
                                         : "kept up: no probe timed out, reaperd never found it slow");
        std::printf("\nreaperd\n");
        std::printf("  %-44s %.1f/s (%zu create/start/destroy in %.0f s; all container events: %.1f/s)\n",
                    "events handled", double(followed) / window_s, followed, window_s, double(all_events) / window_s);
        auto inspects = sampler.inspect_ms();
        std::printf("  %-44s p50 %.0f, p90 %.0f, max %.0f ms (one a second during the load)\n",
                    "engine inspect call (log info lookups)", percentile(inspects, 50), percentile(inspects, 90),
                    percentile(inspects, 100));
        std::printf("  %-44s start %.1f, peak %.1f (VmHWM %.1f), after load %.1f, end %.1f\n", "RSS (MB)", rss_start,
                    std::max(sampler.peak_rss_mb(), rss_after_load), hwm, rss_after_load, rss_end);
        std::printf("  %-44s %.1f s in the load window (%.1f%% of one core, %.1f ms per container); %.1f s in all; "
                    "dockerd %.1f s\n",
                    "CPU", cpu_load, 100 * cpu_load / window_s, 1000 * cpu_load / double(containers.size()), cpu_total,
                    dockerd_cpu_load);
        std::printf("  %-44s %.1f KB\n", "state file at the end", double(reaperd.state_bytes()) / 1000);
        std::printf("  %-44s start %zu, peak %zu, end %zu\n", "open fds", fds_start, sampler.peak_fds(), fds_end);
        std::printf("  %-44s %.0f done, %.0f failed\n", "reaps (reaperctl metrics)",
                    metric(metrics, "reaperd_reaps_done_total"), metric(metrics, "reaperd_reaps_failed_total"));
        std::printf("  %-44s %zu max (sampled every 5 s); metrics answered in <= %.0f ms; status in <= %.0f ms\n",
                    "backlog (pending reaps)", sampler.peak_pending(), sampler.slowest_metrics_ms(), slowest_status_ms);
        std::printf("  %-44s %.1f s after the load\n", "registry matched the engine", converged ? settle_s : NAN);
        std::printf("  %-44s %zu warnings, %zu errors\n", "its log", warnings, errors);
        std::printf("  %-44s %zu, of which %zu tombstones\n", "sessions known at the end",
                    final_view.state_by_session.size(),
                    std::size_t(std::count_if(final_view.state_by_session.begin(), final_view.state_by_session.end(),
                                              [](const auto& s) { return s.second == "ended"; })));
        // Issue 11's targets, printed beside the figures (met/missed). They are what this load
        // should show on an idle machine; the exit status stays about correctness, as a
        // noisy CI machine can miss a latency target without reaperd being wrong.
        const double remove_p99 = percentile(probe_ms, 99);
        const double peak_rss = std::max(sampler.peak_rss_mb(), rss_after_load);
        auto target_row = [](const char* what, double figure, const char* unit, double target, const char* how) {
            std::printf("  %-52s %8.1f %-3s target <= %-8.1f %s  (%s)\n", what, figure, unit, target,
                        figure <= target ? "met   " : "MISSED", how);
        };
        std::printf("\ntargets (issue 11, at 1,000 leases and 10,000 containers over 10 minutes)\n");
        target_row("late container reaped after its create, p99", percentile(latencies.late_ms, 99), "ms", 1500,
                   "absolute");
        target_row("all ends p99 / engine's force-remove p99 in the load", remove_p99 > 0 ? percentile(all, 99) / remove_p99 : NAN,
                   "x", 1.2, "ratio in this run");
        std::printf("  %-52s %8.1f x  (the same call on the idle engine, before the load)\n",
                    "all ends p99 / engine's force-remove p99 at calibration",
                    percentile(capacity.remove_ms, 99) > 0 ? percentile(all, 99) / percentile(capacity.remove_ms, 99) : NAN);
        target_row("registry equal to the engine after the load", converged ? settle_s : NAN, "s", 1.0, "absolute");
        target_row("reaperd RSS, peak", peak_rss, "MB", 64, "absolute");
        std::printf("\nwall time %.0f s\n", seconds_between(wall0, Clock::now()));
        if (reaperd.exited()) fail("reaperd exited");
        if (!failures.empty()) {
            std::printf("\nreaperd's log (last 40 lines):\n%s", reaperd.log_tail(40).c_str());
            std::printf("\nFAIL: %zu check(s) failed: %s\n", failures.size(), failures.front().c_str());
            return 1;
        }
        std::printf("\nPASS: reaperd kept up with %zu leases and %zu containers over %.0f s: registry equal to the engine "
                    "%.1f s after, nothing removed early, p99 reap latency %.0f ms\n",
                    options.sessions, containers.size(), load_s, settle_s, percentile(all, 99));
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "load_bench: %s\n", e.what());
        return 2;
    }
}
