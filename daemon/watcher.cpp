#include "watcher.hpp"

#include "policy.hpp"

#include <random>

namespace reaperd {

namespace {

// The event of a container, network or volume being removed: Docker says "destroy", Podman
// "remove" (and a filter on "destroy" matches nothing there).
bool is_removal(const std::string& action) { return action == "destroy" || action == "remove"; }

}  // namespace

Watcher::Watcher(reaper::Engine& engine, WatcherOptions options, Sink sink)
    : engine_(engine), sink_(std::move(sink)), options_(options) {}

Watcher::~Watcher() { stop(); }

void Watcher::start() { thread_ = std::thread([this] { run(); }); }

void Watcher::resync() {
    std::lock_guard lock(mutex_);
    resync_requested_ = true;
    if (stream_) stream_->cancel();
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
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
}

bool Watcher::sleep_for(std::chrono::milliseconds delay) {
    std::unique_lock lock(mutex_);
    wake_.wait_for(lock, delay, [this] { return stopping_; });
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
                engine_state = Engine::up;
                sink_(watch::EngineUp{});
            }
            failures = 0;
            while (auto event = stream->next()) {
                if (event->type == "network" || event->type == "volume") {
                    object_event(*event);
                    continue;
                }
                if (event->type != "container") continue;
                if (event->action == "create" || event->action == "start") {
                    // A start is reported again: the engine sets LogPath only then.
                    if (event->action == "create" && known_.count(event->id)) continue;
                    try {
                        auto info = engine_.inspect(event->id);
                        known_.insert(info.id);
                        sink_(watch::Appeared{std::move(info), docker_root_dir_});
                    } catch (const reaper::NotFound&) {
                        // Created and destroyed before we looked: nothing to track.
                    }
                } else if (is_removal(event->action)) {
                    if (known_.erase(event->id)) sink_(watch::Gone{event->id});
                }
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
    // the engine may have restarted with another. An engine that will not say leaves the
    // capper to learn it from a json-file LogPath; one that is gone fails the list below.
    try {
        docker_root_dir_ = engine_.info().docker_root_dir;
    } catch (const reaper::EngineError&) {
    }
    auto summaries = engine_.list_containers(options);
    std::set<std::string> ids;
    for (const auto& summary : summaries) {
        ids.insert(summary.id);
        if (known_.count(summary.id)) continue;
        try {
            auto info = engine_.inspect(summary.id);
            known_.insert(info.id);
            sink_(watch::Appeared{std::move(info), docker_root_dir_});
        } catch (const reaper::NotFound&) {
            ids.erase(summary.id);
        }
    }
    for (auto it = known_.begin(); it != known_.end();) {
        if (!ids.count(*it)) {
            sink_(watch::Gone{*it});
            it = known_.erase(it);
        } else {
            ++it;
        }
    }
    sink_(watch::Listed{std::move(ids)});
    list_objects();
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
