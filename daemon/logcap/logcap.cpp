#include "logcap.hpp"

#include "logcap_file.hpp"
#include "logcap_inotify.hpp"
#include "logcap_records.hpp"
#include "read_all.hpp"

#include <Poco/JSON/Array.h>
#include <Poco/JSON/Object.h>
#include <Poco/JSON/Parser.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <optional>
#include <sstream>
#include <system_error>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

namespace reaperd {

using Clock = std::chrono::steady_clock;
using reaper::detail::UniqueFd;
using logcap::CapReason;

namespace {

// A 70 MB/s writer under a cap leaves the capper's watcher thread the time the log takes
// from its mark to its cap (~65 ms under 10 MiB, ~16 ms under 2 MiB). Beside CPU-bound jobs
// on 2 cores the thread waited longer than that for a core, however niced: strace showed its
// ppoll with a 7 ms timeout returning after 111 ms. Beside one CPU-bound job, a 70 MB/s
// runaway's log reached 14-68 MB under a 10 MiB cap (median 29) at nice 0 and 11-25 MB
// (median 13) at nice -10. Under a 2 MiB cap beside three such jobs (bench/logcap_bench, 3
// alternated rounds each) its peak was 1.19-1.53x the cap at nice -10 and 0.60-0.61x in the
// real-time round-robin class at its lowest priority. So the thread asks for that class first: it uses a few % of a
// core (bench/logcap_bench) and sleeps in ppoll between checks, and the kernel's real-time
// throttling bounds it even if it did not. SCHED_RESET_ON_FORK keeps the class from
// anything it might start. Refused (no CAP_SYS_NICE nor RLIMIT_RTPRIO, a cgroup with no
// real-time budget, a seccomp filter), it asks for nice -10, and without even that right it
// runs at the process's nice.
enum class CapperScheduling { realtime, nice, process };

constexpr int capper_rt_priority = 1;
constexpr int capper_nice = -10;

CapperScheduling raise_capper_thread() {
    struct sched_param param {};
    param.sched_priority = capper_rt_priority;
    if (::sched_setscheduler(0, SCHED_RR | SCHED_RESET_ON_FORK, &param) == 0) return CapperScheduling::realtime;
    if (::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), capper_nice) == 0) return CapperScheduling::nice;
    return CapperScheduling::process;
}

// The start-up record's SCHEDULING field value and message for what the thread got.
struct SchedulingRecord {
    std::string_view field;
    std::string_view message;
};

SchedulingRecord describe(CapperScheduling s) {
    switch (s) {
        case CapperScheduling::realtime: return {"realtime", "log capper thread in the real-time class (SCHED_RR 1)"};
        case CapperScheduling::nice: return {"nice", "log capper thread at nice -10 (the real-time class refused)"};
        case CapperScheduling::process: break;
    }
    return {"process", "log capper thread at the process's nice (both raises refused)"};
}

std::string errno_text(int error) { return std::system_category().message(error); }

// Writes `text` to `path`.tmp and renames it over `path`; returns 0 or the errno. No fsync:
// the file is a hint checked against each log's device and inode when it is loaded, and one
// that a power cut leaves empty or torn is ignored, capping then waiting for the engine as
// it did before the file existed. An fsync on the capper's thread would delay cuts instead.
int replace_file(const std::string& path, const std::string& text) {
    std::string temp = path + ".tmp";
    UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!fd) return errno;
    int error = 0;
    for (std::size_t done = 0; done < text.size();) {
        ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            error = errno;
            break;
        }
        done += static_cast<std::size_t>(n);
    }
    if (!fd.close_checked() && error == 0) error = errno;
    if (error == 0 && ::rename(temp.c_str(), path.c_str()) != 0) error = errno;
    if (error != 0) ::unlink(temp.c_str());
    return error;
}

}  // namespace

// What the watcher knows of one container fed by the daemon.
struct Watched {
    ContainerLog info;
    logcap::CapSetting cap;
    std::optional<LogFiles> files;
    bool active = false;  // in scope, not exempt, some cap applies, and its files are known

    int wd = -1;          // inotify watch on files->dir
    logcap::LogFile log;  // the live file (open for ftruncate), its identity, the sizes
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

    // Loaded from Options::persist_path and not fed by the daemon since: only cut.
    bool from_disk = false;

    // Why the log directory or live file could not be opened at the last try (0: it could,
    // or the file does not exist yet), and where; the backstop rounds it has lasted.
    int open_error = 0;
    std::string open_error_path;
    unsigned failing_rounds = 0;
    // The directory was watched once: its going away later is the container's removal.
    bool dir_seen = false;
    bool reported_unopenable = false;

    bool reported_bad_label = false;
    bool reported_not_capped = false;
    // A local-driver container fed before the data root was known waits a check interval
    // for it (see Loop::learn_root) before it is reported as not capped.
    bool root_wait_over = false;
    Clock::time_point fed_at{};

    logcap::CutCoalescer cuts;  // truncations not yet told (see Options::log_coalesce)
    // Its file system refused a punch: it is cut by truncating from then on (one warning).
    bool punch_refused = false;

    std::uint64_t log_bytes() const { return log.log_bytes(); }
    logcap::RecordSubject subject() const { return {info.id, info.name, info.session}; }
};

struct LogCapper::Loop {
    LogCapper& owner;
    LogsConfig logs;
    logcap::InotifyDispatcher inotify;
    std::map<std::string, Watched, std::less<>> containers;
    bool stopping = false;
    // A settle() is among the messages just run: read the events even inside the check gap.
    bool settle_asked = false;
    // The engine's data root as learned from a json-file LogPath, for local-driver
    // containers fed without ContainerLog::docker_root_dir.
    std::string learned_root;
    // The persisted list (Options::persist_path): what was last written, whether it may
    // have changed since, when it may be written next, and whether the last write failed.
    std::string persisted_text;
    bool persist_dirty = false;
    Clock::time_point next_persist{};
    bool persist_failing = false;

    Loop(LogCapper& owner, LogsConfig logs) : owner(owner), logs(logs) {}

    const Options& options() const { return owner.options_; }
    Clock::time_point clock() const { return owner.options_.clock(); }
    void record(Priority p, std::string_view message_id, const std::string& message,
                std::vector<LogField> fields) {
        owner.options_.sink(p, message_id, message, std::move(fields));
    }

    // ---- watching ------------------------------------------------------------------------
    void unwatch(Watched& w) {
        w.log.close();
        inotify.unwatch(w.wd, w.info.id);
        w.wd = -1;
    }

    // Sets up the watch and opens the live file if they are missing; both may not exist
    // yet (a created container gets its log at start), so this is retried on each backstop.
    // Notes in w.open_error why the directory or the live file cannot be opened: any error
    // on the directory, unless it was watched before (then it went with its container), and
    // any error but ENOENT on the live file (a container not started yet has none, and a
    // rotation leaves none for a moment).
    void ensure_watch(Watched& w) {
        if (!w.active) return;
        int error = 0;
        std::string where;
        if (w.wd < 0) {
            int wd = inotify.watch(w.files->dir, w.info.id);
            if (wd >= 0) {
                w.wd = wd;
                w.log.mark_rotations();
                w.dir_seen = true;
            } else if (errno != ENOENT || !w.dir_seen) {
                error = errno;
                where = w.files->dir;
            }
        }
        bool identity_changed = false;
        const int open_errno = w.log.open_if_closed(*w.files, identity_changed);
        if (identity_changed) {
            persist_dirty = true;
        } else if (open_errno != 0 && open_errno != ENOENT && error == 0) {
            error = open_errno;
            where = logcap::live_path(*w.files);
        }
        w.open_error = error;
        w.open_error_path = where;
    }

    // At each backstop round: a log that could not be opened at two rounds in a row (one
    // could be a container removed before the daemon said so) is warned about, once.
    void check_unopenable() {
        std::uint64_t unopenable = 0;
        for (auto& [id, w] : containers) {
            if (!w.active || w.open_error == 0) {
                w.failing_rounds = 0;
                continue;
            }
            if (++w.failing_rounds < 2) continue;
            ++unopenable;
            if (w.reported_unopenable) continue;
            w.reported_unopenable = true;
            owner.counters_.log_open_failures++;
            auto fields = logcap::container_fields(w.subject(), "none");
            fields.push_back({"LOG_PATH", w.open_error_path});
            fields.push_back({"ERROR", errno_text(w.open_error)});
            fields.push_back({"ERRNO", std::to_string(w.open_error)});
            record(Priority::warning, {},
                   "cannot open the log of " + logcap::describe(w.subject()) + " at " + w.open_error_path + ": " +
                       errno_text(w.open_error) + "; its log is not capped while this lasts",
                   std::move(fields));
        }
        owner.counters_.log_unopenable = unopenable;
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
        if (full) w.log.close_if_replaced(*w.files);
        ensure_watch(w);
        w.log.measure_live();
        w.log.measure_rotations(*w.files, full);
        w.dirty = false;
        w.growth.observe(w.log_bytes(), now);
    }

    // Turns the queued inotify events into dirty marks; returns whether there were any.
    bool on_inotify() {
        using Kind = logcap::DirEvent::Kind;
        return inotify.drain([&](const logcap::DirEvent& event) {
            if (event.kind == Kind::overflow) {
                for (auto& [id, w] : containers) {
                    w.dirty = true;
                    w.log.mark_rotations();
                }
                return;
            }
            auto c = containers.find(event.id);
            if (c == containers.end()) return;
            Watched& w = c->second;
            if (event.kind == Kind::dir_gone) {  // the directory is gone (container removed)
                w.log.close();
                w.wd = -1;
                w.dirty = true;
            } else if (!w.files) {
                return;
            } else if (event.name == w.files->live_name) {
                if (event.replaced) {
                    w.log.close();  // rotated away or replaced: reopen by name
                    w.log.mark_rotations();
                }
                w.dirty = true;
            } else if (is_rotation(event.name, w.files->live_name)) {
                w.log.mark_rotations();
                w.dirty = true;
            }
        });
    }

    // ---- containers in and out ----------------------------------------------------------
    void refresh(Watched& w) {
        bool owned = !w.info.session.empty();
        auto old_files = w.files;
        w.cap = logcap::resolve_cap(w.info.labels, logs.max_size_bytes);
        w.cap.engine_rotates = w.cap.cap_bytes > 0 && w.info.rotation_bound_bytes &&
                               *w.info.rotation_bound_bytes <= w.cap.cap_bytes;
        const std::string& root = w.info.docker_root_dir.empty() ? learned_root : w.info.docker_root_dir;
        w.files = locate_log(w.info.id, w.info.log_driver, w.info.log_path, root);
        bool in_scope = owned || logs.scope == LogScope::all;
        bool wants_cap = in_scope && !w.cap.exempt &&
                         (w.cap.cap_bytes > 0 || logs.total_max_size_bytes > 0);
        if (wants_cap && w.cap.bad_label && !w.reported_bad_label) {
            w.reported_bad_label = true;
            auto fields = logcap::container_fields(w.subject(), "default");
            fields.push_back({"LABEL_VALUE", *w.cap.bad_label});
            record(Priority::warning, {},
                   logcap::describe(w.subject()) + ": label " + logcap::max_size_label + "=\"" + *w.cap.bad_label +
                       "\" is not a size (e.g. 100MiB); its log is capped at the default " +
                       format_size(logs.max_size_bytes),
                   std::move(fields));
        }
        bool awaiting_root = w.info.log_driver == "local" && root.empty() && !w.root_wait_over;
        if (wants_cap && !w.files && !w.reported_not_capped && !awaiting_root) {
            w.reported_not_capped = true;
            auto fields = logcap::container_fields(w.subject(), "none");
            fields.push_back({"LOG_DRIVER", w.info.log_driver});
            record(Priority::warning, {},
                   logcap::describe(w.subject()) + ": its log driver \"" + w.info.log_driver +
                       "\" writes no file reaperd can cut" +
                       (w.info.log_driver == "local" ? " (the engine's data root is not known)" : "") +
                       "; its log is not capped",
                   std::move(fields));
        }
        w.active = wants_cap && w.files.has_value();
        // The files may have moved (the engine sets LogPath at the first start).
        if (!w.active || !old_files || !w.files || old_files->dir != w.files->dir ||
            old_files->live_name != w.files->live_name)
            unwatch(w);
        w.dirty = true;
        w.log.mark_rotations();
        ensure_watch(w);
    }

    // One json-file container tells where the local driver's files are too.
    void learn_root(const ContainerLog& info) {
        if (!learned_root.empty() || info.log_driver != "json-file") return;
        auto root = data_root_of_json_log(info.id, info.log_path);
        if (!root) return;
        learned_root = std::move(*root);
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
        if (fresh) w.fed_at = clock();
        w.halted = false;  // fed again: started again (see Watched::halted)
        w.from_disk = false;
        w.info = std::move(info);
        refresh(w);
        learn_root(w.info);
        persist_dirty = true;
    }

    void remove(const std::string& id) {
        auto it = containers.find(id);
        if (it == containers.end()) return;
        flush_record(it->second, clock());
        unwatch(it->second);
        containers.erase(it);
        persist_dirty = true;
    }

    void forget_unlisted(const std::set<std::string>& listed) {
        std::vector<std::string> gone;
        for (const auto& [id, w] : containers)
            if (w.from_disk && !listed.count(id)) gone.push_back(id);
        for (const auto& id : gone) remove(id);
    }

    // ---- the persisted list ---------------------------------------------------------------
    // {"version":1,"containers":[{"id","name","session","log_driver","log_path",
    //  "docker_root_dir","max_size_label" (if set),"dev","ino","halted"}]}: the active
    // containers whose live file was opened once.
    std::string encode_persisted() const {
        Poco::JSON::Array list;
        for (const auto& [id, w] : containers) {
            if (!w.active || w.log.ino() == 0) continue;
            Poco::JSON::Object o;
            o.set("id", w.info.id);
            o.set("name", w.info.name);
            o.set("session", w.info.session);
            o.set("log_driver", w.info.log_driver);
            o.set("log_path", w.info.log_path);
            o.set("docker_root_dir", w.info.docker_root_dir.empty() ? learned_root : w.info.docker_root_dir);
            if (auto label = w.info.labels.find(logcap::max_size_label); label != w.info.labels.end())
                o.set("max_size_label", label->second);
            o.set("dev", static_cast<Poco::UInt64>(w.log.dev()));
            o.set("ino", static_cast<Poco::UInt64>(w.log.ino()));
            o.set("halted", w.halted);
            list.add(o);
        }
        Poco::JSON::Object root;
        root.set("version", 1);
        root.set("containers", list);
        std::ostringstream out;
        root.stringify(out);
        return out.str();
    }

    void persist(Clock::time_point now) {
        const std::string& path = options().persist_path;
        persist_dirty = false;
        next_persist = now + options().persist_interval;
        std::string text = encode_persisted();
        if (text == persisted_text) return;
        if (int error = replace_file(path, text)) {
            persist_dirty = true;  // again at the next interval
            if (!persist_failing)
                record(Priority::warning, {},
                       "cannot write " + path + ": " + errno_text(error) +
                           "; after a restart, logs are capped only once the engine has listed them",
                       {{"ERROR", errno_text(error)}, {"ERRNO", std::to_string(error)}});
            persist_failing = true;
            return;
        }
        if (persist_failing) record(Priority::info, {}, "wrote " + path + " again", {});
        persist_failing = false;
        persisted_text = std::move(text);
    }

    // Loads the persisted list and starts watching what it names; see the header.
    void load_persisted() {
        const std::string& path = options().persist_path;
        UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
        if (!fd) {
            if (errno != ENOENT)
                record(Priority::warning, {}, "cannot read " + path + ": " + errno_text(errno) +
                           "; logs are capped once the engine has listed them",
                       {{"ERROR", errno_text(errno)}});
            return;
        }
        std::string text;
        int error = read_all(fd.get(), text);
        fd.reset();
        std::vector<ContainerLog> entries;
        std::vector<std::pair<std::uint64_t, std::uint64_t>> identities;
        std::vector<bool> halted;
        try {
            if (error != 0) throw std::system_error(error, std::system_category(), "read");
            Poco::JSON::Parser parser;
            auto root = parser.parse(text).extract<Poco::JSON::Object::Ptr>();
            auto list = root->getArray("containers");
            for (std::size_t i = 0; i < list->size(); ++i) {
                auto o = list->getObject(static_cast<unsigned>(i));
                ContainerLog c;
                c.id = o->getValue<std::string>("id");
                c.name = o->getValue<std::string>("name");
                c.session = o->getValue<std::string>("session");
                c.log_driver = o->getValue<std::string>("log_driver");
                c.log_path = o->getValue<std::string>("log_path");
                c.docker_root_dir = o->getValue<std::string>("docker_root_dir");
                if (o->has("max_size_label"))
                    c.labels[logcap::max_size_label] = o->getValue<std::string>("max_size_label");
                entries.push_back(std::move(c));
                identities.emplace_back(o->getValue<Poco::UInt64>("dev"), o->getValue<Poco::UInt64>("ino"));
                halted.push_back(o->getValue<bool>("halted"));
            }
        } catch (const std::exception& e) {  // Poco::Exception derives from it
            record(Priority::warning, {},
                   "ignoring " + path + " (" + e.what() + "); logs are capped once the engine has listed them",
                   {{"ERROR", e.what()}});
            return;
        }
        auto now = clock();
        std::size_t loaded = 0;
        for (std::size_t i = 0; i < entries.size(); ++i) {
            auto files = locate_log(entries[i].id, entries[i].log_driver, entries[i].log_path,
                                            entries[i].docker_root_dir);
            struct stat st {};
            if (!files || containers.count(entries[i].id) ||
                ::stat((files->dir + "/" + files->live_name).c_str(), &st) != 0 ||
                st.st_dev != identities[i].first || st.st_ino != identities[i].second)
                continue;  // gone, or another file now: dropped quietly
            Watched& w = containers[entries[i].id];
            w.fed_at = now;
            w.from_disk = true;
            w.halted = halted[i];
            w.log.set_identity(st.st_dev, st.st_ino);
            w.info = std::move(entries[i]);
            refresh(w);
            if (!w.active) {  // out of scope under the config now in force
                unwatch(w);
                std::string id = w.info.id;
                containers.erase(id);
                continue;
            }
            ++loaded;
        }
        persisted_text = text;
        if (loaded > 0)
            record(Priority::info, {},
                   "capping " + std::to_string(loaded) + " logs known from " + path +
                       " before the engine answers",
                   {{"LOGS", std::to_string(loaded)}});
    }

    void reconfigure(const LogsConfig& config) {
        logs = config;
        for (auto& [id, w] : containers) refresh(w);
    }

    // ---- acting --------------------------------------------------------------------------
    void truncate(Watched& w, CapReason reason, const logcap::CutPlan& plan, Clock::time_point now) {
        // A rotation may have happened since the last event was read: cut the file that is
        // at the path now, never a renamed rotation through a stale fd.
        w.log.close_if_replaced(*w.files);
        ensure_watch(w);
        const std::uint64_t apparent = w.log.apparent_bytes();
        const logcap::CutOutcome cut = w.log.cut(*w.files, plan, options().cut_calls);
        measure(w, now, false);
        if (cut.error != 0) {
            owner.counters_.action_failures++;
            auto fields = logcap::container_fields(w.subject(), "truncate");
            fields.push_back({"ERRNO", std::to_string(cut.error)});
            record(Priority::warning, {},
                   "could not cut the log of " + logcap::describe(w.subject()) + " at " +
                       logcap::live_path(*w.files) + ": " + errno_text(cut.error) + "; will retry",
                   std::move(fields));
        }
        if (cut.live_method == logcap::CutMethod::truncate) owner.counters_.cut_fallbacks++;
        if (cut.punch_refused && !std::exchange(w.punch_refused, true)) {
            auto fields = logcap::container_fields(w.subject(), "truncate");
            fields.push_back({"LOG_PATH", logcap::live_path(*w.files)});
            fields.push_back({"ERROR", errno_text(cut.punch_error)});
            fields.push_back({"ERRNO", std::to_string(cut.punch_error)});
            record(Priority::warning, {},
                   "the file system of " + logcap::live_path(*w.files) + " cannot punch holes (" +
                       errno_text(cut.punch_error) + "): the log of " + logcap::describe(w.subject()) +
                       " is cut by truncating it to 0, which drops its newest lines too and leaves Docker 23+'s "
                       "`docker logs -f` waiting and `--tail` spinning for that container",
                   std::move(fields));
        }
        if (plan.at_size_limit && cut.live_method == logcap::CutMethod::truncate) {
            auto fields = logcap::container_fields(w.subject(), "truncate");
            fields.push_back({"LOG_PATH", logcap::live_path(*w.files)});
            fields.push_back({"LOG_APPARENT_BYTES", std::to_string(apparent)});
            fields.push_back({"LOG_MAX_FILE_BYTES", std::to_string(w.log.max_file_bytes())});
            record(Priority::warning, {},
                   "the log of " + logcap::describe(w.subject()) + " has an apparent size of " + format_size(apparent) +
                       " after its punched cuts, near its file system's largest file (" +
                       format_size(w.log.max_file_bytes()) +
                       "): truncated it to 0 once, before the engine's writes fail; Docker 23+'s "
                       "`docker logs -f` and `--tail` stop working for that container",
                   std::move(fields));
        }
        if (cut.dropped_bytes == 0) return;
        owner.counters_.truncations++;
        owner.counters_.log_bytes_dropped += cut.dropped_bytes;
        if (w.cuts.note({cut.before_bytes, w.log_bytes(), cut.dropped_bytes, cut.kept_bytes, cut.live_method, reason},
                        now, options().log_coalesce))
            flush_record(w, now);
    }

    void flush_record(Watched& w, Clock::time_point now) {
        w.cuts.flush(owner.options_.sink, w.subject(), w.cap.cap_bytes, logs.total_max_size_bytes, now);
    }

    void flush_due(Clock::time_point now) {
        for (auto& [id, w] : containers)
            if (auto due = w.cuts.due_at(options().log_coalesce); due && now >= *due) flush_record(w, now);
    }

    std::optional<Clock::time_point> next_flush() const {
        std::optional<Clock::time_point> next;
        for (const auto& [id, w] : containers)
            if (auto due = w.cuts.due_at(options().log_coalesce); due && (!next || *due < *next)) next = due;
        return next;
    }

    void would(Watched& w, LogAction action, CapReason reason) {
        if (w.would_logged) return;
        w.would_logged = true;
        auto fields = logcap::container_fields(w.subject(), dry_run_action(to_string(action)));
        fields.push_back({"LOG_BYTES_BEFORE", std::to_string(w.log_bytes())});
        fields.push_back({"LOG_BYTES_AFTER", std::to_string(w.log_bytes())});
        fields.push_back({"LOG_MAX_SIZE", std::to_string(w.cap.cap_bytes)});
        fields.push_back({"REASON", std::string(logcap::to_string(reason))});
        record(Priority::notice, message_id::log_capped,
               "dry run: would " + std::string(to_string(action)) + " " + logcap::describe(w.subject()) +
                   ", its log is " + format_size(w.log_bytes()),
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
            // A container stopped for its log before the restart may have been started
            // again meanwhile; the engine would say so (add()), but until it does, a log
            // grown past its cap is taken for a writer again and cut. One still under it is
            // left as the stop left it.
            t.halted = w.halted && !(w.from_disk && w.cap.cap_bytes > 0 && w.log_bytes() > w.cap.cap_bytes);
            t.busy = w.busy || now < w.retry_at || (dry_run && w.would_logged);
            t.local_only = w.from_disk;
            t.apparent_bytes = w.log.apparent_bytes();
            t.apparent_limit = logcap::apparent_limit_for(w.log.max_file_bytes());
            t.punch_refused = w.punch_refused;
            order.push_back(&w);
        }
        targets.resize(n);
        for (const auto& d : logcap::decide(targets, logs)) {
            Watched& w = *order[d.target];
            if (dry_run) {
                would(w, d.action, d.reason);
            } else if (d.action == LogAction::truncate) {
                truncate(w, d.reason, d.cut, now);
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
            if (w.cap.cap_bytes > 0 && !w.cap.engine_rotates)
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
        persist_dirty = true;  // halted may change
        measure(w, clock(), false);
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
        auto fields = logcap::container_fields(w.subject(), to_string(job.action));
        fields.push_back({"LOG_BYTES_BEFORE", std::to_string(job.log_bytes_before)});
        fields.push_back({"LOG_BYTES_AFTER", std::to_string(w.log_bytes())});
        fields.push_back({"LOG_MAX_SIZE", std::to_string(w.cap.cap_bytes)});
        fields.push_back({"REASON", std::string(logcap::to_string(job.reason))});
        const std::string subject = logcap::describe(w.subject());
        if (result.outcome == Outcome::acted) {
            w.halted = true;
            record(Priority::notice, message_id::log_capped,
                   std::string(logcap::engine_action(job.action).done) + " " + subject + " of session " + w.info.session + ": its log reached " +
                       format_size(job.log_bytes_before) +
                       (job.reason == CapReason::own_cap
                            ? ", cap " + format_size(w.cap.cap_bytes)
                            : ", over the total budget " + format_size(logs.total_max_size_bytes)),
                   std::move(fields));
        } else {
            w.retry_at = clock() + options().retry_interval;
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
LogCapper::LogCapper(EnginePort& engine, Options options)
    : LogCapper(std::make_unique<Guard>(engine, GuardConfig{}, options.sink), nullptr, options) {}

LogCapper::LogCapper(std::unique_ptr<Guard> own_guard, Guard* shared_guard, Options options)
    : own_guard_(std::move(own_guard)),
      guard_(shared_guard ? *shared_guard : *own_guard_),
      options_(std::move(options)) {
    loop_ = std::make_unique<Loop>(*this, options_.logs);
    wake_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!wake_fd_) throw std::system_error(errno, std::system_category(), "eventfd");
}

LogCapper::~LogCapper() { stop(); }

void LogCapper::start() {
    if (watcher_.joinable() || stopping_) return;
    if (!options_.persist_path.empty()) {
        loop_->load_persisted();
        watched_ = static_cast<std::size_t>(std::count_if(
            loop_->containers.begin(), loop_->containers.end(), [](const auto& c) { return c.second.active; }));
    }
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

std::uint64_t LogCapper::post(std::function<void(Loop&)> message) {
    std::uint64_t number = 0;
    {
        std::lock_guard lock(inbox_mutex_);
        inbox_.push_back(std::move(message));
        number = ++posted_;
    }
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_.get(), &one, sizeof one);
    return number;
}

bool LogCapper::settle(std::chrono::milliseconds limit) {
    const std::uint64_t target = post([](Loop& loop) { loop.settle_asked = true; });
    std::unique_lock lock(inbox_mutex_);
    return settled_cv_.wait_for(lock, limit, [&] { return settled_through_ >= target; });
}

void LogCapper::submit(Job job) {
    {
        std::lock_guard lock(inbox_mutex_);
        ++jobs_in_flight_;
    }
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

void LogCapper::forget_unlisted(std::set<std::string> listed) {
    post([listed = std::move(listed)](Loop& loop) { loop.forget_unlisted(listed); });
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
    c.log_unopenable = counters_.log_unopenable;
    c.log_open_failures = counters_.log_open_failures;
    c.cut_fallbacks = counters_.cut_fallbacks;
    return c;
}

void LogCapper::run_watcher() {
    ::pthread_setname_np(::pthread_self(), "reaperd-logcap");
    const auto scheduling = describe(raise_capper_thread());
    Loop& loop = *loop_;
    loop.record(Priority::info, {}, std::string(scheduling.message), {{"SCHEDULING", std::string(scheduling.field)}});
    auto next_backstop = options_.clock();
    std::uint64_t backstop_round = 0;
    auto last_round = Clock::time_point{};
    Clock::duration gap = options_.max_check_interval;
    while (!loop.stopping) {
        auto now = options_.clock();
        bool events_allowed = now >= last_round + gap;
        auto deadline = next_backstop;
        if (!events_allowed) deadline = std::min(deadline, last_round + gap);
        if (auto flush = loop.next_flush()) deadline = std::min(deadline, *flush);
        const bool persisting = !options_.persist_path.empty() && loop.persist_dirty;
        if (persisting) deadline = std::min(deadline, loop.next_persist);
        auto wait = std::max(Clock::duration::zero(), deadline - now);
        struct timespec timeout {};
        timeout.tv_sec = std::chrono::duration_cast<std::chrono::seconds>(wait).count();
        timeout.tv_nsec = std::chrono::duration_cast<std::chrono::nanoseconds>(
                              wait - std::chrono::seconds(timeout.tv_sec)).count();
        struct pollfd fds[2] = {{wake_fd_.get(), POLLIN, 0},
                                {loop.inotify.fd(), static_cast<short>(events_allowed ? POLLIN : 0), 0}};
        ::ppoll(fds, 2, &timeout, nullptr);

        bool changed = false;
        std::uint64_t taken = 0;  // messages posted up to the last one run in this turn
        if (fds[0].revents & POLLIN) {
            std::uint64_t count = 0;
            [[maybe_unused]] auto n = ::read(wake_fd_.get(), &count, sizeof count);
            std::deque<std::function<void(Loop&)>> messages;
            {
                std::lock_guard lock(inbox_mutex_);
                messages.swap(inbox_);
                taken = posted_;
            }
            for (auto& message : messages) message(loop);
            changed = !messages.empty();
            watched_ = static_cast<std::size_t>(std::count_if(
                loop.containers.begin(), loop.containers.end(), [](const auto& c) { return c.second.active; }));
        }
        if (loop.stopping) break;
        now = options_.clock();
        const bool settling = std::exchange(loop.settle_asked, false);
        if ((events_allowed && (fds[1].revents & POLLIN)) || settling) {
            if (loop.on_inotify()) {
                last_round = now;
                changed = true;
            }
        }
        bool full = now >= next_backstop;
        if (full) {
            loop.end_root_waits(now);
            loop.check_unopenable();
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
        if (!options_.persist_path.empty() && loop.persist_dirty && now >= loop.next_persist) loop.persist(now);
        if (taken > 0) {
            {
                std::lock_guard lock(inbox_mutex_);
                if (inbox_.empty() && jobs_in_flight_ == 0) settled_through_ = taken;
            }
            settled_cv_.notify_all();
        }
    }
    const auto now = options_.clock();
    for (auto& [id, w] : loop.containers) loop.flush_record(w, now);
    if (!options_.persist_path.empty() && loop.persist_dirty) loop.persist(now);
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
        request.act = logcap::engine_action(job.action).act;
        request.reason = job.reason;
        request.stop_grace = options_.stop_grace;
        GuardResult result = guard_.act(request);
        if (result.outcome == Outcome::acted) {
            switch (job.action) {  // no default: a new action warns here until it is counted
                case LogAction::stop: counters_.stops++; break;
                case LogAction::kill: counters_.kills++; break;
                case LogAction::remove: counters_.removals++; break;
                case LogAction::truncate: break;  // never a job
            }
        } else if (result.outcome == Outcome::failed) {
            counters_.action_failures++;
        }
        post([this, job, result = std::move(result)](Loop& loop) {
            {
                std::lock_guard lock(inbox_mutex_);
                --jobs_in_flight_;
            }
            loop.job_done(job, result);
        });
    }
}

}  // namespace reaperd
