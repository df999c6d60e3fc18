#include "logcap.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
#include <system_error>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

namespace reaperd {

using Clock = std::chrono::steady_clock;
using logcap::CapReason;

namespace {

std::string short_id(const std::string& id) { return id.substr(0, 12); }

std::string errno_text(int error) { return std::system_category().message(error); }

// Events on the log's directory that matter: writes to the live file (and the gzip of a
// rotation), and the live file being replaced, renamed or deleted by a rotation.
constexpr std::uint32_t watch_mask = IN_MODIFY | IN_CREATE | IN_MOVED_FROM | IN_MOVED_TO |
                                     IN_DELETE | IN_DELETE_SELF | IN_ONLYDIR | IN_EXCL_UNLINK;

struct RotatedScan {
    std::uint64_t bytes = 0;
    std::vector<std::string> names;
};

RotatedScan scan_rotations(const logcap::LogFiles& files) {
    RotatedScan scan;
    DIR* dir = ::opendir(files.dir.c_str());
    if (!dir) return scan;
    while (auto* entry = ::readdir(dir)) {
        if (!logcap::is_rotation(entry->d_name, files.live_name)) continue;
        struct stat st {};
        if (::fstatat(::dirfd(dir), entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        scan.bytes += static_cast<std::uint64_t>(st.st_size);
        scan.names.emplace_back(entry->d_name);
    }
    ::closedir(dir);
    return scan;
}

}  // namespace

// What the watcher knows of one container fed by the daemon.
struct Watched {
    ContainerLog info;
    logcap::CapSetting cap;
    std::optional<logcap::LogFiles> files;
    bool active = false;  // in scope, not exempt, some cap applies, and its files are known

    int wd = -1;       // inotify watch on files->dir
    int live_fd = -1;  // the live file, O_WRONLY for ftruncate
    std::uint64_t live_bytes = 0;
    std::uint64_t rotated_bytes = 0;
    bool rotated_dirty = true;
    bool dirty = true;
    logcap::GrowthEstimator growth;

    // Stopped, killed or removed for its log: no further action until it is fed again,
    // which the daemon does at each start. Not "until its log grows": the engine may still
    // flush the last lines a container wrote after the stop, and a write in progress shows
    // its size growing page by page (logcap_test saw a second stop that way).
    bool halted = false;
    bool busy = false;            // a job is with the worker
    Clock::time_point retry_at{};  // after a failed job
    bool would_logged = false;    // dry run: its would-be action was logged

    bool reported_bad_label = false;
    bool reported_not_capped = false;
    // A local-driver container fed before the data root was known waits a check interval
    // for it (see Loop::learn_root) before it is reported as not capped.
    bool root_wait_over = false;
    Clock::time_point fed_at{};

    // Truncations not yet logged (see Options::log_coalesce).
    unsigned pending_cuts = 0;
    std::uint64_t pending_dropped = 0;
    std::uint64_t pending_before = 0;
    std::uint64_t pending_after = 0;
    CapReason pending_reason = CapReason::own_cap;
    std::optional<Clock::time_point> last_record;

    std::uint64_t log_bytes() const { return live_bytes + rotated_bytes; }
};

struct LogCapper::Loop {
    LogCapper& owner;
    LogsConfig logs;
    int inotify_fd = -1;
    std::map<std::string, Watched> containers;
    std::map<int, std::vector<std::string>> by_wd;
    bool stopping = false;
    // The engine's data root as learned from a json-file LogPath, for local-driver
    // containers fed without ContainerLog::docker_root_dir.
    std::string learned_root;

    Loop(LogCapper& owner, LogsConfig logs) : owner(owner), logs(logs) {
        inotify_fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        if (inotify_fd < 0) throw std::system_error(errno, std::system_category(), "inotify_init1");
    }
    ~Loop() {
        for (auto& [id, w] : containers) close_live(w);
        ::close(inotify_fd);
    }

    const Options& options() const { return owner.options_; }
    void record(Priority p, std::string_view message_id, const std::string& message,
                std::vector<LogField> fields) {
        owner.options_.sink(p, message_id, message, std::move(fields));
    }
    std::vector<LogField> container_fields(const Watched& w, const std::string& action) {
        return {{"CONTAINER_ID", w.info.id},
                {"CONTAINER_NAME", w.info.name},
                {"SESSION_ID", w.info.session},
                {"ACTION", action}};
    }

    // ---- watching ------------------------------------------------------------------------
    void close_live(Watched& w) {
        if (w.live_fd >= 0) ::close(w.live_fd);
        w.live_fd = -1;
    }

    void unwatch(Watched& w) {
        close_live(w);
        if (w.wd < 0) return;
        auto it = by_wd.find(w.wd);
        if (it != by_wd.end()) {
            std::erase(it->second, w.info.id);
            if (it->second.empty()) {
                ::inotify_rm_watch(inotify_fd, w.wd);
                by_wd.erase(it);
            }
        }
        w.wd = -1;
    }

    // Sets up the watch and opens the live file if they are missing; both may not exist
    // yet (a created container gets its log at start), so this is retried on each backstop.
    void ensure_watch(Watched& w) {
        if (!w.active) return;
        if (w.wd < 0) {
            int wd = ::inotify_add_watch(inotify_fd, w.files->dir.c_str(), watch_mask);
            if (wd >= 0) {
                w.wd = wd;
                by_wd[wd].push_back(w.info.id);
                w.rotated_dirty = true;
            }
        }
        if (w.live_fd < 0) {
            std::string path = w.files->dir + "/" + w.files->live_name;
            int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY);
            struct stat st {};
            if (fd >= 0 && (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
                ::close(fd);
                fd = -1;
            }
            w.live_fd = fd;
        }
    }

    // Whether the backstop round numbered `round` re-reads this container's sizes. A watched
    // directory reports every write, create, rename and delete in it, and a lost event shows
    // as IN_Q_OVERFLOW, which marks everything dirty; so a watched container is re-read only
    // every 10th round, as a guard, and an unwatched one every round. Re-reading all of them
    // each round (an fstat, a stat and a readdir each) was most of reaperd's idle CPU: 0.18 s
    // a minute for 100 idle containers in daemon_bench (c), against a 0.06 s target.
    static bool backstop_due(const Watched& w, std::uint64_t round) {
        constexpr std::uint64_t watched_every = 10;
        return w.wd < 0 || round % watched_every == 0;
    }

    // Re-reads the sizes. `full` (the backstop) also checks that the open file is still the
    // one at the path and rescans the rotations, for a container whose directory is not
    // watched (see backstop_due).
    void measure(Watched& w, Clock::time_point now, bool full) {
        if (!w.active) return;
        full = full && w.wd < 0;
        if (full && w.live_fd >= 0) {
            struct stat open_st {}, path_st {};
            std::string path = w.files->dir + "/" + w.files->live_name;
            if (::fstat(w.live_fd, &open_st) != 0 || ::stat(path.c_str(), &path_st) != 0 ||
                open_st.st_ino != path_st.st_ino || open_st.st_dev != path_st.st_dev)
                close_live(w);
        }
        ensure_watch(w);
        w.live_bytes = 0;
        if (w.live_fd >= 0) {
            struct stat st {};
            if (::fstat(w.live_fd, &st) == 0 && st.st_nlink > 0) {
                w.live_bytes = static_cast<std::uint64_t>(st.st_size);
            } else {
                close_live(w);
                w.rotated_dirty = true;
            }
        }
        if (full || w.rotated_dirty) {
            w.rotated_bytes = scan_rotations(*w.files).bytes;
            w.rotated_dirty = false;
        }
        w.dirty = false;
        w.growth.observe(w.log_bytes(), now);
    }

    void on_inotify(bool& any) {
        alignas(struct inotify_event) char buffer[16 * 1024];
        while (true) {
            ssize_t n = ::read(inotify_fd, buffer, sizeof buffer);
            if (n <= 0) break;
            any = true;
            for (char* p = buffer; p < buffer + n;) {
                auto* event = reinterpret_cast<struct inotify_event*>(p);
                p += sizeof(struct inotify_event) + event->len;
                if (event->mask & IN_Q_OVERFLOW) {
                    for (auto& [id, w] : containers) w.dirty = w.rotated_dirty = true;
                    continue;
                }
                auto it = by_wd.find(event->wd);
                if (it == by_wd.end()) continue;
                if (event->mask & IN_IGNORED) {  // the directory is gone (container removed)
                    for (const auto& id : it->second) {
                        auto c = containers.find(id);
                        if (c == containers.end()) continue;
                        close_live(c->second);
                        c->second.wd = -1;
                        c->second.dirty = true;
                    }
                    by_wd.erase(it);
                    continue;
                }
                std::string_view name = event->len ? std::string_view(event->name) : std::string_view();
                for (const auto& id : it->second) {
                    auto c = containers.find(id);
                    if (c == containers.end()) continue;
                    Watched& w = c->second;
                    if (name == w.files->live_name) {
                        if (event->mask & (IN_CREATE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE)) {
                            close_live(w);  // rotated away or replaced: reopen by name
                            w.rotated_dirty = true;
                        }
                        w.dirty = true;
                    } else if (logcap::is_rotation(name, w.files->live_name)) {
                        w.rotated_dirty = true;
                        w.dirty = true;
                    }
                }
            }
        }
    }

    // ---- containers in and out ----------------------------------------------------------
    void refresh(Watched& w) {
        bool owned = !w.info.session.empty();
        auto old_files = w.files;
        w.cap = logcap::resolve_cap(w.info.labels, logs.max_size_bytes);
        const std::string& root = w.info.docker_root_dir.empty() ? learned_root : w.info.docker_root_dir;
        w.files = logcap::locate_log(w.info.id, w.info.log_driver, w.info.log_path, root);
        bool in_scope = owned || logs.scope == LogScope::all;
        bool wants_cap = in_scope && !w.cap.exempt &&
                         (w.cap.cap_bytes > 0 || logs.total_max_size_bytes > 0);
        if (wants_cap && w.cap.bad_label && !w.reported_bad_label) {
            w.reported_bad_label = true;
            auto fields = container_fields(w, "default");
            fields.push_back({"LABEL_VALUE", *w.cap.bad_label});
            record(Priority::warning, {},
                   "container " + w.info.name + " (" + short_id(w.info.id) + "): label " +
                       logcap::max_size_label + "=\"" + *w.cap.bad_label +
                       "\" is not a size (e.g. 100MiB); its log is capped at the default " +
                       format_size(logs.max_size_bytes),
                   std::move(fields));
        }
        bool awaiting_root = w.info.log_driver == "local" && root.empty() && !w.root_wait_over;
        if (wants_cap && !w.files && !w.reported_not_capped && !awaiting_root) {
            w.reported_not_capped = true;
            auto fields = container_fields(w, "none");
            fields.push_back({"LOG_DRIVER", w.info.log_driver});
            record(Priority::warning, {},
                   "container " + w.info.name + " (" + short_id(w.info.id) + "): its log driver \"" +
                       w.info.log_driver + "\" writes no file reaperd can cut" +
                       (w.info.log_driver == "local" ? " (the engine's data root is not known)" : "") +
                       "; its log is not capped",
                   std::move(fields));
        }
        w.active = wants_cap && w.files.has_value();
        // The files may have moved (the engine sets LogPath at the first start).
        if (!w.active || !old_files || !w.files || old_files->dir != w.files->dir ||
            old_files->live_name != w.files->live_name)
            unwatch(w);
        w.dirty = w.rotated_dirty = true;
        ensure_watch(w);
    }

    // The engine keeps every json-file log at <root>/containers/<id>/<id>-json.log, so one
    // such container tells where the local driver's files are too.
    void learn_root(const ContainerLog& info) {
        if (!learned_root.empty() || info.log_driver != "json-file") return;
        std::string tail = "/containers/" + info.id + "/" + info.id + "-json.log";
        const auto& path = info.log_path;
        if (info.id.empty() || path.size() <= tail.size() || path.compare(path.size() - tail.size(), tail.size(), tail) != 0)
            return;
        learned_root = path.substr(0, path.size() - tail.size());
        for (auto& [id, w] : containers)
            if (!w.active && w.info.log_driver == "local" && w.info.docker_root_dir.empty()) refresh(w);
    }

    // Local-driver containers still waiting for the data root have waited long enough.
    void end_root_waits(Clock::time_point now) {
        for (auto& [id, w] : containers)
            if (!w.active && !w.root_wait_over && w.info.log_driver == "local" &&
                now - w.fed_at >= logs.check_interval) {
                w.root_wait_over = true;
                refresh(w);
            }
    }

    void add(ContainerLog info) {
        auto [it, fresh] = containers.try_emplace(info.id);
        Watched& w = it->second;
        if (fresh) w.fed_at = Clock::now();
        w.halted = false;  // fed again: started again (see Watched::halted)
        w.info = std::move(info);
        refresh(w);
        learn_root(w.info);
    }

    void remove(const std::string& id) {
        auto it = containers.find(id);
        if (it == containers.end()) return;
        flush_record(it->second);
        unwatch(it->second);
        containers.erase(it);
    }

    void reconfigure(const LogsConfig& config) {
        logs = config;
        for (auto& [id, w] : containers) refresh(w);
    }

    // ---- acting --------------------------------------------------------------------------
    void truncate(Watched& w, CapReason reason, Clock::time_point now) {
        std::string path = w.files->dir + "/" + w.files->live_name;
        // A rotation may have happened since the last event was read: cut the file that is
        // at the path now, never a renamed rotation through a stale fd.
        struct stat open_st {}, path_st {};
        if (w.live_fd >= 0 && (::fstat(w.live_fd, &open_st) != 0 || ::stat(path.c_str(), &path_st) != 0 ||
                               open_st.st_ino != path_st.st_ino))
            close_live(w);
        ensure_watch(w);
        std::uint64_t before = 0;
        std::uint64_t dropped = 0;
        int error = 0;
        if (w.live_fd >= 0) {
            struct stat st {};
            if (::fstat(w.live_fd, &st) == 0) before = static_cast<std::uint64_t>(st.st_size);
            if (::ftruncate(w.live_fd, 0) == 0)
                dropped += before;
            else
                error = errno;
        }
        auto rotations = scan_rotations(*w.files);
        before += rotations.bytes;
        for (const auto& name : rotations.names) {
            std::string rotated = w.files->dir + "/" + name;
            struct stat st {};
            if (::stat(rotated.c_str(), &st) != 0) continue;
            if (::unlink(rotated.c_str()) == 0)
                dropped += static_cast<std::uint64_t>(st.st_size);
            else if (errno != ENOENT)
                error = errno;
        }
        w.rotated_dirty = true;
        measure(w, now, false);
        if (error != 0) {
            owner.counters_.action_failures++;
            auto fields = container_fields(w, "truncate");
            fields.push_back({"ERRNO", std::to_string(error)});
            record(Priority::warning, {},
                   "could not cut the log of container " + w.info.name + " (" + short_id(w.info.id) +
                       ") at " + path + ": " + errno_text(error) + "; will retry",
                   std::move(fields));
        }
        if (dropped == 0) return;
        owner.counters_.truncations++;
        owner.counters_.log_bytes_dropped += dropped;
        w.pending_cuts++;
        w.pending_dropped += dropped;
        w.pending_before = before;
        w.pending_after = w.log_bytes();
        w.pending_reason = reason;
        if (!w.last_record || now - *w.last_record >= options().log_coalesce) flush_record(w, now);
    }

    void flush_record(Watched& w, Clock::time_point now = Clock::now()) {
        if (w.pending_cuts == 0) return;
        auto fields = container_fields(w, "truncate");
        fields.push_back({"LOG_BYTES_BEFORE", std::to_string(w.pending_before)});
        fields.push_back({"LOG_BYTES_AFTER", std::to_string(w.pending_after)});
        fields.push_back({"LOG_BYTES_DROPPED", std::to_string(w.pending_dropped)});
        fields.push_back({"LOG_MAX_SIZE", std::to_string(w.cap.cap_bytes)});
        fields.push_back({"REASON", logcap::to_string(w.pending_reason)});
        fields.push_back({"ACTION_COUNT", std::to_string(w.pending_cuts)});
        std::string what = w.pending_cuts == 1
                               ? "from " + format_size(w.pending_before) + " to " + format_size(w.pending_after)
                               : std::to_string(w.pending_cuts) + " times, dropping " +
                                     format_size(w.pending_dropped) + " (last from " +
                                     format_size(w.pending_before) + " to " + format_size(w.pending_after) + ")";
        record(Priority::notice, message_id::log_capped,
               "cut the log of container " + w.info.name + " (" + short_id(w.info.id) + ") " + what +
                   (w.pending_reason == CapReason::own_cap
                        ? ", cap " + format_size(w.cap.cap_bytes)
                        : ", over the total budget " + format_size(logs.total_max_size_bytes)),
               std::move(fields));
        w.pending_cuts = 0;
        w.pending_dropped = 0;
        w.last_record = now;
    }

    void flush_due(Clock::time_point now) {
        for (auto& [id, w] : containers)
            if (w.pending_cuts > 0 && now - *w.last_record >= options().log_coalesce) flush_record(w, now);
    }

    std::optional<Clock::time_point> next_flush() const {
        std::optional<Clock::time_point> next;
        for (const auto& [id, w] : containers)
            if (w.pending_cuts > 0) {
                auto due = *w.last_record + options().log_coalesce;
                if (!next || due < *next) next = due;
            }
        return next;
    }

    void would(Watched& w, LogAction action, CapReason reason) {
        if (w.would_logged) return;
        w.would_logged = true;
        auto fields = container_fields(w, "would-" + std::string(to_string(action)));
        fields.push_back({"LOG_BYTES_BEFORE", std::to_string(w.log_bytes())});
        fields.push_back({"LOG_BYTES_AFTER", std::to_string(w.log_bytes())});
        fields.push_back({"LOG_MAX_SIZE", std::to_string(w.cap.cap_bytes)});
        fields.push_back({"REASON", logcap::to_string(reason)});
        record(Priority::notice, message_id::log_capped,
               "dry run: would " + std::string(to_string(action)) + " container " + w.info.name +
                   " (" + short_id(w.info.id) + "), its log is " + format_size(w.log_bytes()),
               std::move(fields));
    }

    // Kept between rounds so a round allocates nothing while nothing is decided.
    std::vector<Watched*> order;
    std::vector<logcap::CapTarget> targets;

    void decide_and_act(Clock::time_point now) {
        // Read at each round: a reload that turns dry run on reaches the capper at once.
        const bool dry_run = owner.guard_.config()->dry_run;
        order.clear();
        std::size_t n = 0;
        for (auto& [id, w] : containers) {
            if (!w.active) continue;
            if (targets.size() <= n) targets.emplace_back();
            logcap::CapTarget& t = targets[n++];
            t.id = id;
            t.owned = !w.info.session.empty();
            t.cap = w.cap;
            t.log_bytes = w.log_bytes();
            t.headroom_bytes = logcap::headroom_for(w.growth.bytes_per_second());
            t.halted = w.halted;
            t.busy = w.busy || now < w.retry_at || (dry_run && w.would_logged);
            order.push_back(&w);
        }
        targets.resize(n);
        for (const auto& d : logcap::decide(targets, logs)) {
            Watched& w = *order[d.target];
            if (dry_run) {
                would(w, d.action, d.reason);
            } else if (d.action == LogAction::truncate) {
                truncate(w, d.reason, now);
            } else if (!w.info.session.empty()) {  // the policy's rule, held once more here
                w.busy = true;
                owner.submit(Job{w.info.id, d.action, d.reason, w.log_bytes()});
            }
        }
    }

    // How long the next inotify round may wait (see Options::min_check_interval).
    Clock::duration check_gap() const {
        using Seconds = std::chrono::duration<double>;
        Clock::duration gap = options().max_check_interval;
        auto consider = [&](std::uint64_t bytes, std::uint64_t mark, double rate) {
            if (rate <= 0) return;
            double seconds = bytes >= mark ? 0.0 : double(mark - bytes) / rate / 2;
            gap = std::min(gap, std::chrono::duration_cast<Clock::duration>(Seconds(seconds)));
        };
        std::uint64_t total_bytes = 0;
        double total_rate = 0;
        for (const auto& [id, w] : containers) {
            if (!w.active || w.halted || w.cap.exempt) continue;
            double rate = w.growth.bytes_per_second();
            if (w.cap.cap_bytes > 0)
                consider(w.log_bytes(), logcap::mark_for(w.cap.cap_bytes, logcap::headroom_for(rate)), rate);
            total_bytes += w.log_bytes();
            total_rate += rate;
        }
        if (logs.total_max_size_bytes > 0)
            consider(total_bytes,
                     logcap::mark_for(logs.total_max_size_bytes, logcap::headroom_for(total_rate)), total_rate);
        return std::max<Clock::duration>(gap, options().min_check_interval);
    }

    // The worker's answer to a job: what the door made of it.
    void job_done(const Job& job, const GuardResult& result) {
        auto it = containers.find(job.id);
        if (it == containers.end()) return;
        Watched& w = it->second;
        w.busy = false;
        measure(w, Clock::now(), false);
        switch (result.outcome) {
            case Outcome::acted: break;
            case Outcome::gone:
            case Outcome::removing:
            case Outcome::not_running:
                w.halted = true;  // gone, going, or stopped already (by us, or it exited)
                return;
            case Outcome::dry_run:
                w.would_logged = true;  // the door logged it; not again while the dry run lasts
                return;
            case Outcome::refused_not_owned:
                // Not session-owned under the labels now in force (a reload changed them):
                // from now on it is what an unowned container is to the capper, at most cut.
                w.info.session.clear();
                refresh(w);
                return;
            case Outcome::refused_not_pinned:
            case Outcome::refused_other_session:
            case Outcome::refused_session_alive:
                w.halted = true;  // the door logged why; nothing more until it is fed again
                return;
            case Outcome::failed: break;
        }
        auto fields = container_fields(w, std::string(to_string(job.action)));
        fields.push_back({"LOG_BYTES_BEFORE", std::to_string(job.log_bytes_before)});
        fields.push_back({"LOG_BYTES_AFTER", std::to_string(w.log_bytes())});
        fields.push_back({"LOG_MAX_SIZE", std::to_string(w.cap.cap_bytes)});
        fields.push_back({"REASON", logcap::to_string(job.reason)});
        std::string subject = "container " + w.info.name + " (" + short_id(w.info.id) + ")";
        if (result.outcome == Outcome::acted) {
            w.halted = true;
            record(Priority::notice, message_id::log_capped,
                   std::string(job.action == LogAction::stop   ? "stopped "
                               : job.action == LogAction::kill ? "killed "
                                                               : "removed ") +
                       subject + " of session " + w.info.session + ": its log reached " +
                       format_size(job.log_bytes_before) +
                       (job.reason == CapReason::own_cap
                            ? ", cap " + format_size(w.cap.cap_bytes)
                            : ", over the total budget " + format_size(logs.total_max_size_bytes)),
                   std::move(fields));
        } else {
            w.retry_at = Clock::now() + options().retry_interval;
            fields.push_back({"ERROR", result.error});
            record(Priority::warning, {},
                   "could not " + std::string(to_string(job.action)) + " " + subject +
                       " over its log cap: " + result.error + "; will retry",
                   std::move(fields));
        }
    }
};

LogCapper::LogCapper(Guard& guard, Options options) : LogCapper(nullptr, &guard, std::move(options)) {}

// `options` is passed on as a copy: its sink is read for the door in the same call.
LogCapper::LogCapper(reaper::Engine& engine, Options options)
    : LogCapper(std::make_unique<Guard>(engine, GuardConfig{}, options.sink), nullptr, options) {}

LogCapper::LogCapper(std::unique_ptr<Guard> own_guard, Guard* shared_guard, Options options)
    : own_guard_(std::move(own_guard)),
      guard_(shared_guard ? *shared_guard : *own_guard_),
      options_(std::move(options)) {
    loop_ = std::make_unique<Loop>(*this, options_.logs);
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) throw std::system_error(errno, std::system_category(), "eventfd");
}

LogCapper::~LogCapper() {
    stop();
    loop_.reset();
    ::close(wake_fd_);
}

void LogCapper::start() {
    if (watcher_.joinable() || stopping_) return;
    watcher_ = std::thread([this] { run_watcher(); });
    worker_ = std::thread([this] { run_worker(); });
}

void LogCapper::stop() {
    {
        std::lock_guard lock(jobs_mutex_);
        if (stopping_) return;
        stopping_ = true;
    }
    jobs_cv_.notify_all();
    post([](Loop& loop) { loop.stopping = true; });
    if (watcher_.joinable()) watcher_.join();
    if (worker_.joinable()) worker_.join();
}

void LogCapper::post(std::function<void(Loop&)> message) {
    {
        std::lock_guard lock(inbox_mutex_);
        inbox_.push_back(std::move(message));
    }
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
}

void LogCapper::submit(Job job) {
    {
        std::lock_guard lock(jobs_mutex_);
        jobs_.push_back(std::move(job));
    }
    jobs_cv_.notify_one();
}

void LogCapper::add(ContainerLog container) {
    post([c = std::move(container)](Loop& loop) mutable { loop.add(std::move(c)); });
}

void LogCapper::remove(const std::string& id) {
    post([id](Loop& loop) { loop.remove(id); });
}

void LogCapper::reconfigure(const LogsConfig& logs) {
    post([logs](Loop& loop) { loop.reconfigure(logs); });
}

LogCapCounters LogCapper::counters() const {
    LogCapCounters c;
    c.log_bytes_dropped = counters_.log_bytes_dropped;
    c.truncations = counters_.truncations;
    c.stops = counters_.stops;
    c.kills = counters_.kills;
    c.removals = counters_.removals;
    c.action_failures = counters_.action_failures;
    c.check_rounds = counters_.check_rounds;
    return c;
}

void LogCapper::run_watcher() {
    ::pthread_setname_np(::pthread_self(), "reaperd-logcap");
    Loop& loop = *loop_;
    auto next_backstop = Clock::now();
    std::uint64_t backstop_round = 0;
    auto last_round = Clock::time_point{};
    Clock::duration gap = options_.max_check_interval;
    while (!loop.stopping) {
        auto now = Clock::now();
        bool events_allowed = now >= last_round + gap;
        auto deadline = next_backstop;
        if (!events_allowed) deadline = std::min(deadline, last_round + gap);
        if (auto flush = loop.next_flush()) deadline = std::min(deadline, *flush);
        auto wait = std::max(Clock::duration::zero(), deadline - now);
        struct timespec timeout {};
        timeout.tv_sec = std::chrono::duration_cast<std::chrono::seconds>(wait).count();
        timeout.tv_nsec = std::chrono::duration_cast<std::chrono::nanoseconds>(
                              wait - std::chrono::seconds(timeout.tv_sec)).count();
        struct pollfd fds[2] = {{wake_fd_, POLLIN, 0},
                                {loop.inotify_fd, static_cast<short>(events_allowed ? POLLIN : 0), 0}};
        ::ppoll(fds, 2, &timeout, nullptr);

        bool changed = false;
        if (fds[0].revents & POLLIN) {
            std::uint64_t count = 0;
            [[maybe_unused]] auto n = ::read(wake_fd_, &count, sizeof count);
            std::deque<std::function<void(Loop&)>> messages;
            {
                std::lock_guard lock(inbox_mutex_);
                messages.swap(inbox_);
            }
            for (auto& message : messages) message(loop);
            changed = !messages.empty();
            watched_ = static_cast<std::size_t>(std::count_if(
                loop.containers.begin(), loop.containers.end(), [](const auto& c) { return c.second.active; }));
        }
        if (loop.stopping) break;
        now = Clock::now();
        if (events_allowed && (fds[1].revents & POLLIN)) {
            bool any = false;
            loop.on_inotify(any);
            if (any) {
                last_round = now;
                changed = true;
            }
        }
        bool full = now >= next_backstop;
        if (full) {
            loop.end_root_waits(now);
            next_backstop = now + options_.logs.check_interval;
            ++backstop_round;
            changed = true;
        }
        if (changed) {
            counters_.check_rounds++;
            for (auto& [id, w] : loop.containers)
                if (w.active && (w.dirty || (full && Loop::backstop_due(w, backstop_round))))
                    loop.measure(w, now, full);
            loop.decide_and_act(now);
            gap = loop.check_gap();
        }
        loop.flush_due(now);
    }
    for (auto& [id, w] : loop.containers) loop.flush_record(w);
}

void LogCapper::run_worker() {
    while (true) {
        Job job;
        {
            std::unique_lock lock(jobs_mutex_);
            jobs_cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
            if (stopping_) return;
            job = std::move(jobs_.front());
            jobs_.pop_front();
        }
        GuardRequest request;
        request.container = job.id;
        request.act = job.action == LogAction::stop   ? ContainerAct::stop
                      : job.action == LogAction::kill ? ContainerAct::kill
                                                      : ContainerAct::remove;
        request.reason = logcap::to_string(job.reason);
        request.stop_grace = options_.stop_grace;
        GuardResult result = guard_.act(request);
        if (result.outcome == Outcome::acted) {
            auto& counter = job.action == LogAction::stop   ? counters_.stops
                            : job.action == LogAction::kill ? counters_.kills
                                                            : counters_.removals;
            counter++;
        } else if (result.outcome == Outcome::failed) {
            counters_.action_failures++;
        }
        post([job, result = std::move(result)](Loop& loop) { loop.job_done(job, result); });
    }
}

}  // namespace reaperd
