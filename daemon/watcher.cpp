#include "watcher.hpp"

#include "policy.hpp"
#include "registry.hpp"  // format_rfc3339

#include <random>
#include <utility>

namespace reaperd {

namespace {

// The event of a container, network or volume being removed: Docker says "destroy", Podman
// "remove" (and a filter on "destroy" matches nothing there).
bool is_removal(const std::string& action) { return action == "destroy" || action == "remove"; }

}  // namespace

bool Watcher::is_engine_attribute(const std::string& key) {
    return key == "name" || key == "image" || key == "containerExitCode" || key == "podId";
}

std::optional<reaper::ContainerInfo> Watcher::from_event(const reaper::Event& event) {
    auto name = event.attributes.find("name");
    if (name == event.attributes.end()) return std::nullopt;
    reaper::ContainerInfo info;
    info.id = event.id;
    info.name = name->second;
    if (auto image = event.attributes.find("image"); image != event.attributes.end())
        info.image = image->second;
    for (const auto& [key, value] : event.attributes)
        if (!is_engine_attribute(key)) info.labels.emplace(key, value);
    // The event's own time: a create event is stamped when the engine made the container.
    if (event.time_nano > 0)
        info.created = format_rfc3339(TimePoint{std::chrono::duration_cast<TimePoint::duration>(
            std::chrono::nanoseconds{event.time_nano})});
    info.state.status = event.action == "start" ? "running" : "created";
    info.state.running = event.action == "start";
    return info;
}

reaper::ContainerInfo Watcher::from_summary(const reaper::ContainerSummary& summary) {
    reaper::ContainerInfo info;
    info.id = summary.id;
    if (!summary.names.empty()) info.name = summary.names.front();
    info.image = summary.image;
    info.labels = summary.labels;
    if (summary.created_unix_s > 0)
        info.created = format_rfc3339(TimePoint{std::chrono::seconds{summary.created_unix_s}});
    info.state.status = summary.state;
    info.state.running = summary.phase() == reaper::ContainerStatus::running;
    return info;
}

Watcher::Watcher(EnginePort& engine, WatcherOptions options, Sink sink)
    : engine_(engine), sink_(std::move(sink)), options_(options) {}

Watcher::~Watcher() { stop(); }

void Watcher::start() {
    thread_ = std::thread([this] { run(); });
    for (unsigned i = 0; i < lookup_threads; ++i) lookup_threads_.emplace_back([this] { run_lookups(); });
}

void Watcher::resync() {
    {
        std::lock_guard lock(mutex_);
        resync_requested_ = true;
        if (stream_) stream_->cancel();
    }
    wake_.notify_all();
}

void Watcher::set_options(WatcherOptions options) {
    std::lock_guard lock(mutex_);
    options_ = options;
}

void Watcher::stop() {
    {
        std::lock_guard lock(mutex_);
        stopping_ = true;
        if (stream_) stream_->cancel();
        lookup_queue_.clear();
    }
    wake_.notify_all();
    lookup_ready_.notify_all();
    root_known_.notify_all();
    if (thread_.joinable()) thread_.join();
    for (auto& t : lookup_threads_)
        if (t.joinable()) t.join();
}

void Watcher::want_log_info(const std::string& id) {
    std::lock_guard lock(mutex_);
    auto known = known_.find(id);
    if (stopping_ || known == known_.end()) return;
    known->second.wants_log_info = true;
    queue_lookup_locked(id);
}

void Watcher::queue_lookup_locked(const std::string& id) {
    Lookup& lookup = lookups_[id];
    if (lookup.queued) return;  // the queued one has not asked the engine yet: it will see the newest
    if (lookup.running) {
        lookup.again = true;
        return;
    }
    lookup.queued = true;
    lookup_queue_.push_back(id);
    lookup_ready_.notify_one();
}

void Watcher::run_lookups() {
    std::unique_lock lock(mutex_);
    for (;;) {
        const auto catch_up_due = [this] { return catch_up_at_ && std::chrono::steady_clock::now() >= *catch_up_at_; };
        const auto work = [this] { return stopping_ || root_wanted_ || !lookup_queue_.empty(); };
        // Without a catch-up due, a wait ends when one is set, to wait for it with its deadline.
        if (catch_up_at_)
            lookup_ready_.wait_until(lock, *catch_up_at_, [&] { return work() || catch_up_due(); });
        else
            lookup_ready_.wait(lock, [&] { return work() || catch_up_at_.has_value(); });
        if (stopping_) return;
        if (catch_up_due()) {
            catch_up_at_.reset();
            lock.unlock();
            catch_up();
            lock.lock();
            continue;
        }
        if (!root_wanted_ && lookup_queue_.empty()) continue;
        if (std::exchange(root_wanted_, false)) {
            lock.unlock();
            // An engine that will not say leaves the capper to learn it from a json-file
            // LogPath; one that is gone fails the list too.
            std::string root;
            try {
                root = engine_.info().docker_root_dir;
            } catch (const reaper::EngineError&) {
            }
            lock.lock();
            docker_root_dir_ = std::move(root);
            root_pending_ = false;
            root_known_.notify_all();
            continue;
        }
        std::string id = std::move(lookup_queue_.front());
        lookup_queue_.pop_front();
        lookups_[id].queued = false;
        lookups_[id].running = true;
        lock.unlock();
        std::optional<reaper::ContainerInfo> info;
        bool failed = false;
        try {
            info = engine_.inspect(id);
        } catch (const reaper::NotFound&) {
            // Removed before we looked: its Gone is on its way.
        } catch (const reaper::EngineError&) {
            failed = true;
        }
        lock.lock();
        if (info && info->log_driver == "local")
            root_known_.wait(lock, [this] { return stopping_ || !root_pending_; });
        if (auto known = known_.find(id); known != known_.end() && !stopping_) {
            // Asked again at the next list (the stream breaks too when the engine is away).
            known->second.lookup_failed = failed;
            if (info) sink_(watch::Appeared{std::move(*info), docker_root_dir_, true});
        }
        Lookup& lookup = lookups_[id];
        lookup.running = false;
        if (lookup.again && !stopping_ && known_.count(id)) {
            lookup.again = false;
            lookup.queued = true;
            lookup_queue_.push_back(id);
            lookup_ready_.notify_one();
        } else if (!lookup.queued) {
            lookups_.erase(id);
        }
    }
}

void Watcher::appeared(reaper::ContainerInfo info) {
    std::lock_guard lock(mutex_);
    appeared_locked(std::move(info));
}

void Watcher::appeared_locked(reaper::ContainerInfo info) {
    if (!known_.emplace(info.id, Known{}).second) return;
    sink_(watch::Appeared{std::move(info), docker_root_dir_, false});
}

void Watcher::gone(const std::string& id) {
    std::lock_guard lock(mutex_);
    if (catching_up_) gone_during_catch_up_.insert(id);
    if (!known_.erase(id)) return;
    if (auto lookup = lookups_.find(id); lookup != lookups_.end()) {
        // One running finds the id unknown and sends nothing; one queued is dropped here.
        lookup->second.again = false;
        if (lookup->second.queued) {
            std::erase(lookup_queue_, id);
            lookup->second.queued = false;
        }
        if (!lookup->second.running) lookups_.erase(lookup);
    }
    sink_(watch::Gone{id});
}

void Watcher::container_event(const reaper::Event& event) {
    if (is_removal(event.action)) return gone(event.id);
    if (event.action != "create" && event.action != "start") return;
    bool known;
    {
        std::lock_guard lock(mutex_);
        auto it = known_.find(event.id);
        known = it != known_.end();
        // A start sets LogPath: a container whose log info was asked for is looked up again.
        if (known && event.action == "start" && it->second.wants_log_info) queue_lookup_locked(event.id);
    }
    if (known) return;
    if (auto info = from_event(event)) {
        appeared(std::move(*info));
        return;
    }
    // An engine whose events carry no attributes: inspect, as the only way to its labels.
    try {
        appeared(engine_.inspect(event.id));
    } catch (const reaper::NotFound&) {
        // Created and destroyed before we looked: nothing to track.
    }
}

bool Watcher::sleep_for(std::chrono::milliseconds delay) {
    std::unique_lock lock(mutex_);
    wake_.wait_for(lock, delay, [this] { return stopping_ || resync_requested_; });
    // A resync cuts the pause short once: asked again while the engine stays away, the next
    // pause is whole.
    resync_requested_ = false;
    return !stopping_;
}

void Watcher::run() {
    std::minstd_rand random{std::random_device{}()};
    std::uniform_real_distribution<double> jitter(0.0, 1.0);
    enum class Engine { unknown, up, down, unsupported } engine_state = Engine::unknown;
    std::string unsupported_error;
    unsigned failures = 0;
    for (;;) {
        WatcherOptions options;
        {
            std::lock_guard lock(mutex_);
            if (stopping_) return;
            options = options_;
        }
        try {
            // Subscribe before listing, so nothing that happens during the list is missed;
            // events about containers the list already had are harmless repeats.
            reaper::EventsOptions events_options;
            events_options.filters = {{"type", {"container", "network", "volume"}},
                                      {"event", {"create", "start", "destroy", "remove"}}};
            std::unique_ptr<reaper::EventStream> stream = engine_.events(events_options);
            {
                std::lock_guard lock(mutex_);
                if (stopping_) return;
                stream_ = stream.get();
                resync_requested_ = false;
            }
            struct Unregister {
                Watcher* w;
                ~Unregister() {
                    std::lock_guard lock(w->mutex_);
                    w->stream_ = nullptr;
                }
            } unregister{this};
            list_and_reconcile();
            if (engine_state != Engine::up) {
                if (options.catch_up_after.count() > 0) {
                    std::lock_guard lock(mutex_);
                    catch_up_at_ = std::chrono::steady_clock::now() + options.catch_up_after;
                    lookup_ready_.notify_all();
                }
                engine_state = Engine::up;
                sink_(watch::EngineUp{});
            }
            failures = 0;
            while (auto event = stream->next()) {
                if (event->type == "network" || event->type == "volume") {
                    object_event(*event);
                    continue;
                }
                if (event->type == "container") container_event(*event);
            }
            bool asked;
            {
                std::lock_guard lock(mutex_);
                asked = resync_requested_ || stopping_;
            }
            // The engine ended the stream on its own (shutting down, say): pause briefly
            // rather than spin against it.
            if (!asked && !sleep_for(options.retry_initial)) return;
        } catch (const std::exception& e) {
            {
                std::lock_guard lock(mutex_);
                if (stopping_) return;
            }
            if (dynamic_cast<const reaper::UnsupportedVersion*>(&e)) {
                // Reported again when the reason changed (the engine was replaced by another
                // version that we still cannot speak).
                if (engine_state != Engine::unsupported || unsupported_error != e.what()) {
                    engine_state = Engine::unsupported;
                    unsupported_error = e.what();
                    sink_(watch::EngineUnsupported{e.what()});
                }
            } else if (engine_state != Engine::down) {
                engine_state = Engine::down;
                sink_(watch::EngineDown{e.what()});
            }
            ++failures;
            if (!sleep_for(retry_delay(failures, options.retry_initial, options.retry_max,
                                       jitter(random))))
                return;
        }
    }
}

void Watcher::list_and_reconcile() {
    reaper::ListOptions options;
    options.all = true;
    // The log capper finds local-driver logs under the data root. Asked at every list, as
    // the engine may have restarted with another, beside the list (see docker_root_dir_).
    {
        std::lock_guard lock(mutex_);
        root_wanted_ = true;
        root_pending_ = true;
    }
    lookup_ready_.notify_one();
    // Every row is reported from the list itself: the loop is ready at the first Listed, and
    // log info is fetched after it, on the lookup threads, for the containers it asks about.
    auto summaries = engine_.list_containers(options);
    std::set<std::string> ids;
    for (const auto& summary : summaries) {
        ids.insert(summary.id);
        appeared(from_summary(summary));
    }
    std::vector<std::string> vanished;
    {
        std::lock_guard lock(mutex_);
        for (const auto& [id, known] : known_)
            if (!ids.count(id)) vanished.push_back(id);
    }
    for (const auto& id : vanished) gone(id);
    {
        std::lock_guard lock(mutex_);
        sink_(watch::Listed{std::move(ids)});
        // Lookups that failed (the engine was away) are asked again now that it answers.
        for (auto& [id, known] : known_)
            if (known.lookup_failed) queue_lookup_locked(id);
    }
    list_objects();
}

void Watcher::catch_up() {
    {
        std::lock_guard lock(mutex_);
        catching_up_ = true;
        gone_during_catch_up_.clear();
    }
    reaper::ListOptions options;
    options.all = true;
    std::vector<reaper::ContainerSummary> summaries;
    try {
        summaries = engine_.list_containers(options);
    } catch (const reaper::EngineError&) {
    }
    // A row the stream said was removed while the list was out would come back as a
    // container that is no more: skipped.
    std::lock_guard lock(mutex_);
    for (const auto& summary : summaries)
        if (!gone_during_catch_up_.count(summary.id)) appeared_locked(from_summary(summary));
    catching_up_ = false;
    gone_during_catch_up_.clear();
}

// Networks and volumes, after the containers: the loop then knows which containers still
// hold them. Their lists carry the labels, so nothing is inspected here.
void Watcher::list_objects() {
    // Members assigned one by one: GCC 12 at -O3 (the .deb's build) reads the nested braced
    // initializer as using an uninitialized string.
    const auto object = [](ObjectKind kind, std::string id, std::string name, reaper::Labels labels) {
        watch::Object o;
        o.ref.kind = kind;
        o.ref.id = std::move(id);
        o.name = std::move(name);
        o.labels = std::move(labels);
        return o;
    };
    watch::ObjectsListed networks{ObjectKind::network, {}};
    for (auto& n : engine_.list_networks({}))
        networks.objects.push_back(object(ObjectKind::network, n.id, n.name, std::move(n.labels)));
    watch::ObjectsListed volumes{ObjectKind::volume, {}};
    for (auto& v : engine_.list_volumes({}))
        volumes.objects.push_back(object(ObjectKind::volume, v.name, v.name, std::move(v.labels)));
    sink_(std::move(networks));
    sink_(std::move(volumes));
}

// A network's or volume's create (inspected: its event carries no labels) or removal
// (Docker says "destroy", Podman "remove").
void Watcher::object_event(const reaper::Event& event) {
    const ObjectRef ref{event.type == "network" ? ObjectKind::network : ObjectKind::volume, event.id};
    if (is_removal(event.action)) {
        sink_(watch::ObjectGone{ref});
    } else if (event.action == "create") {
        try {
            watch::Object object{ref, "", {}};
            if (ref.kind == ObjectKind::network) {
                auto n = engine_.inspect_network(ref.id);
                object.ref.id = n.id;
                object.name = n.name;
                object.labels = std::move(n.labels);
            } else {
                auto v = engine_.inspect_volume(ref.id);
                object.name = v.name;
                object.labels = std::move(v.labels);
            }
            sink_(watch::ObjectAppeared{std::move(object)});
        } catch (const reaper::NotFound&) {
            // Created and removed before we looked.
        }
    }
}

}  // namespace reaperd
