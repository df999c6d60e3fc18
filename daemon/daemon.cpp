#include "daemon.hpp"

#include "log.hpp"
#include "logcap/logcap.hpp"
#include "notify.hpp"
#include "policy.hpp"

#include <reaper/log_rotation.hpp>

#include <Poco/JSON/Array.h>
#include <Poco/JSON/Object.h>

#include <algorithm>
#include <csignal>
#include <future>
#include <sstream>
#include <vector>

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

namespace reaperd {

namespace {

std::vector<LogField> container_fields(const std::string& id, const std::string& name,
                                       const std::string& session, const std::string& action) {
    std::vector<LogField> fields{{"CONTAINER_ID", id}, {"ACTION", action}};
    if (!name.empty()) fields.push_back({"CONTAINER_NAME", name});
    if (!session.empty()) fields.push_back({"SESSION_ID", session});
    return fields;
}

// SIGUSR2 only wakes the signal thread so that it sees signals_done_ (see shut_down); sent
// from outside, it does nothing. Waiting without a timeout matters: a 200 ms sigtimedwait
// cost 0.03 s of CPU a minute here, half of idle reaperd's 0.1% budget (daemon_bench (c)).
constexpr int wake_signal = SIGUSR2;

sigset_t daemon_signals() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, wake_signal);
    return set;
}

// What the journal says when a session ends, by why.
const char* end_message(EndReason reason) {
    switch (reason) {
        case EndReason::end: return "session ended by its owner";
        case EndReason::lease_expired: return "session ended: its last lease closed and lease_grace passed";
        case EndReason::unclaimed: return "session ended: it never took a lease within unclaimed_grace";
    }
    return "session ended";
}

std::string plural(std::size_t n, const char* word) {
    return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

// The journal line of a session's end names what its labelling proxies labelled (issue "run
// --own": status and journal), in the message and as fields; nothing without a proxy.
void name_labelled(const Registry& registry, const std::string& id, std::string& message,
                   std::vector<LogField>& fields) {
    auto session = registry.sessions.find(id);
    if (session == registry.sessions.end() || session->second.proxies.empty()) return;
    const auto labelled = session->second.labelled();
    message += "; its proxy labelled " + plural(labelled.containers, "container") + ", " +
               plural(labelled.networks, "network") + ", " + plural(labelled.volumes, "volume");
    fields.push_back({"PROXY", "true"});
    fields.push_back({"CONTAINERS_LABELLED", std::to_string(labelled.containers)});
    fields.push_back({"NETWORKS_LABELLED", std::to_string(labelled.networks)});
    fields.push_back({"VOLUMES_LABELLED", std::to_string(labelled.volumes)});
}

// Containers (known, or pending a reap), networks and volumes (known, or pending a removal)
// of one session, by kind: what `end --wait` waits to see at 0. A kind the daemon learns to
// reap belongs here too.
reaper::control::KindCounts remaining_of(const Registry& registry, const std::string& session) {
    std::set<std::string> containers;
    for (const auto& [id, known] : registry.containers)
        if (known.session == session) containers.insert(id);
    for (const auto& [id, reap] : registry.pending)
        if (reap.session == session) containers.insert(id);
    std::set<ObjectRef> objects;
    for (const auto& [ref, known] : registry.objects)
        if (known.session == session) objects.insert(ref);
    for (const auto& [ref, removal] : registry.pending_objects)
        if (removal.session == session) objects.insert(ref);
    reaper::control::KindCounts remaining{{"containers", containers.size()}, {"networks", 0}, {"volumes", 0}};
    for (const auto& ref : objects) ++remaining[std::string(to_string(ref.kind)) + "s"];
    return remaining;
}

// The session's reaps and removals queued now, by kind.
reaper::control::KindCounts queued_of(const Registry& registry, const std::string& session) {
    reaper::control::KindCounts queued{{"containers", 0}, {"networks", 0}, {"volumes", 0}};
    for (const auto& [id, reap] : registry.pending)
        if (reap.session == session) ++queued["containers"];
    for (const auto& [ref, removal] : registry.pending_objects)
        if (removal.session == session) ++queued[std::string(to_string(ref.kind)) + "s"];
    return queued;
}

}  // namespace

Daemon::Daemon(Config config, EnginePort& engine, DaemonOptions options)
    : config_(std::move(config)),
      engine_(engine),
      guard_(engine, GuardConfig::from(config_)),
      options_(std::move(options)),
      pace_(PaceConfig::from(config_)) {}

Daemon::~Daemon() {
    stop_signal_thread();
}

// ---- messages from other threads --------------------------------------------------------

void Daemon::post(Message message) {
    {
        std::lock_guard lock(queue_mutex_);
        queue_.push_back(std::move(message));
        ++posted_;
    }
    queue_cv_.notify_one();
}

bool Daemon::settle(std::chrono::milliseconds limit) {
    std::unique_lock lock(queue_mutex_);
    queue_.push_back([](TimePoint) {});  // wakes the loop, which then reads the clock
    const std::uint64_t target = ++posted_;
    queue_cv_.notify_one();
    return settled_cv_.wait_for(lock, limit, [&] { return settled_through_ >= target; });
}

std::string Daemon::ask(std::function<std::string(TimePoint)> fn) {
    auto promise = std::make_shared<std::promise<std::string>>();
    auto future = promise->get_future();
    post([promise, fn = std::move(fn)](TimePoint now) {
        try {
            promise->set_value(fn(now));
        } catch (...) {
            promise->set_exception(std::current_exception());
        }
    });
    // A stop ends the loop with this message possibly still queued: the asker (the control
    // server's status thread, which the stop joins) must not wait out its 10 s for it.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds{10};
    while (future.wait_for(std::chrono::milliseconds{20}) != std::future_status::ready) {
        {
            std::lock_guard lock(queue_mutex_);
            if (stop_requested_) throw std::runtime_error("reaperd is stopping");
        }
        if (std::chrono::steady_clock::now() > deadline)
            throw std::runtime_error("the daemon's main loop did not answer within 10s");
    }
    return future.get();
}

void Daemon::request_stop() {
    {
        std::lock_guard lock(queue_mutex_);
        stop_requested_ = true;
    }
    queue_cv_.notify_one();
}

void Daemon::request_reload() {
    post([this](TimePoint now) { reload(now); });
}

void Daemon::lease_opened(const std::string& session, std::uint64_t connection_id) {
    // The door first, on this (the control server's) thread: an attempt the loop has
    // already sent to the pool is refused from now on (guard.hpp, Expectation::leases_opened).
    guard_.lease_opening(session);
    post([this, session, connection_id](TimePoint now) {
        auto before = registry_.state_of(session);
        bool revived = before == SessionState::ended;
        registry_.lease_opened(session, connection_id, now);
        if (before != SessionState::leased) dirty_ = true;
        if (revived)
            log(Priority::info, {}, "ended session leased again; it is alive",
                {{"SESSION_ID", session}});
    });
}

void Daemon::lease_closed(const std::string& session, std::uint64_t connection_id) {
    post([this, session, connection_id](TimePoint now) {
        registry_.lease_closed(session, connection_id, config_.sessions.lease_grace, now);
        if (registry_.known(session) && registry_.state_of(session) != SessionState::leased)
            dirty_ = true;
    });
}

void Daemon::proxy_reported(const std::string& session, std::uint64_t,
                            const ProxyReport& report) {
    post([this, session, report](TimePoint now) {
        registry_.session(session, now).proxies[report.client] = report.labelled;
    });
}

reaper::control::Reply Daemon::end_session(const std::string& session) {
    // Shared with the message: a stop may leave it queued after this call gave up waiting.
    auto reply = std::make_shared<reaper::control::Reply>();
    ask([this, session, reply](TimePoint now) {
        reply->session = session;
        reply->known = registry_.known(session);
        reply->already_ended = registry_.tombstone(session) != nullptr;
        if (registry_.end_session(session, EndReason::end, now)) {
            dirty_ = true;
            metrics_.action("end_session");
            metrics_.session_ended(EndReason::end);
            std::string message = end_message(EndReason::end);
            std::vector<LogField> fields{{"SESSION_ID", session},
                                         {"ACTION", "end_session"},
                                         {"REASON", std::string(to_string(EndReason::end))}};
            name_labelled(registry_, session, message, fields);
            log(Priority::notice, message_id::session_ended, message, std::move(fields));
        }
        // Its containers are queued now rather than at the end of the turn, so the reply can
        // say how many.
        apply_decisions(now);
        reply->dry_run = config_.reaper.dry_run;
        reply->reaps_queued = queued_of(registry_, session);
        return std::string();
    });
    return *reply;
}

reaper::control::Reply Daemon::session_report(const std::string& session) {
    auto reply = std::make_shared<reaper::control::Reply>();
    ask([this, session, reply](TimePoint) {
        reply->session = session;
        reply->known = registry_.known(session);
        if (reply->known) reply->state = to_string(registry_.state_of(session));
        reply->ready = ready_;
        reply->dry_run = config_.reaper.dry_run;
        reply->remaining = remaining_of(registry_, session);
        return std::string();
    });
    return *reply;
}

reaper::control::Reply Daemon::orphan_reported(const std::string& container, const std::string& session) {
    PinnedOrphan orphan = pin_orphan(container, session);
    auto reply = std::make_shared<reaper::control::Reply>();
    reply->container = orphan.container;
    reply->name = orphan.name;
    reply->session = orphan.session;
    if (orphan.inspected) reply->owned = true;
    // The loop owns the registry: it queues (or, in a dry run, says what it would do).
    ask([this, orphan, reply](TimePoint now) {
        queue_orphan(orphan, now);
        reply->dry_run = config_.reaper.dry_run;
        reply->queued = !config_.reaper.dry_run;
        return std::string();
    });
    return *reply;
}

// A reported name or id prefix is pinned to the full id it names now: a retry by name could
// find another container that took the name meanwhile (issue 10).
Daemon::PinnedOrphan Daemon::pin_orphan(const std::string& reference, const std::string& session) {
    const auto config = guard_.config();
    std::optional<std::string> expected;
    if (!session.empty()) expected = session;
    std::optional<reaper::ContainerInfo> info;
    std::string problem;
    try {
        info = engine_.inspect(reference);
    } catch (const reaper::NotFound&) {
        problem = "no container matches \"" + reference + "\"";
    } catch (const reaper::EngineError& e) {
        // The engine answers an id prefix shared by several containers with an error too.
        // A full id names one container for ever, so it can wait for the engine to answer:
        // the door inspects and checks it before any call. Anything shorter cannot be pinned.
        if (!is_full_container_id(reference))
            problem = "cannot resolve \"" + reference + "\" to one container: " + describe(e);
    }
    PinnedOrphan orphan{info ? info->id : reference, info ? info->name : "", session, info.has_value()};
    // A refusal's reply names what the report resolved to, and whether reaperd owns it.
    reaper::control::Reply details;
    details.queued = false;
    if (info) {
        auto owner = owning_session(info->labels, config->labels);
        std::string subject = "container " + orphan.name + " (" + orphan.container + ")";
        details.container = orphan.container;
        details.name = orphan.name;
        details.session = owner.value_or("");
        details.owned = owner.has_value();
        if (auto refusal = ownership_refusal(info->labels, *config, expected))
            problem = *refusal == Outcome::refused_not_owned
                          ? subject + " carries no session label; reaperd does not own it"
                          : subject + " belongs to session " + owner.value_or("") + ", not " + session;
        else
            orphan.session = *owner;
    }
    if (!problem.empty()) {
        auto fields = container_fields(orphan.container, orphan.name, session, "none");
        fields.push_back({"ERROR", problem});
        log(Priority::warning, {}, "orphan report refused: " + problem, std::move(fields));
        throw Refused(problem + "; not reaped", std::move(details));
    }
    return orphan;
}

void Daemon::queue_orphan(const PinnedOrphan& orphan, TimePoint now) {
    if (config_.reaper.dry_run) {
        metrics_.action(dry_run_action("reap"));
        log(Priority::notice, message_id::would_reap, "dry run: would reap reported orphan",
            container_fields(orphan.container, orphan.name, orphan.session, dry_run_action("reap")));
        return;
    }
    if (registry_.add_pending(orphan.container, orphan.name, orphan.session, ReapReason::orphan, now))
        dirty_ = true;
}

std::string Daemon::status_json(const reaper::control::StatusQuery& query) {
    return ask([this, query](TimePoint now) { return render_status(now, query); });
}

std::string Daemon::metrics_text() {
    return ask([this](TimePoint) { return render_metrics(); });
}

void Daemon::request_refused(const std::string& reason) { metrics_.control_refused(reason); }

// ---- the loop ----------------------------------------------------------------------------

int Daemon::run() {
    // Block the signals in this thread before any other starts, so every thread inherits
    // the mask and only the signal thread's sigwaitinfo() ever sees them.
    sigset_t signals = daemon_signals();
    if (options_.handle_signals) {
        pthread_sigmask(SIG_BLOCK, &signals, nullptr);
        signal_thread_ = std::thread([this] { signal_thread(); });
    }

    TimePoint now = options_.clock();
    start_up(now);
    loop_running_ = true;
    for (;;) {
        std::deque<Message> batch;
        bool stop;
        std::uint64_t taken;
        {
            std::lock_guard lock(queue_mutex_);
            batch.swap(queue_);
            stop = stop_requested_;
            taken = posted_;
        }
        now = options_.clock();
        for (auto& message : batch) message(now);
        if (stop) break;
        turn(now);
        {
            std::lock_guard lock(queue_mutex_);
            if (queue_.empty() && in_flight_ == 0) settled_through_ = taken;
        }
        settled_cv_.notify_all();

        TimePoint wake = now + std::chrono::seconds{60};
        if (auto next = decide(registry_, config_, now).next_wake) wake = std::min(wake, *next);
        wake = std::min(wake, next_resync_);
        if (watchdog_interval_) wake = std::min(wake, next_watchdog_);
        if (auto change = pace_.next_change(now)) wake = std::min(wake, *change);
        std::unique_lock lock(queue_mutex_);
        queue_cv_.wait_for(lock, std::max(Clock::duration{0}, wake - now),
                           [this] { return !queue_.empty() || stop_requested_; });
    }
    shut_down();
    return 0;
}

// A state file that cannot be read may hold pending reaps and tombstones that nothing else
// knows: a transient error (EIO, EINTR on a network mount) is tried again, and one that stays
// stops reaperd with the reason (systemd restarts it, its start limit then stops trying),
// rather than starting empty and forgetting them.
PersistedState Daemon::load_state_retrying(const StateStore& store, Clock::duration wall_offset) {
    constexpr int attempts = 5;
    constexpr auto pause = std::chrono::milliseconds{200};
    for (int attempt = 1;; ++attempt) {
        try {
            return store.load(wall_offset);
        } catch (const StateUnreadable& e) {
            if (attempt == attempts)
                throw std::runtime_error(std::string(e.what()) + " (" + std::to_string(attempts) +
                                         " tries); not starting, so that the reaps and ended sessions it "
                                         "holds are not forgotten: fix its permissions or storage, or move "
                                         "it away to start afresh");
            log(Priority::warning, {}, "state file cannot be read; trying again", {{"ERROR", e.what()}});
            std::this_thread::sleep_for(pause);
        }
    }
}

// The control server's connection cap, checked against the descriptor limit: the soft
// RLIMIT_NOFILE is raised towards the hard one when it is lower than the cap plus the reserve
// (under the unit, LimitNOFILE sets both and its seccomp filter refuses setrlimit anyway),
// and the cap is lowered, loudly, when the descriptors still do not suffice.
LeaseTerms Daemon::lease_terms() const {
    // Without the capper no log is capped, whatever logs.max_size says.
    return {options_.log_caps ? config_.logs.max_size_bytes : 0, config_.logs.rotate_at_create};
}

ControlServerLimits Daemon::control_limits() const {
    ControlServerLimits limits;
    limits.max_connections = config_.control.max_connections;
    limits.max_connections_per_uid = config_.control.max_connections_per_uid;
    limits.max_leases_per_uid = config_.control.max_leases_per_uid;
    rlimit nofile{};
    if (::getrlimit(RLIMIT_NOFILE, &nofile) != 0) return limits;
    const rlim_t wanted = static_cast<rlim_t>(limits.max_connections + reserved_descriptors);
    if (nofile.rlim_cur != RLIM_INFINITY && nofile.rlim_cur < wanted) {
        rlimit raised = nofile;
        raised.rlim_cur = nofile.rlim_max == RLIM_INFINITY ? wanted : std::min(wanted, nofile.rlim_max);
        if (raised.rlim_cur > nofile.rlim_cur && ::setrlimit(RLIMIT_NOFILE, &raised) == 0) nofile = raised;
    }
    const std::uint64_t soft =
        nofile.rlim_cur == RLIM_INFINITY ? ~std::uint64_t{0} : static_cast<std::uint64_t>(nofile.rlim_cur);
    const auto fitted = fit_to_descriptors(limits, soft);
    if (fitted.max_connections < limits.max_connections) {
        log(Priority::warning, {},
            "control socket: at most " + std::to_string(fitted.max_connections) +
                " connections, not " + std::to_string(limits.max_connections) +
                ": the descriptor limit (RLIMIT_NOFILE) is " + std::to_string(soft) + ", and " +
                std::to_string(reserved_descriptors) +
                " are kept for engine calls and log files; raise LimitNOFILE to serve more",
            {{"NOFILE", std::to_string(soft)}, {"MAX_CONNECTIONS", std::to_string(fitted.max_connections)}});
    }
    return fitted;
}

void Daemon::start_up(TimePoint now) {
    log(Priority::info, {}, std::string("reaperd ") + REAPER_VERSION + " starting",
        {{"DRY_RUN", config_.reaper.dry_run ? "true" : "false"}});
    state_ = std::make_unique<StateStore>(config_.state.dir);
    try {
        PersistedState loaded = load_state_retrying(*state_, wall_offset());
        for (const auto& warning : loaded.warnings) log(Priority::warning, {}, warning, {});
        registry_.restore(loaded, config_.sessions.lease_grace, now);
    } catch (const StateCorrupt& e) {
        std::string aside;
        try {
            aside = state_->set_aside(now + wall_offset());
        } catch (const std::exception& move_error) {
            aside = std::string("(could not be moved: ") + move_error.what() + ")";
        }
        log(Priority::err, {},
            std::string("state file is corrupt; kept aside as ") + aside +
                "; rebuilding from the engine",
            {{"ERROR", e.what()}});
    }
    dirty_ = true;

    if (options_.log_caps) {
        LogCapper::Options capper_options;
        capper_options.logs = config_.logs;
        // Started before the watcher: the logs known from the last run are capped while the
        // first list is still on its way (logcap/logcap.hpp).
        capper_options.persist_path = config_.state.dir + "/logcap.json";
        try {
            capper_ = std::make_unique<LogCapper>(guard_, capper_options);
            capper_->start();
        } catch (const std::exception& e) {
            capper_.reset();
            log(Priority::err, {}, "log caps are unavailable", {{"ERROR", e.what()}});
        }
    }

    pool_ = std::make_unique<ReaperPool>(guard_, config_.reaper.concurrency,
                                         [this](ReapResult result) {
                                             post([this, result = std::move(result)](TimePoint t) {
                                                 on_reap_result(result, t);
                                             });
                                         });
    watcher_ = std::make_unique<Watcher>(
        engine_, WatcherOptions{config_.reaper.retry_initial, config_.reaper.retry_max},
        [this](WatchEvent event) {
            post([this, event = std::move(event)](TimePoint t) { on_watch(event, t); });
        });
    if (options_.control_server) {
        control_ = std::make_unique<ControlServer>(config_.control, *this, control_limits());
        control_->set_lease_terms(lease_terms());
        control_->start();
        if (!config_.metrics.listen.empty()) {
            metrics_http_ = std::make_unique<MetricsHttpServer>(config_.metrics.listen,
                                                                [this] { return metrics_text(); });
            metrics_http_->start();
        }
    }
    watcher_->start();
    next_resync_ = now + config_.reaper.resync_interval;
    watchdog_interval_ = notify::watchdog_interval();
    next_watchdog_ = now;
    publish_status();
}

void Daemon::turn(TimePoint now) {
    if (watchdog_interval_ && now >= next_watchdog_) {
        notify::watchdog();
        next_watchdog_ = now + *watchdog_interval_;
    }
    if (now >= next_resync_) {
        watcher_->resync();
        next_resync_ = now + config_.reaper.resync_interval;
    }
    apply_decisions(now);
    note_pace(now);
    save_state_if_dirty();
    publish_status();
}

void Daemon::apply_decisions(TimePoint now) {
    // Ending a session queues its containers; queued reaps are attempted on the next pass.
    for (int pass = 0; pass < 3; ++pass) {
        Decision d = decide(registry_, config_, now);
        for (const auto& end : d.end) {
            if (!registry_.end_session(end.session, end.reason, now)) continue;
            dirty_ = true;
            metrics_.action("end_session");
            metrics_.session_ended(end.reason);
            std::string message = end_message(end.reason);
            std::vector<LogField> fields{{"SESSION_ID", end.session},
                                         {"ACTION", "end_session"},
                                         {"REASON", std::string(to_string(end.reason))}};
            name_labelled(registry_, end.session, message, fields);
            log(Priority::notice, message_id::session_ended, message, std::move(fields));
        }
        for (const auto& id : d.forget) {
            guard_.forget_session(id);
            if (registry_.forget_session(id)) dirty_ = true;
        }
        for (const auto& id : d.evict) {
            guard_.forget_session(id);
            if (!registry_.forget_session(id)) continue;
            dirty_ = true;
            metrics_.tombstone_evicted();
        }
        for (const auto& reap : d.reap) {
            if (config_.reaper.dry_run) {
                registry_.would_reap_logged.insert(reap.container);
                metrics_.action(dry_run_action("reap"));
                log(Priority::notice, message_id::would_reap, "dry run: would reap container",
                    container_fields(reap.container, reap.name, reap.session, dry_run_action("reap")));
                continue;
            }
            if (registry_.add_pending(reap.container, reap.name, reap.session, reap.reason, now))
                dirty_ = true;
        }
        submit_attempts(d, now);
        for (const auto& remove : d.remove) {
            if (config_.reaper.dry_run) {
                registry_.would_remove_logged.insert(remove.object);
                metrics_.action(dry_run_action("reap"));
                auto fields = object_fields(remove.object, remove.name);
                fields.push_back({"SESSION_ID", remove.session});
                fields.push_back({"ACTION", dry_run_action("reap")});
                log(Priority::notice, message_id::would_reap,
                    "dry run: would remove " + describe(remove.object, remove.name), std::move(fields));
                continue;
            }
            registry_.add_pending_object(remove.object, remove.name, remove.session, now);
        }
        if (d.end.empty() && d.reap.empty() && d.forget.empty() && d.evict.empty() && d.remove.empty()) break;
    }
}

void Daemon::submit_attempts(const Decision& d, TimePoint now) {
    if (!pace_.may_send()) return;
    // Oldest due first: a container's reap by when it became due, then its retries; a
    // network's or volume's by its next attempt (they keep no queue time).
    struct Due {
        TimePoint at;
        const std::string* container = nullptr;
        const ObjectRef* object = nullptr;
    };
    std::vector<Due> due;
    due.reserve(d.attempt.size() + d.attempt_objects.size());
    for (const auto& id : d.attempt) due.push_back({registry_.pending.at(id).due, &id, nullptr});
    for (const auto& ref : d.attempt_objects)
        due.push_back({registry_.pending_objects.at(ref).next_attempt, nullptr, &ref});
    const auto room = std::min(due.size(), pace_.limit() - pace_.in_flight());
    std::partial_sort(due.begin(), due.begin() + static_cast<std::ptrdiff_t>(room), due.end(),
                      [](const Due& a, const Due& b) { return a.at < b.at; });
    for (std::size_t i = 0; i < room; ++i) {
        ReapJob job;
        if (due[i].container) {
            auto& pending = registry_.pending.at(*due[i].container);
            pending.in_flight = true;
            job.container = *due[i].container;
            job.expect = expectation_for(pending, registry_);
            job.reason = pending.reason;
        } else {
            auto& removal = registry_.pending_objects.at(*due[i].object);
            removal.in_flight = true;
            job.expect = expectation_for(removal, registry_);
            job.object = *due[i].object;
        }
        job.sent = now;
        pace_.sent(now);
        ++in_flight_;
        pool_->submit(std::move(job));
    }
}

void Daemon::pace_result(const ReapResult& result, TimePoint now) {
    if (result.result.unanswered) {
        metrics_.removal_unanswered();
        pace_.timed_out(result.sent, now);
    } else {
        metrics_.removal_answered(now - result.sent);
        if (pace_.answered(result.sent, now)) catch_up(now);
    }
    note_pace(now);
}

void Daemon::catch_up(TimePoint now) {
    std::size_t brought = 0;
    for (auto& [id, pending] : registry_.pending)
        if (!pending.in_flight && pending.next_attempt > now) {
            pending.next_attempt = now;
            ++brought;
        }
    for (auto& [ref, removal] : registry_.pending_objects)
        if (!removal.in_flight && removal.next_attempt > now) {
            removal.next_attempt = now;
            ++brought;
        }
    watcher_->resync();
    next_resync_ = now + config_.reaper.resync_interval;
    log(Priority::notice, message_id::engine_in_time,
        "engine answers removals again; relisting now, and " + plural(brought, "retry") +
            " that backed off brought forward",
        {{"ENGINE", options_.engine_address},
         {"PENDING_REAPS", std::to_string(registry_.pending.size())},
         {"RETRIES_BROUGHT_FORWARD", std::to_string(brought)}});
}

void Daemon::note_pace(TimePoint now) {
    const EnginePace pace = pace_.pace(now);
    if (pace == last_pace_) return;
    last_pace_ = pace;
    const auto f = pace_.figures(now);
    const auto ms = [](Duration d) {
        return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
    };
    std::vector<LogField> fields{{"ENGINE", options_.engine_address},
                                 {"IN_FLIGHT_LIMIT", std::to_string(f.limit)},
                                 {"IN_FLIGHT", std::to_string(f.in_flight)},
                                 {"TIMEOUTS", std::to_string(f.timeouts_recent)},
                                 {"LATENCY_MS", ms(f.latency)},
                                 {"LATENCY_MAX_MS", ms(f.latency_max_recent)},
                                 {"OLDEST_IN_FLIGHT_MS", ms(f.oldest_in_flight)},
                                 {"PENDING_REAPS", std::to_string(registry_.pending.size())}};
    if (pace == EnginePace::slow) {
        slow_since_ = now;
        // A removal still unanswered can be what made the engine slow while every answer so far
        // came fast (a force-remove of a running container beside a burst of starts: 2-5 s,
        // with answers of 60 ms before it): the message names it then.
        const std::string waiting = f.oldest_in_flight > f.latency_max_recent
                                        ? ", and a removal waiting " + ms(f.oldest_in_flight) + " ms for its answer"
                                        : "";
        log(Priority::warning, message_id::engine_slow,
            "engine is slow: " + plural(f.timeouts_recent, "removal timeout") + " and answers of up to " +
                ms(f.latency_max_recent) + " ms in the last 10 s" + waiting + "; removals paced to " +
                std::to_string(f.limit) + " in flight",
            std::move(fields));
    } else {
        slow_since_.reset();
        log(Priority::notice, message_id::engine_in_time,
            "engine answers in time again; removals back up to " + std::to_string(f.limit) + " in flight",
            std::move(fields));
    }
    publish_status();
}

void Daemon::on_watch(const WatchEvent& event, TimePoint now) {
    if (std::holds_alternative<watch::EngineUp>(event)) {
        if (engine_state_ == EngineState::down || engine_state_ == EngineState::unsupported) {
            metrics_.engine_reconnect();
            log(Priority::notice, message_id::engine_back, "engine is back",
                {{"ENGINE", options_.engine_address}});
            // Retries waited on the engine; it is here now.
            for (auto& [id, pending] : registry_.pending) pending.next_attempt = now;
            for (auto& [ref, removal] : registry_.pending_objects) removal.next_attempt = now;
        }
        engine_state_ = EngineState::up;
        engine_error_.clear();
        if (!ready_) {
            ready_ = true;
            publish_status();
            notify::ready();
            log(Priority::info, {}, "ready",
                {{"TRACKED_CONTAINERS", std::to_string(registry_.tracked_count())}});
        }
    } else if (auto* down = std::get_if<watch::EngineDown>(&event)) {
        if (engine_state_ != EngineState::down) {
            log(Priority::warning, message_id::engine_lost,
                "engine lost; retrying with backoff",
                {{"ENGINE", options_.engine_address}, {"ERROR", down->error}});
        }
        engine_state_ = EngineState::down;
        engine_error_ = down->error;
    } else if (auto* unsupported = std::get_if<watch::EngineUnsupported>(&event)) {
        // Not an outage: the engine answers, and waiting with backoff will not help unless
        // it or reaperd's engine.api_version changes; say so at error level, once per reason.
        log(Priority::err, message_id::engine_unsupported,
            "engine API version not supported; nothing is reaped until it is (checking again with backoff)",
            {{"ENGINE", options_.engine_address}, {"ERROR", unsupported->error}});
        engine_state_ = EngineState::unsupported;
        engine_error_ = unsupported->error;
        publish_status();
    } else if (auto* appeared = std::get_if<watch::Appeared>(&event)) {
        container_appeared(*appeared, now);
    } else if (auto* gone = std::get_if<watch::Gone>(&event)) {
        container_gone(gone->id);
    } else if (auto* listed = std::get_if<watch::Listed>(&event)) {
        metrics_.engine_synced(now + wall_offset());
        std::vector<std::string> vanished;
        for (const auto& [id, known] : registry_.containers)
            if (!listed->ids.count(id)) vanished.push_back(id);
        for (const auto& id : vanished) container_gone(id);
        if (capper_) capper_->forget_unlisted(listed->ids);
    } else if (auto* object = std::get_if<watch::ObjectAppeared>(&event)) {
        const auto& o = object->object;
        registry_.upsert_object(o.ref, o.name, o.labels, config_.sessions, now);
    } else if (auto* gone_object = std::get_if<watch::ObjectGone>(&event)) {
        registry_.erase_object(gone_object->ref);
    } else if (auto* objects = std::get_if<watch::ObjectsListed>(&event)) {
        std::set<ObjectRef> present;
        for (const auto& o : objects->objects) {
            registry_.upsert_object(o.ref, o.name, o.labels, config_.sessions, now);
            present.insert(o.ref);
        }
        std::vector<ObjectRef> vanished;
        for (const auto& [ref, known] : registry_.objects)
            if (ref.kind == objects->kind && !present.count(ref)) vanished.push_back(ref);
        for (const auto& ref : vanished) registry_.erase_object(ref);
    }
}

// The one place where containers enter and leave what the daemon watches: the registry and
// the log capper both learn of them here. A container arrives first from its event's
// attributes or its list row (the registry's record: labels never change after creation),
// then, when the log capper watches it, again with the log info the watcher looked up.
void Daemon::container_appeared(const watch::Appeared& appeared, TimePoint now) {
    const reaper::ContainerInfo& info = appeared.info;
    auto known = registry_.containers.find(info.id);
    if (!appeared.log_info) {
        if (auto warning = registry_.upsert_container(info, config_.sessions, now, wall_offset()))
            log(Priority::warning, {}, *warning,
                {{"CONTAINER_ID", info.id}, {"CONTAINER_NAME", info.name}});
        known = registry_.containers.find(info.id);
        // The capper ignores a container out of its scope: no inspect for those.
        if (capper_ && (config_.logs.scope == LogScope::all || known->second.session))
            watcher_->want_log_info(info.id);
        return;
    }
    // Gone already (a list no longer had it): nothing to cap.
    if (known == registry_.containers.end()) return;
    ContainerLog container;
    container.id = info.id;
    container.name = info.name;
    container.session = known->second.session.value_or("");
    container.log_path = info.log_path;
    container.log_driver = info.log_driver;
    container.rotation_bound_bytes = reaper::engine_rotation_bound(info.log_driver, info.log_options);
    container.labels = info.labels;
    container.docker_root_dir = appeared.docker_root_dir;
    capper_->add(std::move(container));
}

void Daemon::container_gone(const std::string& id) {
    registry_.containers.erase(id);
    registry_.would_reap_logged.erase(id);
    auto pending = registry_.pending.find(id);
    if (pending != registry_.pending.end() && !pending->second.in_flight) {
        // After a failed attempt the journal's last word on it was "will retry": say that no
        // retry is needed. Podman 4.3 drops a container from its database before a root file
        // system it cannot remove, answers the remove with a 500, and reports the container
        // gone, usually before the retry comes.
        if (pending->second.failures > 0) {
            auto fields = container_fields(id, pending->second.name, pending->second.session, "remove");
            fields.push_back({"REASON", std::string(to_string(pending->second.reason))});
            fields.push_back({"ATTEMPT", std::to_string(pending->second.failures)});
            log(Priority::info, {}, "container gone from the engine after a failed reap; nothing to retry",
                std::move(fields));
        }
        registry_.pending.erase(pending);
        dirty_ = true;
    }
    if (capper_) capper_->remove(id);
}

void Daemon::on_reap_result(const ReapResult& result, TimePoint now) {
    if (in_flight_ > 0) --in_flight_;
    pace_result(result, now);
    if (result.object) return on_object_result(*result.object, result.result, now);
    auto it = registry_.pending.find(result.container);
    if (it == registry_.pending.end()) return;
    PendingReap& pending = it->second;
    pending.in_flight = false;
    auto fields = container_fields(result.container, pending.name, pending.session, "remove");
    fields.push_back({"REASON", std::string(to_string(pending.reason))});
    const Outcome outcome = result.result.outcome;
    switch (outcome) {
        case Outcome::acted:
            metrics_.reap_done(now - pending.due);
            metrics_.action("reap");
            log(Priority::notice, message_id::container_reaped, "container reaped",
                std::move(fields));
            registry_.pending.erase(it);
            registry_.containers.erase(result.container);
            dirty_ = true;
            break;
        case Outcome::gone:
            log(Priority::info, {}, "container already gone; nothing to reap", std::move(fields));
            registry_.pending.erase(it);
            registry_.containers.erase(result.container);
            dirty_ = true;
            break;
        case Outcome::refused_not_pinned:
        case Outcome::refused_not_owned:
        case Outcome::refused_other_session:
        case Outcome::refused_session_alive:
            // The door logged why. Never retried: a session that is alive again gets its
            // containers queued afresh when it ends again (policy.hpp expectation_for).
            registry_.pending.erase(it);
            dirty_ = true;
            break;
        case Outcome::removing:
            // The engine is removing it already: look again soon without counting a failure.
            pending.next_attempt = now + config_.reaper.retry_initial;
            break;
        case Outcome::dry_run:
        case Outcome::not_running:
            // A reload turned dry run on while this attempt ran (the door logged it): it stays
            // pending, and is attempted again when dry run is off. (A remove is never
            // not_running.)
            break;
        case Outcome::failed: {
            if (result.result.unanswered) {
                // Unknown, not failed: the engine may have removed it. No backoff either: the
                // pace holds the next attempt back, and its fresh inspect finds out.
                pending.next_attempt = now;
                fields.push_back({"ERROR", result.result.error});
                log(Priority::info, {}, "reap got no answer in time; trying again through a fresh inspect",
                    std::move(fields));
                break;
            }
            const Duration delay = schedule_retry(pending.failures, pending.next_attempt, now);
            const bool give_up_level = pending.failures >= config_.reaper.error_after_attempts;
            fields.push_back({"ERROR", result.result.error});
            fields.push_back({"ATTEMPT", std::to_string(pending.failures)});
            fields.push_back({"RETRY_IN", format_duration(delay)});
            log(give_up_level ? Priority::err : Priority::warning, message_id::reap_failed,
                give_up_level ? "reap keeps failing; still retrying" : "reap failed; will retry",
                std::move(fields));
            dirty_ = true;
            break;
        }
    }
}

Duration Daemon::schedule_retry(unsigned& failures, TimePoint& next_attempt, TimePoint now) {
    ++failures;
    metrics_.reap_failed();
    std::uniform_real_distribution<double> jitter(0.0, 1.0);
    const Duration delay =
        retry_delay(failures, config_.reaper.retry_initial, config_.reaper.retry_max, jitter(random_));
    next_attempt = now + delay;
    return delay;
}

// A network's or volume's removal attempt: as a container's, but nothing is persisted (the
// next list finds what is left, and the session's tombstone queues it again).
void Daemon::on_object_result(const ObjectRef& ref, const GuardResult& result, TimePoint now) {
    auto it = registry_.pending_objects.find(ref);
    if (it == registry_.pending_objects.end()) return;
    PendingRemoval& removal = it->second;
    removal.in_flight = false;
    const std::string kind(to_string(ref.kind));
    auto fields = object_fields(ref, removal.name);
    fields.push_back({"SESSION_ID", removal.session});
    fields.push_back({"ACTION", "remove"});
    fields.push_back({"REASON", std::string(to_string(ReapReason::session_ended))});
    switch (result.outcome) {
        case Outcome::acted:
            metrics_.object_reaped(kind);
            metrics_.action("reap_" + kind);
            log(Priority::notice,
                ref.kind == ObjectKind::network ? message_id::network_reaped : message_id::volume_reaped,
                kind + " reaped", std::move(fields));
            registry_.pending_objects.erase(it);
            registry_.objects.erase(ref);
            break;
        case Outcome::gone:
            log(Priority::info, {}, kind + " already gone; nothing to reap", std::move(fields));
            registry_.pending_objects.erase(it);
            registry_.objects.erase(ref);
            break;
        case Outcome::refused_not_pinned:
        case Outcome::refused_not_owned:
        case Outcome::refused_other_session:
        case Outcome::refused_session_alive:
            // The door logged why; dropped. A session alive again gets its networks and
            // volumes queued afresh when it ends again. Otherwise what the fresh inspect said
            // replaces what the list said, so that a volume name taken meanwhile by another
            // owner is not queued again and again (the next list or event corrects the rest).
            registry_.pending_objects.erase(it);
            if (auto known = registry_.objects.find(ref); known != registry_.objects.end()) {
                if (result.outcome == Outcome::refused_not_pinned)
                    registry_.objects.erase(known);
                else if (result.outcome != Outcome::refused_session_alive)
                    known->second.session = result.session;
            }
            break;
        case Outcome::removing:
        case Outcome::not_running:
        case Outcome::dry_run:
            // A reload turned dry run on while this attempt ran: it stays pending. (The other
            // two never happen to a network or volume.)
            break;
        case Outcome::failed: {
            if (result.unanswered) {  // unknown, as a container's (on_reap_result)
                removal.next_attempt = now;
                break;
            }
            // In use (a container of another session or none still attached, a volume still
            // mounted): retried with backoff like a container's removal, for as long as it exists.
            const Duration delay = schedule_retry(removal.failures, removal.next_attempt, now);
            const bool give_up_level = removal.failures >= config_.reaper.error_after_attempts;
            fields.push_back({"ERROR", result.error});
            fields.push_back({"ATTEMPT", std::to_string(removal.failures)});
            fields.push_back({"RETRY_IN", format_duration(delay)});
            log(give_up_level ? Priority::err : Priority::warning, message_id::object_reap_failed,
                give_up_level ? kind + " removal keeps failing; still retrying"
                              : kind + " removal failed; will retry",
                std::move(fields));
            break;
        }
    }
}

void Daemon::save_state_if_dirty() {
    if (!dirty_ || !state_) return;
    try {
        // Appends what changed to the journal (state.hpp): its cost follows the change, not
        // the tombstones held (0.2 ms with 100,000 of them, bench/tombstone_bench).
        state_->save_changes(registry_, wall_offset());
        dirty_ = false;
        if (state_save_failing_) log(Priority::info, {}, "state saved again", {});
        state_save_failing_ = false;
    } catch (const std::exception& e) {
        // Keep running on what is in memory; retried on the next turn with anything new.
        metrics_.state_save_failed();
        if (!state_save_failing_)
            log(Priority::err, {}, "cannot save state", {{"ERROR", e.what()}});
        state_save_failing_ = true;
    }
}

std::string Daemon::status_line() const {
    std::string engine = engine_state_ == EngineState::starting ? "waiting for the engine"
                                                                : std::string("engine ") + engine_state_name(engine_state_);
    if (engine_state_ == EngineState::up && last_pace_ == EnginePace::slow)
        engine = "engine slow";
    if (engine_state_ == EngineState::unsupported) engine += " (" + engine_error_ + ")";
    std::string line = engine + "; " + plural(registry_.session_count(), "session") +
                       ", " + plural(registry_.tracked_count(), "container") + ", " +
                       plural(registry_.pending.size(), "pending reap");
    if (config_.reaper.dry_run) line += " (dry run)";
    return line;
}

void Daemon::publish_status() {
    std::string line = status_line();
    if (line == last_status_line_) return;
    last_status_line_ = line;
    notify::status(line);
}

void Daemon::reload(TimePoint now) {
    // Before the first READY, systemd is still waiting for start-up: a reload then must not
    // announce readiness the engine has not given yet.
    if (ready_) notify::reloading();
    try {
        Config fresh = options_.config_path.empty() ? config_ : load_config(options_.config_path, options_.config_defaults);
        auto restart_needed = [&](bool changed, const char* key) {
            if (changed)
                log(Priority::warning, {},
                    std::string(key) + " changed; it takes effect when reaperd restarts", {});
        };
        restart_needed(fresh.engine != config_.engine, "engine");
        restart_needed(fresh.control.socket != config_.control.socket ||
                           fresh.control.group != config_.control.group ||
                           fresh.control.max_connections != config_.control.max_connections ||
                           fresh.control.allow_root != config_.control.allow_root,
                       "control");
        restart_needed(fresh.state.dir != config_.state.dir, "state.dir");
        restart_needed(fresh.reaper.concurrency != config_.reaper.concurrency,
                       "reaper.concurrency");
        fresh.engine = config_.engine;
        fresh.control.socket = config_.control.socket;
        fresh.control.group = config_.control.group;
        fresh.control.max_connections = config_.control.max_connections;
        fresh.control.allow_root = config_.control.allow_root;
        fresh.state = config_.state;
        fresh.reaper.concurrency = config_.reaper.concurrency;
        bool labels_changed = fresh.sessions.labels != config_.sessions.labels;
        config_ = std::move(fresh);
        guard_.configure(GuardConfig::from(config_));
        // The per-uid limits and lease terms apply at once to new connections and leases;
        // held ones stay.
        if (control_) {
            control_->set_uid_limits(config_.control.max_connections_per_uid, config_.control.max_leases_per_uid);
            control_->set_lease_terms(lease_terms());
        }
        if (labels_changed) registry_.rederive_sessions(config_.sessions, now);
        watcher_->set_options({config_.reaper.retry_initial, config_.reaper.retry_max});
        if (capper_) capper_->reconfigure(config_.logs);
        next_resync_ = std::min(next_resync_, now + config_.reaper.resync_interval);
        log(Priority::info, {}, "configuration reloaded", {{"CONFIG", options_.config_path}});
    } catch (const ConfigError& e) {
        std::string problems;
        for (const auto& p : e.problems()) problems += (problems.empty() ? "" : "; ") + p.to_string();
        log(Priority::err, {}, "configuration not reloaded; keeping the running one: " + problems,
            {{"CONFIG", options_.config_path}, {"ERROR", problems}});
    } catch (const std::exception& e) {
        log(Priority::err, {}, std::string("configuration not reloaded; keeping the running one: ") + e.what(),
            {{"CONFIG", options_.config_path}, {"ERROR", e.what()}});
    }
    if (ready_) notify::ready();
}

void Daemon::shut_down() {
    notify::stopping();
    log(Priority::info, {}, "stopping", {{"IN_FLIGHT", std::to_string(in_flight_)}});
    if (metrics_http_) metrics_http_->stop();
    if (control_) control_->stop();
    // Queued attempts not yet started stay pending (and saved); those running may finish.
    for (const auto& job : pool_->drain_queue()) {
        pace_.abandoned(job.sent);
        if (job.object) {
            if (auto it = registry_.pending_objects.find(*job.object); it != registry_.pending_objects.end())
                it->second.in_flight = false;
        } else if (auto it = registry_.pending.find(job.container); it != registry_.pending.end()) {
            it->second.in_flight = false;
        }
        if (in_flight_ > 0) --in_flight_;
    }
    const auto deadline = std::chrono::steady_clock::now() + options_.stop_timeout;
    while (in_flight_ > 0) {
        std::deque<Message> batch;
        {
            std::unique_lock lock(queue_mutex_);
            if (!queue_cv_.wait_until(lock, deadline, [this] { return !queue_.empty(); })) break;
            batch.swap(queue_);
        }
        const TimePoint now = options_.clock();
        for (auto& message : batch) message(now);
    }
    if (in_flight_ > 0)
        log(Priority::warning, {}, "stopping with removals still in flight; they stay pending",
            {{"IN_FLIGHT", std::to_string(in_flight_)}});
    dirty_ = true;
    save_state_if_dirty();
    loop_running_ = false;
    if (capper_) capper_->stop();
    engine_.close();
    watcher_->stop();
    pool_->stop();
    stop_signal_thread();
    log(Priority::info, {}, "stopped", {});
}

void Daemon::stop_signal_thread() {
    signals_done_ = true;
    if (signal_thread_.joinable()) {
        pthread_kill(signal_thread_.native_handle(), wake_signal);
        signal_thread_.join();
    }
}

void Daemon::signal_thread() {
    sigset_t signals = daemon_signals();
    while (!signals_done_) {
        int signo = sigwaitinfo(&signals, nullptr);
        if (signo == SIGTERM || signo == SIGINT) {
            request_stop();
        } else if (signo == SIGHUP) {
            request_reload();
        }
    }
}

// ---- rendering ---------------------------------------------------------------------------

const char* Daemon::engine_state_name(EngineState state) {
    switch (state) {
        case EngineState::starting: return "starting";
        case EngineState::up: return "up";
        case EngineState::down: return "down";
        case EngineState::unsupported: return "unsupported";
    }
    return "starting";
}

// In whole milliseconds, as the state file and status hold times: the two clocks are read
// microseconds apart, and an unrounded offset made a restored deadline show 1 ms off.
// CLOCK_MONOTONIC follows NTP's rate corrections as the wall clock does, so the offset
// changes only when the wall clock is stepped.
Clock::duration Daemon::wall_offset() const {
    return std::chrono::round<std::chrono::milliseconds>(options_.wall_clock() - options_.clock());
}

std::string Daemon::render_status(TimePoint now, const reaper::control::StatusQuery& query) const {
    Poco::JSON::Object root;
    const bool slow = engine_state_ == EngineState::up && last_pace_ == EnginePace::slow;
    root.set("engine", slow ? "slow" : engine_state_name(engine_state_));
    if (!engine_error_.empty()) root.set("engine_error", engine_error_);
    root.set("ready", ready_);
    root.set("dry_run", config_.reaper.dry_run);
    {
        const auto f = pace_.figures(now);
        const auto ms = [](Duration d) {
            return static_cast<std::int64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
        };
        Poco::JSON::Object pace;
        pace.set("limit", f.limit);
        pace.set("max", std::max(1u, config_.reaper.concurrency));
        pace.set("in_flight", static_cast<std::uint64_t>(f.in_flight));
        pace.set("timeouts", static_cast<std::uint64_t>(f.timeouts_recent));
        pace.set("timeouts_total", f.timeouts_total);
        pace.set("latency_ms", ms(f.latency));
        pace.set("latency_max_ms", ms(f.latency_max_recent));
        pace.set("oldest_in_flight_ms", ms(f.oldest_in_flight));
        if (slow_since_)
            pace.set("slow_since", format_rfc3339(*slow_since_ + wall_offset()));
        else
            pace.set("slow_since", Poco::Dynamic::Var());
        root.set("engine_pace", pace);
    }
    // Tombstones can number 100,000 (28 MB of status, over the reply cap, when each was
    // listed): only the newest `limit` are, from the end of the age order.
    std::vector<const std::string*> listed;
    if (!query.ended && !query.pending)
        for (const auto& [id, s] : registry_.sessions)
            if (!registry_.tombstone(id)) listed.push_back(&id);
    const auto& ended = registry_.tombstones();
    const std::uint64_t limit = query.limit.value_or(
        query.ended ? reaper::control::status_default_ended_limit
                    : reaper::control::status_default_newest_ended);
    const auto shown =
        query.pending ? std::size_t{0} : static_cast<std::size_t>(std::min<std::uint64_t>(limit, ended.size()));
    // Newest first, ties by id; the age order breaks ties the other way, so a tie at the cut
    // is taken whole and sorted.
    std::vector<Registry::AgedTombstone> newest;
    for (auto it = registry_.tombstones_by_age().rbegin();
         shown > 0 && it != registry_.tombstones_by_age().rend(); ++it) {
        if (newest.size() >= shown && it->first != newest.back().first) break;
        newest.push_back(*it);
    }
    std::sort(newest.begin(), newest.end(), [](const auto& a, const auto& b) {
        return a.first != b.first ? a.first > b.first : *a.second < *b.second;
    });
    newest.resize(shown);
    for (const auto& entry : newest) listed.push_back(entry.second);
    const Session no_record;
    const Clock::duration to_wall = wall_offset();  // read once, not per listed session
    Poco::JSON::Array sessions;
    for (const std::string* listed_id : listed) {
        const auto& id = *listed_id;
        const auto record = registry_.sessions.find(id);
        const Session& s = record == registry_.sessions.end() ? no_record : record->second;
        const Tombstone* tombstone = registry_.tombstone(id);
        Poco::JSON::Object o;
        o.set("id", id);
        SessionState state = registry_.state_of(id);
        o.set("state", to_string(state));
        o.set("leases", static_cast<std::uint64_t>(s.leases.size()));
        o.set("containers", static_cast<std::uint64_t>(registry_.containers_of(id)));
        o.set("networks", static_cast<std::uint64_t>(registry_.objects_of(id, ObjectKind::network)));
        o.set("volumes", static_cast<std::uint64_t>(registry_.objects_of(id, ObjectKind::volume)));
        const std::optional<TimePoint> deadline =
            tombstone ? deadline_of(*tombstone, config_.sessions) : deadline_of(s, config_.sessions);
        if (deadline) {
            o.set("deadline", format_rfc3339(*deadline + to_wall));
            o.set("deadline_in_ms",
                  std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - now).count());
        } else {
            o.set("deadline", Poco::Dynamic::Var());
            o.set("deadline_in_ms", Poco::Dynamic::Var());
        }
        if (tombstone)
            o.set("end_reason", tombstone->reason ? std::string(to_string(*tombstone->reason)) : std::string());
        o.set("proxy", !s.proxies.empty());
        if (!s.proxies.empty()) {
            const auto labelled = s.labelled();
            o.set("containers_labelled", labelled.containers);
            o.set("networks_labelled", labelled.networks);
            o.set("volumes_labelled", labelled.volumes);
        }
        sessions.add(o);
    }
    root.set("sessions", sessions);
    root.set("ended_sessions", static_cast<std::uint64_t>(ended.size()));
    root.set("ended_listed", static_cast<std::uint64_t>(shown));
    root.set("tracked_containers", static_cast<std::uint64_t>(registry_.tracked_count()));
    // Pending work is bounded the same way: a wedged engine can leave tens of thousands of
    // reaps queued, at about 250 bytes of JSON each when listed. A plain status lists the
    // first few of each list, a "pending":true one up to `limit`; each count is there in full.
    const std::uint64_t pending_limit =
        query.pending ? query.limit.value_or(reaper::control::status_default_pending_limit)
                      : reaper::control::status_default_pending_listed;
    // The first `pending_limit` of `map` by `before`, in that order: O(n log pending_limit).
    const auto first_of = [pending_limit](const auto& map, auto before) {
        std::vector<const typename std::decay_t<decltype(map)>::value_type*> entries;
        entries.reserve(map.size());
        for (const auto& entry : map) entries.push_back(&entry);
        const auto cut = static_cast<std::ptrdiff_t>(std::min<std::uint64_t>(pending_limit, entries.size()));
        std::partial_sort(entries.begin(), entries.begin() + cut, entries.end(),
                          [&](const auto* a, const auto* b) { return before(*a, *b); });
        entries.resize(static_cast<std::size_t>(cut));
        return entries;
    };
    root.set("pending_reaps", static_cast<std::uint64_t>(registry_.pending.size()));
    // Oldest first: the reap queued longest ago (ties by container id).
    const auto oldest_reaps = first_of(registry_.pending, [](const auto& a, const auto& b) {
        return a.second.due != b.second.due ? a.second.due < b.second.due : a.first < b.first;
    });
    root.set("pending_listed", static_cast<std::uint64_t>(oldest_reaps.size()));
    Poco::JSON::Array pending;
    for (const auto* entry : oldest_reaps) {
        const auto& [id, p] = *entry;
        Poco::JSON::Object o;
        o.set("container", id);
        o.set("name", p.name);
        o.set("session", p.session);
        o.set("reason", std::string(to_string(p.reason)));
        o.set("failures", p.failures);
        o.set("in_flight", p.in_flight);
        pending.add(o);
    }
    root.set("pending", pending);
    root.set("tracked_networks", static_cast<std::uint64_t>(registry_.tracked_objects(ObjectKind::network)));
    root.set("tracked_volumes", static_cast<std::uint64_t>(registry_.tracked_objects(ObjectKind::volume)));
    root.set("pending_network_reaps",
             static_cast<std::uint64_t>(registry_.pending_objects_of(ObjectKind::network)));
    root.set("pending_volume_reaps",
             static_cast<std::uint64_t>(registry_.pending_objects_of(ObjectKind::volume)));
    // Removals keep no queue time: the one next to be attempted first (ties by kind and id).
    const auto next_removals = first_of(registry_.pending_objects, [](const auto& a, const auto& b) {
        return a.second.next_attempt != b.second.next_attempt ? a.second.next_attempt < b.second.next_attempt
                                                              : a.first < b.first;
    });
    root.set("pending_objects_listed", static_cast<std::uint64_t>(next_removals.size()));
    Poco::JSON::Array pending_objects;
    for (const auto* entry : next_removals) {
        const auto& [ref, p] = *entry;
        Poco::JSON::Object o;
        o.set("kind", std::string(to_string(ref.kind)));
        o.set("id", ref.id);
        o.set("name", p.name);
        o.set("session", p.session);
        o.set("failures", p.failures);
        o.set("in_flight", p.in_flight);
        pending_objects.add(o);
    }
    root.set("pending_objects", pending_objects);
    Poco::JSON::Object counters;
    counters.set("reaps_done", metrics_.reaps_done());
    counters.set("reaps_failed", metrics_.reaps_failed());
    counters.set("engine_reconnects", metrics_.engine_reconnects());
    counters.set("networks_reaped", metrics_.networks_reaped());
    counters.set("volumes_reaped", metrics_.volumes_reaped());
    counters.set("log_bytes_dropped",
                 capper_ ? capper_->counters().log_bytes_dropped : std::uint64_t{0});
    counters.set("log_unopenable", capper_ ? capper_->counters().log_unopenable : std::uint64_t{0});
    counters.set("log_cut_fallbacks", capper_ ? capper_->counters().cut_fallbacks : std::uint64_t{0});
    Poco::JSON::Object actions;
    auto all_actions = metrics_.actions();
    for (const auto& [kind, count] : capper_actions()) all_actions[kind] += count;
    for (const auto& [kind, count] : refusals()) all_actions[kind] += count;
    for (const auto& [kind, count] : all_actions) actions.set(kind, count);
    counters.set("actions", actions);
    Poco::JSON::Object guard;
    for (const auto& [outcome, count] : guard_.counts()) guard.set(outcome, count);
    counters.set("guard", guard);
    root.set("counters", counters);
    std::ostringstream out;
    root.stringify(out);
    return out.str();
}

std::map<std::string, std::uint64_t> Daemon::capper_actions() const {
    if (!capper_) return {};
    auto c = capper_->counters();
    std::map<std::string, std::uint64_t> actions;
    for (const auto& [action, name] : log_action_names) {
        switch (action) {
            case LogAction::truncate: actions[std::string(name)] = c.truncations; break;
            case LogAction::stop: actions[std::string(name)] = c.stops; break;
            case LogAction::kill: actions[std::string(name)] = c.kills; break;
            case LogAction::remove: actions[std::string(name)] = c.removals; break;
        }
    }
    return actions;
}

std::map<std::string, std::uint64_t> Daemon::refusals() const {
    auto counts = guard_.counts();
    std::erase_if(counts, [](const auto& entry) { return entry.first.rfind("refused_", 0) != 0; });
    return counts;
}

std::string Daemon::render_metrics() const {
    Gauges gauges;
    gauges.tracked_containers = registry_.tracked_count();
    for (const auto& [id, s] : registry_.sessions)
        if (!registry_.tombstone(id)) ++gauges.sessions_by_state[to_string(s.record_state())];
    gauges.tombstones = registry_.tombstones().size();
    gauges.sessions_by_state["ended"] = gauges.tombstones;
    gauges.pending_reaps = registry_.pending.size();
    gauges.tracked_networks = registry_.tracked_objects(ObjectKind::network);
    gauges.tracked_volumes = registry_.tracked_objects(ObjectKind::volume);
    gauges.pending_network_reaps = registry_.pending_objects_of(ObjectKind::network);
    gauges.pending_volume_reaps = registry_.pending_objects_of(ObjectKind::volume);
    gauges.engine_up = engine_state_ == EngineState::up;
    gauges.engine_slow = last_pace_ == EnginePace::slow;
    gauges.removal_limit = pace_.limit();
    gauges.removals_in_flight = pace_.in_flight();
    if (capper_) {
        const auto counters = capper_->counters();
        gauges.log_bytes_dropped = counters.log_bytes_dropped;
        gauges.log_action_failures = counters.action_failures;
        gauges.log_unopenable = counters.log_unopenable;
        gauges.log_open_failures = counters.log_open_failures;
        gauges.log_cut_fallbacks = counters.cut_fallbacks;
    }
    gauges.process = read_process_stats();
    gauges.log_actions = capper_actions();
    for (const auto& [kind, count] : refusals()) gauges.log_actions[kind] += count;
    return metrics_.render(gauges);
}

}  // namespace reaperd
