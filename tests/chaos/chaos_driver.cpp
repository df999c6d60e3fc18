// chaos_driver: the churn of sessions and the referee of the chaos run (scripts/chaos.sh).
//
// It talks to the engine directly (never through the fault proxy) and to reaperd over the
// control socket. While the script injects faults it creates labelled, unlabeled and
// never-leased containers, holds and drops leases, ends sessions, reports orphans, runs
// log-spamming containers, follows the engine's own events stream and samples reaperd's fds,
// RSS and the spammers' log files. When the script writes "faults-end" to the faults log it
// stops the churn, waits for the orphans to go, checks everything and prints a table.
// Exit status: 0 when every check held, 1 when one failed, 64 on a usage error.
//
// The faults log (written by the script) has one line per fault: "<unix ms> <what> [arg]",
// with what in reaperd-kill, reaperd-up PID, engine-kill, engine-up, state-ro, state-rw,
// proxy-mode NAME, faults-end. With --out-dir DIR it also writes its samples there as CSV
// (log-samples.csv, reaperd-samples.csv).
#include "engine.hpp"
#include "logcap/logcap_file.hpp"

#include <reaper/client.hpp>
#include <reaper/control.hpp>
#include <reaper/session.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <sys/prctl.h>

namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using Ms = std::int64_t;  // unix time in milliseconds, the clock every record here uses

Ms now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

std::mutex log_mutex;
template <typename... Parts>
void say(const Parts&... parts) {
    std::ostringstream line;
    line << std::fixed << std::setprecision(3) << now_ms() / 1000.0 << " driver: ";
    (line << ... << parts);
    std::lock_guard lock(log_mutex);
    std::cerr << line.str() << std::endl;
}

constexpr const char* session_label = "reaperd.session";

struct Options {
    std::string engine_socket;
    std::string control_socket;
    std::string faults_log;
    std::string reaperd_pid_file;
    std::string proxy_stats;
    std::string out_dir;  // where the samples go as CSV ("" = nowhere)
    unsigned seed = 1;
    Ms lease_grace = 3000;
    std::uint64_t log_cap = 2u << 20;
    std::uint64_t log_bound = 4u << 20;
    Ms reap_deadline = 60'000;
    // Not settled: from a reaperd start until it reported ready (its first full sync) and
    // `settle` more; from an engine kill until `settle` after it is back (reaperd reconnects
    // with backoff up to retry_max, re-lists and re-inspects through the faulty proxy).
    Ms settle = 10'000;
    // From a reaperd start until it has loaded its state and cut what grew while none ran
    // (the log check skips these samples; the driver samples every 250 ms).
    Ms reaperd_boot = 1000;
    Ms quiet = 5000;  // at the end, after the orphans went: the late fd/RSS samples
    unsigned workers = 2;
    unsigned max_live = 60;  // containers alive at once, so an engine restart stays quick
};

// What a container is, for the referee.
enum class Kind {
    unlabeled,  // no session label: reaperd must never remove it
    unclaimed,  // labelled with a session that never took a lease: left alone
    held,       // in a session leased for the whole run
    spam,       // a log spammer in a held session
    short_lived,  // in a session that is leased, then dropped or ended (or still leased)
    tombstone,  // created under a session already ended: reapable from birth
    library,    // a live reaper::Session's own container: its lease must come back after
                // every reaperd kill, so reaperd must never remove it
};
const char* to_string(Kind k) {
    switch (k) {
        case Kind::unlabeled: return "unlabeled";
        case Kind::unclaimed: return "unclaimed";
        case Kind::held: return "held";
        case Kind::spam: return "spam";
        case Kind::short_lived: return "short";
        case Kind::tombstone: return "tombstone";
        case Kind::library: return "library";
    }
    return "?";
}

struct Box {
    std::string name;
    std::string id;  // "" until create answered (it may exist anyway: matched by name)
    std::string session;
    Kind kind;
    Ms created = 0;
    Ms reapable = 0;  // 0 = must not be removed by reaperd; else allowed from then on
    std::string why;  // why it is reapable
    Ms driver_removed = 0;  // when the driver itself started removing it
    std::string log_path;
};

struct Gap {
    Ms lost = 0;      // when the driver noticed the lease gone
    Ms regained = 0;  // 0 = never (the run ended first)
    Ms given_up = 0;  // the session was dropped or ended before the lease came back
};

struct SessionRec {
    std::string id;
    Kind kind;
    std::unique_ptr<reaper::control::Lease> lease;
    bool want_lease = false;
    Ms lost = 0;
    std::vector<Gap> gaps;
    Ms ended = 0;  // dropped or ended by the driver: its containers are reapable from then
    bool explicitly_ended = false;
    Ms started = 0;
    std::vector<std::string> boxes;  // names
};

struct DestroyEvent {
    std::string id;
    std::string name;
    bool labelled = false;
    std::string session;
    Ms at = 0;
};

struct ProcSample {
    Ms at;
    int pid;
    std::size_t fds;
    std::size_t leases;  // leases the driver held then: each is one fd in reaperd
    std::size_t log_fds;  // container log files reaperd holds open (one per capped container)
    std::uint64_t rss_kib;
};

struct LogSample {
    Ms at;
    std::string box;
    std::uint64_t bytes;
};

struct FaultEntry {
    Ms at;
    std::string what;
    std::string arg;
};

std::vector<FaultEntry> read_faults(const std::string& path) {
    std::vector<FaultEntry> out;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
        std::istringstream fields(line);
        FaultEntry f;
        if (fields >> f.at >> f.what) {
            fields >> f.arg;
            out.push_back(f);
        }
    }
    return out;
}

class Chaos {
public:
    explicit Chaos(Options o) : o_(std::move(o)), random_(o_.seed), control_(o_.control_socket) {
        reaper::ClientOptions c;
        c.address = reaper::EngineAddress::parse(o_.engine_socket);
        c.request_timeout = 60s;
        engine_ = std::make_unique<reaper::Client>(c);
    }

    int run();

private:
    // ---- engine and control helpers ------------------------------------------------
    template <typename F>
    bool retry_for(Ms limit, F&& f) {
        Ms deadline = now_ms() + limit;
        for (;;) {
            try {
                f();
                return true;
            } catch (const std::exception&) {
                if (now_ms() > deadline || stop_all_) return false;
            }
            std::this_thread::sleep_for(200ms);
        }
    }

    unsigned roll(unsigned n) {
        std::lock_guard lock(random_mutex_);
        return std::uniform_int_distribution<unsigned>(0, n - 1)(random_);
    }

    // Creates (and usually starts) a container; its record exists before the create call, so
    // a create that the engine performed but whose answer was lost is still known by name.
    std::optional<std::string> make_box(Kind kind, const std::string& session, bool start,
                                        bool spam = false) {
        Box box;
        box.name = "chaos-" + std::to_string(::getpid()) + "-" + std::to_string(++serial_);
        box.session = session;
        box.kind = kind;
        box.created = now_ms();
        reaper::ContainerSpec spec;
        spec.name = box.name;
        spec.image = reaper::test::PrivateEngine::image;
        if (spam) {
            // A paced writer (~1.5-2 MB/s of json log on a quiet machine): enough to cross a
            // 2 MiB cap every second or so, without burning a core as `yes` would.
            spec.cmd = {"sh", "-c",
                        "while :; do yes 'chaos log line: the quick brown fox jumps over the "
                        "lazy dog' | head -n 1500; sleep 0.1; done"};
        } else {
            spec.cmd = {"sleep", "100000"};
        }
        if (kind != Kind::unlabeled) spec.labels[session_label] = session;
        spec.labels["chaos.kind"] = to_string(kind);
        {
            std::lock_guard lock(mutex_);
            if (kind == Kind::tombstone) {
                box.reapable = box.created;
                box.why = "created after its session ended";
            }
            boxes_[box.name] = box;
            if (auto s = sessions_.find(session); s != sessions_.end())
                s->second.boxes.push_back(box.name);
        }
        std::string id;
        try {
            id = engine_->create(spec);
        } catch (const std::exception& e) {
            say("create ", box.name, " failed: ", e.what());
            return std::nullopt;
        }
        {
            std::lock_guard lock(mutex_);
            boxes_[box.name].id = id;
            by_id_[id] = box.name;
        }
        ++created_;
        if (start) {
            try {
                engine_->start(id);
            } catch (const std::exception& e) {
                say("start ", box.name, " failed: ", e.what());
            }
        }
        return box.name;
    }

    std::string id_of(const std::string& name) {
        std::lock_guard lock(mutex_);
        return boxes_.at(name).id;
    }

    void driver_remove(const std::string& name) {
        std::string id;
        {
            std::lock_guard lock(mutex_);
            auto& b = boxes_.at(name);
            b.driver_removed = now_ms();
            id = b.id.empty() ? b.name : b.id;
        }
        try {
            engine_->remove(id, {.force = true, .volumes = true});
        } catch (const std::exception& e) {
            say("driver remove of ", name, ": ", e.what());
        }
    }

    // ---- leases ----------------------------------------------------------------------
    bool take_lease(SessionRec& s) {
        try {
            s.lease = control_.lease(s.id);
            return true;
        } catch (const std::exception&) {
            return false;
        }
    }

    // Keeps every wanted lease held: a lease lost (reaperd killed) is taken again as soon as
    // reaperd answers, and the gap is recorded for the referee.
    void keep_leases() {
        while (!stop_all_) {
            std::vector<std::string> ids;
            {
                std::lock_guard lock(mutex_);
                for (auto& [id, s] : sessions_)
                    if (s.want_lease && (!s.lease || !s.lease->alive())) ids.push_back(id);
            }
            for (auto& id : ids) {
                std::unique_ptr<reaper::control::Lease> fresh;
                try {
                    fresh = control_.lease(id);
                } catch (const std::exception&) {
                }
                std::lock_guard lock(mutex_);
                auto& s = sessions_.at(id);
                if (!s.want_lease) continue;
                if (s.lease && !s.lease->alive()) {
                    s.lease->release();
                    s.lease.reset();
                    s.gaps.push_back({now_ms(), 0});
                }
                if (fresh) {
                    s.lease = std::move(fresh);
                    if (!s.gaps.empty() && s.gaps.back().regained == 0)
                        s.gaps.back().regained = now_ms();
                }
            }
            std::this_thread::sleep_for(50ms);
        }
    }

    // ---- the churn ---------------------------------------------------------------------
    std::size_t live_boxes() {
        std::lock_guard lock(mutex_);
        std::size_t n = 0;
        for (auto& [name, b] : boxes_)
            if (!b.driver_removed && !b.reapable && !gone_.count(name)) ++n;
        return n + pending_reapable();
    }
    std::size_t pending_reapable() {  // under mutex_
        std::size_t n = 0;
        for (auto& [name, b] : boxes_)
            if (b.reapable && !b.driver_removed && !gone_.count(name)) ++n;
        return n;
    }

    void churn() {
        while (!stop_churn_) {
            bool room = live_boxes() < o_.max_live;
            unsigned pick = roll(100);
            try {
                if (pick < 20 && room) start_short_session();
                else if (pick < 55) advance_short_session();
                else if (pick < 62 && room) tombstone_box();
                else if (pick < 70 && room) simple_box(Kind::unlabeled);
                else if (pick < 76 && room) simple_box(Kind::unclaimed);
                else if (pick < 86 && room) simple_box(Kind::held);
                else if (pick < 92) remove_protected_self();
                else std::this_thread::sleep_for(200ms);
            } catch (const std::exception& e) {
                say("churn step failed: ", e.what());
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(50 + roll(250)));
        }
    }

    void start_short_session() {
        SessionRec s;
        s.id = "chaos-s" + std::to_string(++session_serial_);
        s.kind = Kind::short_lived;
        s.started = now_ms();
        if (!take_lease(s)) return;  // reaperd is down: a session without a lease proves nothing
        s.want_lease = true;
        const std::string id = s.id;
        {
            std::lock_guard lock(mutex_);
            sessions_[id] = std::move(s);
        }
        unsigned n = 1 + roll(3);
        for (unsigned i = 0; i < n; ++i) make_box(Kind::short_lived, id, roll(4) != 0);
        // Only now may another worker end or drop it, so none of these is made after its end.
        give_back(id);
    }

    // Takes a short session out of the active list (so one worker handles it at a time).
    std::optional<std::string> take_active(Ms min_age) {
        std::lock_guard lock(mutex_);
        if (active_short_.empty()) return std::nullopt;
        std::size_t i = roll(static_cast<unsigned>(active_short_.size()));
        auto id = active_short_[i];
        if (now_ms() - sessions_.at(id).started < min_age) return std::nullopt;
        active_short_.erase(active_short_.begin() + static_cast<long>(i));
        return id;
    }
    void give_back(const std::string& id) {
        std::lock_guard lock(mutex_);
        active_short_.push_back(id);
    }

    void mark_session_over(const std::string& id, Ms at, const std::string& why) {
        std::lock_guard lock(mutex_);
        auto& s = sessions_.at(id);
        s.ended = at;
        for (auto& name : s.boxes) {
            auto& b = boxes_.at(name);
            if (!b.reapable) {
                b.reapable = at;
                b.why = why;
            }
        }
    }

    void drop_lease(const std::string& id) {
        std::lock_guard lock(mutex_);
        auto& s = sessions_.at(id);
        s.want_lease = false;
        if (!s.gaps.empty() && !s.gaps.back().regained && !s.gaps.back().given_up)
            s.gaps.back().given_up = now_ms();
        if (s.lease) s.lease->release();
        s.lease.reset();
    }

    void advance_short_session() {
        auto taken = take_active(1500);
        if (!taken) return;
        const std::string id = *taken;
        unsigned what = roll(100);
        if (what < 30) {  // the owner dies: its lease drops
            mark_session_over(id, now_ms(), "lease dropped");
            drop_lease(id);
            ++dropped_;
            return;
        }
        if (what < 55) {  // the owner ends it explicitly, lease still held
            Ms at = now_ms();
            mark_session_over(id, at, "ended");
            if (retry_for(20'000, [&] { control_.end(id); })) {
                std::lock_guard lock(mutex_);
                sessions_.at(id).explicitly_ended = true;
                ended_ids_.push_back(id);
            } else {
                say("end ", id, " not delivered in 20 s; its lease is dropped instead");
            }
            drop_lease(id);
            ++ended_;
            return;
        }
        std::vector<std::string> names;
        {
            std::lock_guard lock(mutex_);
            for (auto& n : sessions_.at(id).boxes)
                if (!boxes_.at(n).reapable && !boxes_.at(n).driver_removed && !gone_.count(n))
                    names.push_back(n);
        }
        if (what < 75 && !names.empty()) {
            // The owner's delete fails (a plain DELETE of a running container answers 409),
            // so it reports the container as an orphan.
            auto name = names[roll(static_cast<unsigned>(names.size()))];
            auto cid = id_of(name);
            if (cid.empty()) {
                give_back(id);
                return;
            }
            // Counted as the driver's own removal from before the call (a stopped container
            // goes at once, its destroy event maybe before the call returns), unless refused.
            {
                std::lock_guard lock(mutex_);
                boxes_.at(name).driver_removed = now_ms();
            }
            bool refused = false;
            try {
                engine_->remove(cid, {});
            } catch (const reaper::Conflict&) {
                refused = true;
            } catch (const std::exception&) {
            }
            if (refused) {
                std::lock_guard lock(mutex_);
                auto& b = boxes_.at(name);
                b.driver_removed = 0;
                if (!b.reapable) {
                    b.reapable = now_ms();
                    b.why = "reported as orphan";
                }
            }
            if (refused) {  // outside the lock: the report may wait for a restarting reaperd
                if (retry_for(20'000, [&] { control_.report_orphan(cid, id); })) ++orphans_;
                else say("orphan report for ", name, " not delivered in 20 s");
            }
        } else if (what < 88 && !names.empty()) {
            driver_remove(names[roll(static_cast<unsigned>(names.size()))]);
        } else if (live_boxes() < o_.max_live) {
            make_box(Kind::short_lived, id, true);
        }
        give_back(id);
    }

    void tombstone_box() {
        std::string id;
        {
            std::lock_guard lock(mutex_);
            if (ended_ids_.empty()) return;
            id = ended_ids_[roll(static_cast<unsigned>(ended_ids_.size()))];
        }
        make_box(Kind::tombstone, id, true);
    }

    void simple_box(Kind kind) {
        std::string session;
        if (kind == Kind::unclaimed) session = "chaos-unclaimed-" + std::to_string(roll(4));
        if (kind == Kind::held) session = held_[roll(static_cast<unsigned>(held_.size()))];
        make_box(kind, session, roll(5) != 0);
    }

    // The driver removes one of its own protected containers (not a violation), which also
    // keeps the number of containers bounded.
    void remove_protected_self() {
        std::vector<std::string> names;
        {
            std::lock_guard lock(mutex_);
            for (auto& [n, b] : boxes_)
                if ((b.kind == Kind::unlabeled || b.kind == Kind::unclaimed ||
                     b.kind == Kind::held) &&
                    !b.driver_removed && !gone_.count(n) && !b.id.empty())
                    names.push_back(n);
        }
        if (names.size() < 8) return;
        driver_remove(names[roll(static_cast<unsigned>(names.size()))]);
    }

    // Restarts spammers the engine stopped (an engine restart stops every container) and
    // learns their log paths.
    void tend_spammers() {
        while (!stop_all_) {
            for (auto& name : spammers_) {
                try {
                    auto info = engine_->inspect(id_of(name));
                    {
                        std::lock_guard lock(mutex_);
                        boxes_.at(name).log_path = info.log_path;
                    }
                    if (!info.state.running && !stop_churn_) engine_->start(info.id);
                } catch (const std::exception&) {
                }
            }
            std::this_thread::sleep_for(1s);
        }
    }

    // ---- observation -----------------------------------------------------------------
    void follow_events() {
        Ms since_s = now_ms() / 1000 - 1;
        while (!stop_all_) {
            try {
                reaper::EventsOptions options;
                options.filters = {{"type", {"container"}}};
                options.since = since_s;
                auto stream = engine_->events(options);
                ++event_streams_;
                {
                    std::lock_guard lock(mutex_);
                    stream_ = stream.get();
                }
                while (auto event = stream->next()) {
                    since_s = std::max<Ms>(since_s, event->time_nano / 1'000'000'000 - 1);
                    if (event->action != "destroy") continue;
                    DestroyEvent d;
                    d.id = event->id;
                    d.at = event->time_nano / 1'000'000;
                    d.name = event->attributes.count("name") ? event->attributes.at("name") : "";
                    if (auto l = event->attributes.find(session_label); l != event->attributes.end()) {
                        d.labelled = true;
                        d.session = l->second;
                    }
                    std::lock_guard lock(mutex_);
                    if (destroyed_ids_.insert(d.id).second) {
                        destroys_.push_back(d);
                        auto name = by_id_.count(d.id) ? by_id_[d.id] : d.name;
                        gone_.insert(name);
                    }
                }
            } catch (const std::exception&) {
                // The engine is down or restarting: try again shortly, from the last event.
            }
            {
                std::lock_guard lock(mutex_);
                stream_ = nullptr;
            }
            if (!stop_all_) std::this_thread::sleep_for(200ms);
        }
    }

    void sample() {
        while (!stop_all_) {
            Ms at = now_ms();
            int pid = 0;
            std::ifstream(o_.reaperd_pid_file) >> pid;
            if (pid > 0) {
                std::size_t fds = 0, log_fds = 0;
                std::error_code ec;
                for (auto it = fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
                     !ec && it != fs::directory_iterator(); it.increment(ec)) {
                    ++fds;
                    std::error_code link_ec;
                    auto target = fs::read_symlink(it->path(), link_ec).string();
                    if (target.size() > 9 && target.ends_with("-json.log")) ++log_fds;
                }
                std::ifstream status("/proc/" + std::to_string(pid) + "/status");
                std::string line;
                std::uint64_t rss = 0;
                while (std::getline(status, line))
                    if (line.rfind("VmRSS:", 0) == 0) rss = std::stoull(line.substr(6));
                if (fds > 0 && rss > 0) {
                    std::lock_guard lock(mutex_);
                    std::size_t leases = 0;
                    for (auto& [id, s] : sessions_)
                        if (s.lease && s.lease->alive()) ++leases;
                    procs_.push_back({at, pid, fds, leases, log_fds, rss});
                }
            }
            std::vector<std::pair<std::string, std::string>> logs;
            {
                std::lock_guard lock(mutex_);
                for (auto& name : spammers_)
                    if (!boxes_.at(name).log_path.empty())
                        logs.push_back({name, boxes_.at(name).log_path});
            }
            for (auto& [name, path] : logs) {
                // The log file and any rotated siblings (path.1, path.2, ...), the bytes on
                // disk: a punched cut leaves the apparent size growing.
                std::uint64_t total = 0;
                std::error_code ec;
                fs::path p(path);
                for (auto it = fs::directory_iterator(p.parent_path(), ec);
                     !ec && it != fs::directory_iterator(); it.increment(ec)) {
                    auto file = it->path().filename().string();
                    if (file == p.filename().string() ||
                        file.rfind(p.filename().string() + ".", 0) == 0) {
                        total += reaperd::logcap::allocated_bytes(it->path().string());
                    }
                }
                if (!ec) {
                    std::lock_guard lock(mutex_);
                    logs_.push_back({at, name, total});
                }
            }
            std::this_thread::sleep_for(250ms);
        }
    }

    // Learns when each reaperd instance first says it is ready (its first full sync done).
    void watch_readiness() {
        int reported = 0;
        while (!stop_all_) {
            int pid = 0;
            std::ifstream(o_.reaperd_pid_file) >> pid;
            bool known;
            {
                std::lock_guard lock(mutex_);
                known = ready_at_.count(pid) > 0;
            }
            if (pid > 0 && !known) {
                try {
                    auto status = status_client_.status_json();
                    if (status.find("\"ready\":true") != std::string::npos) {
                        std::lock_guard lock(mutex_);
                        ready_at_[pid] = now_ms();
                        say("reaperd ", pid, " is ready");
                    }
                } catch (const std::exception& e) {
                    if (reported != pid) say("status of reaperd ", pid, ": ", e.what());
                    reported = pid;
                }
            }
            std::this_thread::sleep_for(250ms);
        }
    }

    // What reaperd's descriptors are, in the log: to read when its fd check fails.
    void log_fds() {
        int pid = 0;
        std::ifstream(o_.reaperd_pid_file) >> pid;
        std::error_code ec;
        std::map<std::string, unsigned> kinds;
        for (auto it = fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
             !ec && it != fs::directory_iterator(); it.increment(ec)) {
            auto target = fs::read_symlink(it->path(), ec).string();
            ++kinds[target.substr(0, target.find(':'))];
        }
        std::ostringstream t;
        for (auto& [k, n] : kinds) t << ' ' << k << " x" << n;
        say("reaperd ", pid, " fds at the end:", t.str());
    }

    bool faults_over() {
        for (auto& f : read_faults(o_.faults_log))
            if (f.what == "faults-end") {
                faults_end_ = f.at;
                return true;
            }
        return false;
    }

    int judge();
    void open_library_sessions(unsigned count);
    void close_library_sessions();

    Options o_;
    std::mt19937 random_;
    std::mutex random_mutex_;
    reaper::control::ControlClient control_;
    reaper::control::ControlClient status_client_{o_.control_socket, 5000ms};
    std::map<int, Ms> ready_at_;  // reaperd pid -> when its status first said ready
    std::unique_ptr<reaper::Client> engine_;

    std::mutex mutex_;
    std::map<std::string, Box> boxes_;  // by name
    std::map<std::string, std::string> by_id_;
    std::map<std::string, SessionRec> sessions_;
    std::vector<std::string> active_short_;
    std::vector<std::string> ended_ids_;
    std::vector<std::string> held_;
    std::vector<std::string> spammers_;
    // Live library Sessions (issue 10): opened at the start, kept through every fault, closed
    // after the judgement; their containers are Kind::library boxes.
    std::vector<std::unique_ptr<reaper::Session>> library_sessions_;
    std::set<std::string> gone_;  // names with a destroy event
    std::set<std::string> destroyed_ids_;
    std::vector<DestroyEvent> destroys_;
    std::vector<ProcSample> procs_;
    std::vector<LogSample> logs_;
    reaper::EventStream* stream_ = nullptr;

    std::atomic<bool> stop_churn_{false};
    std::atomic<bool> stop_all_{false};
    std::atomic<unsigned> serial_{0};
    std::atomic<unsigned> session_serial_{0};
    std::atomic<unsigned> created_{0}, dropped_{0}, ended_{0}, orphans_{0}, event_streams_{0};
    Ms run_start_ = 0;
    Ms faults_end_ = 0;
    Ms churn_end_ = 0;
    Ms all_reaped_at_ = 0;
};

int Chaos::run() {
    run_start_ = now_ms();
    if (!retry_for(60'000, [&] { reaper::test::import_busybox_image(*engine_, reaper::test::PrivateEngine::image); })) {
        say("cannot import the test image");
        return 1;
    }
    std::thread events([&] { follow_events(); });
    std::thread sampler([&] { sample(); });
    std::thread readiness([&] { watch_readiness(); });
    for (int i = 0; i < 2; ++i) {
        SessionRec s;
        s.id = "chaos-held-" + std::to_string(i);
        s.kind = Kind::held;
        s.started = now_ms();
        if (!retry_for(60'000, [&] { s.lease = control_.lease(s.id); })) {
            say("reaperd does not answer on ", o_.control_socket);
            stop_all_ = true;
            {
                std::lock_guard lock(mutex_);
                if (stream_) stream_->cancel();
            }
            events.join();
            sampler.join();
            readiness.join();
            return 1;
        }
        s.want_lease = true;
        held_.push_back(s.id);
        std::lock_guard lock(mutex_);
        sessions_[s.id] = std::move(s);
    }
    std::thread keeper([&] { keep_leases(); });
    open_library_sessions(3);
    for (int i = 0; i < 2; ++i)
        if (auto name = make_box(Kind::spam, held_[0], true, true)) spammers_.push_back(*name);
    std::thread tender([&] { tend_spammers(); });
    say("churn started: ", o_.workers, " workers, seed ", o_.seed);
    std::vector<std::thread> workers;
    for (unsigned i = 0; i < o_.workers; ++i) workers.emplace_back([&] { churn(); });

    while (!faults_over()) std::this_thread::sleep_for(500ms);
    stop_churn_ = true;
    for (auto& w : workers) w.join();
    churn_end_ = now_ms();
    say("faults over; churn stopped; dropping every other active short session");
    std::vector<std::string> active;
    {
        std::lock_guard lock(mutex_);
        active = active_short_;
    }
    for (std::size_t i = 0; i < active.size(); i += 2) {
        mark_session_over(active[i], now_ms(), "lease dropped at the end");
        drop_lease(active[i]);
        ++dropped_;
    }

    // Wait for every reapable container to be gone (by the engine's own list, since events
    // may lag); the deadline starts when the faults stopped.
    Ms deadline = churn_end_ + o_.lease_grace + o_.reap_deadline;
    for (;;) {
        std::set<std::string> present;
        bool listed = false;
        try {
            for (auto& c : engine_->list_containers({.all = true})) {
                for (auto& n : c.names) present.insert(n);
            }
            listed = true;
        } catch (const std::exception& e) {
            say("list failed: ", e.what());
        }
        if (listed) {
            std::size_t waiting = 0;
            std::lock_guard lock(mutex_);
            for (auto& [name, b] : boxes_)
                if (b.reapable && !b.driver_removed && present.count(name)) ++waiting;
            if (waiting == 0) {
                all_reaped_at_ = now_ms();
                break;
            }
        }
        if (now_ms() > deadline) break;
        std::this_thread::sleep_for(500ms);
    }
    // A few quiet seconds for the late fd/RSS samples and the last destroy events.
    std::this_thread::sleep_for(std::chrono::milliseconds(o_.quiet));
    log_fds();
    stop_all_ = true;
    {
        std::lock_guard lock(mutex_);
        if (stream_) stream_->cancel();
    }
    events.join();
    sampler.join();
    readiness.join();
    keeper.join();
    tender.join();
    const int verdict = judge();
    close_library_sessions();
    return verdict;
}

// Sessions of the library, as an application holds them: each its own engine client (to the
// engine directly: the faults are between reaperd and the engine) and its own lease keeper,
// which must take the lease again after each reaperd kill within lease_grace.
void Chaos::open_library_sessions(unsigned count) {
    for (unsigned i = 0; i < count; ++i) {
        reaper::SessionOptions options;
        options.session_id = "chaos-lib-" + std::to_string(i);
        reaper::ClientOptions client;
        client.address = reaper::EngineAddress::parse(o_.engine_socket);
        client.request_timeout = 60s;
        options.engine_factory = reaper::client_factory(client);
        options.control_socket = o_.control_socket;
        options.ready_settle = 0ms;
        auto session = std::make_unique<reaper::Session>(options);
        Box box;
        box.name = "chaos-" + std::to_string(::getpid()) + "-lib-" + std::to_string(i);
        box.session = options.session_id;
        box.kind = Kind::library;
        box.created = now_ms();
        {
            std::lock_guard lock(mutex_);
            boxes_[box.name] = box;
        }
        reaper::ContainerSpec spec;
        spec.name = box.name;
        spec.image = reaper::test::PrivateEngine::image;
        spec.cmd = {"sleep", "100000"};
        spec.labels["chaos.kind"] = to_string(Kind::library);
        try {
            session->create(spec);
        } catch (const std::exception& e) {
            say("library session ", options.session_id, " did not open: ", e.what());
            continue;
        }
        {
            std::lock_guard lock(mutex_);
            boxes_[box.name].id = session->container_id();
            by_id_[session->container_id()] = box.name;
        }
        ++created_;
        library_sessions_.push_back(std::move(session));
    }
    say(library_sessions_.size(), " library sessions open");
}

void Chaos::close_library_sessions() {
    for (auto& session : library_sessions_) {
        {
            std::lock_guard lock(mutex_);
            if (auto it = by_id_.find(session->container_id()); it != by_id_.end())
                boxes_[it->second].driver_removed = now_ms();
        }
        session->close();
    }
    library_sessions_.clear();
}

std::string mib(std::uint64_t bytes) {
    std::ostringstream t;
    t << std::fixed << std::setprecision(2) << bytes / 1048576.0 << " MiB";
    return t.str();
}

int Chaos::judge() {
    auto faults = read_faults(o_.faults_log);
    std::vector<Ms> reaperd_ups;
    // Windows in which reaperd could not be holding the log caps: it was down or had just
    // restarted (it re-lists and re-attaches its watches first), or the engine was down or
    // had just restarted (its containers are re-listed and their log paths re-learned).
    struct Window {
        Ms from, to;
        std::string why;
    };
    std::vector<Window> unsettled;
    Ms reaperd_down = 0, engine_down = 0;
    unsigned reaperd_kills = 0, engine_kills = 0, ro_windows = 0;
    for (auto& f : faults) {
        if (f.what == "reaperd-kill") {
            reaperd_down = f.at;
            ++reaperd_kills;
        } else if (f.what == "reaperd-up") {
            reaperd_ups.push_back(f.at);
            if (reaperd_down) unsettled.push_back({reaperd_down, f.at, "reaperd down"});
            reaperd_down = 0;
            // Until this instance's first full sync, and `settle` more; never ready: all of
            // its life (up to its kill, or the end of the run).
            int pid = std::atoi(f.arg.c_str());
            Ms ready = now_ms();
            if (ready_at_.count(pid)) {
                ready = ready_at_[pid] + o_.settle;
            } else {
                for (auto& later : faults)
                    if (later.what == "reaperd-kill" && later.arg == f.arg) ready = later.at;
            }
            unsettled.push_back({f.at, ready,
                                 "reaperd " + f.arg + " starting (" +
                                     (ready_at_.count(pid)
                                          ? "ready after " +
                                                std::to_string((ready_at_[pid] - f.at) / 1000) + " s"
                                          : std::string("never ready")) +
                                     ")"});
        } else if (f.what == "engine-kill") {
            engine_down = f.at;
            ++engine_kills;
        } else if (f.what == "engine-up") {
            if (engine_down)
                unsettled.push_back({engine_down, f.at + o_.settle, "engine restarting"});
            engine_down = 0;
        } else if (f.what == "state-ro") {
            ++ro_windows;
        }
    }
    auto settled = [&](Ms t) {
        for (auto& w : unsettled)
            if (t >= w.from && t <= w.to) return false;
        return true;
    };
    // When no reaperd process existed (from a kill until the next start), and the first
    // `reaperd_boot` of each start: nothing can cap a log then. Everything else counts for
    // the log bound, a reaperd still waiting for the engine's first list included: it caps
    // the logs known from its last run from its start (daemon/logcap/logcap.hpp).
    std::vector<Window> no_reaperd;
    {
        Ms down = 0;
        for (auto& f : faults) {
            if (f.what == "reaperd-kill") down = f.at;
            if (f.what == "reaperd-up") {
                no_reaperd.push_back({down ? down : f.at, f.at + o_.reaperd_boot, "no reaperd"});
                down = 0;
            }
        }
        if (down) no_reaperd.push_back({down, now_ms(), "no reaperd"});
    }
    auto reaperd_running = [&](Ms t) {
        for (auto& w : no_reaperd)
            if (t >= w.from && t <= w.to) return false;
        return true;
    };

    // Lease lapses: a gap in a lease longer than reaperd's grace allows its session to end
    // (not a reaperd fault). reaperd gives sessions a fresh grace when it restarts, so a gap
    // is measured from the later of the loss and the last reaperd start within it; 500 ms
    // of margin covers the driver noticing the loss up to one poll late.
    const Ms margin = 500;
    unsigned lapses = 0;
    Ms longest_gap = 0;
    for (auto& [id, s] : sessions_) {
        // A dropped lease ends its session only after lease_grace: its containers may go
        // from the drop + grace (from the loss, if the lease was already lost then).
        if (s.ended && !s.explicitly_ended) {
            Ms grace_start = s.ended;
            for (auto& g : s.gaps)
                if (g.given_up && !g.regained) {
                    grace_start = g.lost;
                    for (Ms up : reaperd_ups)
                        if (up >= g.lost && up <= g.given_up) grace_start = std::max(grace_start, up);
                    grace_start = std::min(grace_start, s.ended);
                }
            for (auto& name : s.boxes) {
                auto& b = boxes_.at(name);
                if (b.reapable == s.ended && b.why.rfind("lease dropped", 0) == 0)
                    b.reapable = std::max(b.created, grace_start + o_.lease_grace - margin);
            }
        }
        for (auto& g : s.gaps) {
            Ms start = g.lost;
            Ms end = g.regained ? g.regained : g.given_up ? g.given_up : now_ms();
            for (Ms up : reaperd_ups)
                if (up >= g.lost && up <= end) start = std::max(start, up);
            longest_gap = std::max(longest_gap, end - start);
            if (end - start > o_.lease_grace - margin) {
                ++lapses;
                Ms lapse = start + o_.lease_grace - margin;
                say("lease of ", id, " lapsed: lost at ", g.lost, ", regained at ", g.regained,
                    ", given up at ", g.given_up,
                    "; its containers count as reapable from ", lapse);
                for (auto& name : s.boxes) {
                    auto& b = boxes_.at(name);
                    if (!b.reapable || b.reapable > lapse) {
                        b.reapable = std::max(lapse, b.created);
                        b.why = "its lease lapsed";
                    }
                }
                if (!s.ended || s.ended > lapse) s.ended = lapse;
            }
        }
        // Containers created in a session after it lapsed are reapable from birth.
        if (s.ended)
            for (auto& name : s.boxes) {
                auto& b = boxes_.at(name);
                if (!b.reapable && b.created >= s.ended) {
                    b.reapable = b.created;
                    b.why = "created after its session ended";
                }
            }
    }

    if (!o_.out_dir.empty()) {
        std::ofstream logs(o_.out_dir + "/log-samples.csv");
        logs << "unix_ms,container,bytes,settled\n";
        for (auto& s : logs_) logs << s.at << ',' << s.box << ',' << s.bytes << ',' << settled(s.at) << '\n';
        std::ofstream procs(o_.out_dir + "/reaperd-samples.csv");
        procs << "unix_ms,pid,fds,leases,log_fds,rss_kib\n";
        for (auto& p : procs_)
            procs << p.at << ',' << p.pid << ',' << p.fds << ',' << p.leases << ',' << p.log_fds
                  << ',' << p.rss_kib << '\n';
    }

    struct Row {
        std::string check, figure;
        bool ok;
    };
    std::vector<Row> rows;
    std::vector<std::string> details;

    // 1. No protected container removed, by the engine's own destroy events.
    unsigned wrong = 0, by_driver = 0, by_reaperd = 0;
    for (auto& d : destroys_) {
        std::string name = by_id_.count(d.id) ? by_id_[d.id] : d.name;
        auto it = boxes_.find(name);
        if (it == boxes_.end()) {
            ++wrong;
            details.push_back("destroyed, not made by the driver: " + d.id + " " + d.name +
                              (d.labelled ? " session " + d.session : " (unlabeled)"));
            continue;
        }
        auto& b = it->second;
        if (b.driver_removed && b.driver_removed <= d.at + 1000) {
            ++by_driver;
            continue;
        }
        if (!d.labelled || !b.reapable || d.at < b.reapable) {
            ++wrong;
            std::ostringstream t;
            t << "REMOVED " << to_string(b.kind) << " container " << name << " (" << d.id.substr(0, 12)
              << ", session '" << b.session << "') at " << d.at;
            if (b.reapable) t << ", reapable only from " << b.reapable << " (" << b.why << ")";
            details.push_back(t.str());
            continue;
        }
        ++by_reaperd;
    }
    // And every protected container still exists (a removal the events missed shows here).
    unsigned protected_total = 0, protected_missing = 0;
    std::set<std::string> present;
    bool listed = retry_for(30'000, [&] {
        present.clear();
        for (auto& c : engine_->list_containers({.all = true}))
            for (auto& n : c.names) present.insert(n);
    });
    for (auto& [name, b] : boxes_) {
        if (b.reapable || b.driver_removed || b.id.empty()) continue;
        ++protected_total;
        if (listed && !present.count(name)) {
            ++protected_missing;
            details.push_back("protected " + std::string(to_string(b.kind)) + " container " +
                              name + " (session '" + b.session + "') is missing at the end");
        }
    }
    {
        std::ostringstream f;
        f << destroys_.size() << " destroys seen: " << by_reaperd << " allowed, " << by_driver
          << " by the driver, " << wrong << " wrong; " << protected_total
          << " protected present at end, " << protected_missing << " missing";
        rows.push_back({"no unlabeled/leased/unclaimed container removed", f.str(),
                        wrong == 0 && protected_missing == 0 && listed});
    }

    // 1b. The live library Sessions: none of their containers removed, every lease back.
    {
        unsigned sessions = 0, removed = 0, leased = 0;
        for (auto& [name, b] : boxes_) {
            if (b.kind != Kind::library || b.id.empty()) continue;
            ++sessions;
            if (destroyed_ids_.count(b.id) || (listed && !present.count(name))) ++removed;
        }
        for (auto& session : library_sessions_) leased += session->holds_lease();
        std::ostringstream f;
        f << sessions << " sessions through the reaperd kills: " << removed << " containers removed, "
          << leased << "/" << library_sessions_.size() << " holding their lease at the end";
        rows.push_back({"live library Sessions kept", f.str(),
                        sessions > 0 && removed == 0 && leased == library_sessions_.size()});
    }

    // 2. Every orphan reaped.
    unsigned reapable = 0, still_there = 0;
    for (auto& [name, b] : boxes_) {
        if (!b.reapable || b.driver_removed) continue;
        if (b.id.empty() && !present.count(name)) continue;  // never created
        ++reapable;
        if (present.count(name)) {
            ++still_there;
            details.push_back("NOT REAPED: " + std::string(to_string(b.kind)) + " container " +
                              name + " (session '" + b.session + "', " + b.why + " at " +
                              std::to_string(b.reapable) + ")");
        }
    }
    {
        std::ostringstream f;
        f << reapable - still_there << "/" << reapable << " gone";
        if (all_reaped_at_)
            f << ", the last " << std::fixed << std::setprecision(1)
              << (all_reaped_at_ - churn_end_) / 1000.0 << " s after the faults ended";
        f << " (deadline " << (o_.lease_grace + o_.reap_deadline) / 1000 << " s)";
        rows.push_back({"every orphan reaped", f.str(), still_there == 0 && listed});
    }

    // 3. Log caps held in every sample while a reaperd ran: settled, starting (re-listing
    // through the faulty proxy) or with the engine restarting.
    std::uint64_t max_settled = 0, max_unsettled = 0, max_any = 0;
    Ms max_any_at = 0;
    std::size_t n_counted = 0, n_unsettled = 0;
    for (auto& s : logs_) {
        if (s.bytes > max_any) {
            max_any = s.bytes;
            max_any_at = s.at;
        }
        if (!reaperd_running(s.at)) continue;
        ++n_counted;
        bool calm = settled(s.at);
        if (!calm) ++n_unsettled;
        auto& max = calm ? max_settled : max_unsettled;
        max = std::max(max, s.bytes);
        if (s.bytes > o_.log_bound)
            details.push_back("log of " + s.box + " at " + mib(s.bytes) + " at " + std::to_string(s.at) +
                              (calm ? " (settled)" : " (reaperd starting or the engine restarting)"));
    }
    {
        std::ostringstream f;
        f << "max " << mib(std::max(max_settled, max_unsettled)) << " in " << n_counted
          << " samples while a reaperd ran (" << mib(max_unsettled) << " in the " << n_unsettled
          << " of them while it started or the engine restarted; cap " << mib(o_.log_cap) << ", bound "
          << mib(o_.log_bound) << "); max " << mib(max_any) << " overall";
        for (auto& w : no_reaperd)
            if (max_any_at >= w.from && max_any_at <= w.to) {
                f << " (at +" << (max_any_at - run_start_) / 1000 << " s: " << w.why << ")";
                break;
            }
        rows.push_back({"log files within the bound in every sample", f.str(),
                        n_counted > 0 && max_settled <= o_.log_bound && max_unsettled <= o_.log_bound});
    }

    // 4. fd count and RSS of the longest-lived reaperd instance, early vs late.
    std::map<int, std::vector<ProcSample>> by_pid;
    for (auto& p : procs_) by_pid[p.pid].push_back(p);
    int longest = 0;
    Ms longest_life = 0;
    for (auto& [pid, v] : by_pid) {
        Ms life = v.back().at - v.front().at;
        if (life > longest_life) {
            longest_life = life;
            longest = pid;
        }
    }
    {
        bool ok = false;
        std::ostringstream f;
        if (longest && by_pid[longest].size() >= 20) {
            auto& v = by_pid[longest];
            // Skip the first 10 s of the instance (start-up, first sync); compare the first
            // quarter of its settled samples (a reaperd without an engine holds no engine
            // connections at all) with the last quiet seconds (churn stopped, orphans reaped).
            Ms warm = v.front().at + 10'000;
            Ms late_start = v.back().at - o_.quiet + 500;
            std::vector<ProcSample> early, late;
            for (auto& p : v) {
                if (p.at >= warm && p.at < late_start && settled(p.at)) early.push_back(p);
                if (p.at >= late_start) late.push_back(p);
            }
            early.resize(std::min(early.size(), std::max<std::size_t>(4, early.size() / 4)));
            if (!early.empty() && !late.empty()) {
                // Each lease the driver holds is one connection in reaperd, and each capped
                // container's log one open file: they follow the workload, so not counted.
                auto min_fd = [](auto& s) {
                    std::size_t m = SIZE_MAX;
                    for (auto& p : s)
                        m = std::min(m, p.fds - std::min(p.fds, p.leases + p.log_fds));
                    return m;
                };
                auto median_rss = [](auto s) {
                    std::sort(s.begin(), s.end(),
                              [](auto& a, auto& b) { return a.rss_kib < b.rss_kib; });
                    return s[s.size() / 2].rss_kib;
                };
                std::size_t fd_early = min_fd(early), fd_late = min_fd(late);
                std::uint64_t rss_early = median_rss(early), rss_late = median_rss(late);
                std::size_t fd_peak = 0;
                for (auto& p : v) fd_peak = std::max(fd_peak, p.fds);
                // fds: the engine client keeps up to 4 idle kept-alive connections whose
                // number depends on recent concurrency, so two quiet moments of a healthy
                // reaperd differ by up to 4; +2 for a lease or a status call in flight.
                bool fd_ok = fd_late <= fd_early + 6;
                // RSS: malloc's per-thread arenas and the removal workers' stacks grow with
                // the peak concurrency seen, not with the work done; 25% (at least 4 MiB) is
                // room for that, while a leak per container or session churned (hundreds
                // here) would keep growing through the run.
                bool rss_ok = rss_late <= std::max(rss_early * 5 / 4, rss_early + 4096);
                ok = fd_ok && rss_ok;
                f << "pid " << longest << " up " << longest_life / 1000 << " s: fds (less leases, logs) "
                  << fd_early << " -> " << fd_late << " (peak " << fd_peak << ", tol +6), RSS "
                  << std::fixed << std::setprecision(1) << rss_early / 1024.0 << " -> "
                  << rss_late / 1024.0 << " MiB (tol +25%/4 MiB)";
            } else {
                f << "too few samples of pid " << longest;
            }
        } else {
            f << "no reaperd instance sampled long enough";
        }
        rows.push_back({"reaperd fd count and RSS stable", f.str(), ok});
    }

    // Figures about the run itself.
    std::ostringstream run;
    run << created_ << " containers, " << session_serial_ << " short sessions (" << dropped_
        << " dropped, " << ended_ << " ended, " << orphans_ << " orphan reports), "
        << event_streams_ << " event streams followed";
    std::ostringstream faults_row;
    faults_row << engine_kills << " engine kills, " << reaperd_kills << " reaperd kills ("
               << by_pid.size() << " instances), " << ro_windows << " read-only state windows";
    std::string proxy;
    {
        std::ifstream in(o_.proxy_stats);
        std::string key;
        unsigned long count;
        while (in >> key >> count) proxy += (proxy.empty() ? "" : ", ") + key + " " + std::to_string(count);
    }
    std::ostringstream lapse_row;
    lapse_row << lapses << " (longest gap " << longest_gap << " ms, grace " << o_.lease_grace
              << " ms)";

    std::cout << "\nchaos run: seed " << o_.seed << ", " << (faults_end_ - run_start_) / 1000
              << " s of faults\n\n";
    std::size_t w = 0;
    for (auto& r : rows) w = std::max(w, r.check.size());
    auto line = [&](const std::string& a, const std::string& b, const std::string& c) {
        std::cout << std::left << std::setw(static_cast<int>(w) + 2) << a << std::setw(6) << c
                  << b << "\n";
    };
    line("check", "figures", "");
    bool all = true;
    for (auto& r : rows) {
        line(r.check, r.figure, r.ok ? "PASS" : "FAIL");
        all = all && r.ok;
    }
    line("(run)", run.str(), "");
    line("(faults)", faults_row.str(), "");
    line("(proxy faults)", proxy.empty() ? "none recorded" : proxy, "");
    line("(lease lapses)", lapse_row.str(), "");
    std::cout << "\n";
    for (auto& d : details) std::cout << "  " << d << "\n";
    std::cout << (all ? "chaos: PASS" : "chaos: FAIL") << std::endl;
    return all ? 0 : 1;
}

int usage() {
    std::cerr << "usage: chaos_driver --engine PATH --control PATH --faults-log FILE"
                 " --reaperd-pid FILE --proxy-stats FILE [--seed N] [--lease-grace-ms N]"
                 " [--log-cap BYTES] [--log-bound BYTES] [--reap-deadline-ms N] [--out-dir DIR]\n";
    return 64;
}

}  // namespace

int main(int argc, char** argv) {
    // A write to a connection the engine or reaperd closed (both are killed on purpose here)
    // must be an error to handle, not the end of the referee; reaperd ignores SIGPIPE too.
    std::signal(SIGPIPE, SIG_IGN);
    // Ends with the script, even one killed by SIGKILL (its trap cannot run then).
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    std::map<std::string, std::string> args;
    for (int i = 1; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
    for (const char* key : {"--engine", "--control", "--faults-log", "--reaperd-pid", "--proxy-stats"})
        if (!args.count(key)) return usage();
    Options o;
    o.engine_socket = args["--engine"];
    o.control_socket = args["--control"];
    o.faults_log = args["--faults-log"];
    o.reaperd_pid_file = args["--reaperd-pid"];
    o.proxy_stats = args["--proxy-stats"];
    if (args.count("--out-dir")) o.out_dir = args["--out-dir"];
    try {
        if (args.count("--seed")) o.seed = static_cast<unsigned>(std::stoul(args["--seed"]));
        if (args.count("--lease-grace-ms")) o.lease_grace = std::stoll(args["--lease-grace-ms"]);
        if (args.count("--log-cap")) o.log_cap = std::stoull(args["--log-cap"]);
        if (args.count("--log-bound")) o.log_bound = std::stoull(args["--log-bound"]);
        if (args.count("--reap-deadline-ms")) o.reap_deadline = std::stoll(args["--reap-deadline-ms"]);
    } catch (const std::exception&) {
        return usage();
    }
    try {
        Chaos chaos(o);
        return chaos.run();
    } catch (const std::exception& e) {
        say("failed: ", e.what());
        return 1;
    }
}
