#include "guard.hpp"

#include <algorithm>

namespace reaperd {

namespace {

std::string short_id(const std::string& id) { return id.substr(0, 12); }

// Runs one act's inspect-judge-call `step` and turns what it throws into the result: 404 is
// `gone`; the engine's own removal already under way is `removing`; anything else is
// `failed` with its text. The engine's wording is the library's to read (RemovalInProgress).
template <class Step>
void settle(GuardResult& result, Step&& step) {
    try {
        step();
    } catch (const reaper::NotFound&) {
        result.outcome = Outcome::gone;
    } catch (const reaper::RemovalInProgress&) {
        result.outcome = Outcome::removing;
    } catch (const reaper::Timeout& e) {
        result.outcome = Outcome::failed;
        result.error = describe(e);
        result.unanswered = true;
    } catch (const reaper::EngineError& e) {
        result.outcome = Outcome::failed;
        result.error = describe(e);
    } catch (const std::exception& e) {
        result.outcome = Outcome::failed;
        result.error = e.what();
    }
}

// `reference`: what the caller named; `kind`: "container", "network", "volume".
std::string refusal_text(Outcome outcome, const std::string& reference, std::string_view kind,
                         const Expectation& expect, const GuardResult& result,
                         const GuardConfig& config) {
    switch (outcome) {
        case Outcome::refused_not_pinned:
            return "\"" + reference + "\" is not the full id of the " + std::string(kind) + " it names";
        case Outcome::refused_not_owned: {
            std::string keys;
            for (const auto& key : config.labels) keys += (keys.empty() ? "" : ", ") + key;
            return "it carries none of the labels in sessions.labels (" + keys + ")";
        }
        case Outcome::refused_other_session:
            return "it belongs to session " + result.session.value_or("") + ", not " +
                   expect.session.value_or("");
        case Outcome::refused_session_alive:
            return "its session " + result.session.value_or("") + " is alive";
        default: return std::string(to_string(outcome));
    }
}

}  // namespace

GuardConfig GuardConfig::from(const Config& config) {
    return {config.sessions.labels, config.reaper.dry_run};
}

std::string_view to_string(ContainerAct act) noexcept {
    switch (act) {
        case ContainerAct::remove: return "remove";
        case ContainerAct::stop: return "stop";
        case ContainerAct::kill: return "kill";
    }
    return "remove";
}

std::string_view to_string(ObjectKind kind) noexcept {
    switch (kind) {
        case ObjectKind::network: return "network";
        case ObjectKind::volume: return "volume";
    }
    return "network";
}

InspectedObject InspectedObject::of(const reaper::NetworkInfo& network) {
    return {network.id, network.name, network.labels, network.containers.size()};
}

InspectedObject InspectedObject::of(const reaper::VolumeInfo& volume) {
    return {volume.name, volume.name, volume.labels, 0};
}

std::string_view to_string(Outcome outcome) noexcept {
    switch (outcome) {
        case Outcome::acted: return "acted";
        case Outcome::gone: return "gone";
        case Outcome::removing: return "removing";
        case Outcome::not_running: return "not_running";
        case Outcome::refused_not_pinned: return "refused_not_pinned";
        case Outcome::refused_not_owned: return "refused_not_owned";
        case Outcome::refused_other_session: return "refused_other_session";
        case Outcome::refused_session_alive: return "refused_session_alive";
        case Outcome::dry_run: return "dry_run";
        case Outcome::failed: return "failed";
    }
    return "failed";
}

bool is_refusal(Outcome outcome) noexcept {
    return outcome == Outcome::refused_not_pinned || outcome == Outcome::refused_not_owned ||
           outcome == Outcome::refused_other_session || outcome == Outcome::refused_session_alive;
}

std::optional<std::string> owning_session(const reaper::Labels& labels,
                                          const std::vector<std::string>& label_keys) {
    for (const auto& key : label_keys) {
        auto it = labels.find(key);
        if (it != labels.end()) return it->second;
    }
    return std::nullopt;
}

std::optional<Outcome> ownership_refusal(const reaper::Labels& labels, const GuardConfig& config,
                                         const std::optional<std::string>& expected_session) {
    auto owner = owning_session(labels, config.labels);
    if (!owner) return Outcome::refused_not_owned;
    if (expected_session && *owner != *expected_session) return Outcome::refused_other_session;
    return std::nullopt;
}

Outcome judge(const std::optional<reaper::ContainerInfo>& inspected, const GuardRequest& request,
              const GuardConfig& config) {
    if (!inspected) return Outcome::gone;
    // The engine resolves names and id prefixes too; only the exact full id is pinned.
    if (inspected->id != request.container) return Outcome::refused_not_pinned;
    if (auto refusal = ownership_refusal(inspected->labels, config, request.expect.session))
        return *refusal;
    if (request.expect.session_alive) return Outcome::refused_session_alive;
    if (request.act == ContainerAct::remove) {
        if (inspected->state.removing()) return Outcome::removing;
    } else if (!inspected->state.running) {
        return Outcome::not_running;
    }
    if (config.dry_run) return Outcome::dry_run;
    return Outcome::acted;
}

Outcome judge(const std::optional<InspectedObject>& inspected, const ObjectRequest& request,
              const GuardConfig& config) {
    if (!inspected) return Outcome::gone;
    // The engine resolves a network's name and id prefixes too: only its full id pins it.
    // A volume has no other id than its name, looked up exactly.
    if (request.object.kind == ObjectKind::network && !is_full_container_id(request.object.id))
        return Outcome::refused_not_pinned;
    if (inspected->id != request.object.id) return Outcome::refused_not_pinned;
    if (auto refusal = ownership_refusal(inspected->labels, config, request.expect.session))
        return *refusal;
    if (request.expect.session_alive) return Outcome::refused_session_alive;
    if (inspected->attached > 0) return Outcome::failed;
    if (config.dry_run) return Outcome::dry_run;
    return Outcome::acted;
}

std::vector<LogField> object_fields(const ObjectRef& object, const std::string& name) {
    if (object.kind == ObjectKind::volume) return {{"VOLUME_NAME", object.id}};
    std::vector<LogField> fields{{"NETWORK_ID", object.id}};
    if (!name.empty()) fields.push_back({"NETWORK_NAME", name});
    return fields;
}

std::string describe(const ObjectRef& object, const std::string& name) {
    if (object.kind == ObjectKind::volume) return "volume " + object.id;
    return "network " + (name.empty() ? object.id : name + " (" + short_id(object.id) + ")");
}

bool is_full_container_id(std::string_view reference) noexcept {
    return reference.size() == 64 && std::all_of(reference.begin(), reference.end(), [](char c) {
               return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
           });
}

std::string describe(const reaper::EngineError& error) {
    std::string text = std::string(reaper::to_string(error.kind()));
    if (error.status()) {
        // Appended in two steps: GCC 12's -Wrestrict misreads `" " + to_string(...)` at -O2.
        text += ' ';
        text += std::to_string(error.status());
    }
    text += ": ";
    text += error.engine_message().empty() ? error.what() : error.engine_message();
    return text;
}

Guard::Guard(EnginePort& engine, GuardConfig config, LogSink sink)
    : engine_(engine),
      sink_(std::move(sink)),
      config_(std::make_shared<const GuardConfig>(std::move(config))) {}

LogSink Guard::default_sink() {
    return [](Priority p, std::string_view id, std::string_view message, std::vector<LogField> fields) {
        log(p, id, message, std::move(fields));
    };
}

void Guard::configure(GuardConfig config) {
    auto fresh = std::make_shared<const GuardConfig>(std::move(config));
    std::lock_guard lock(mutex_);
    config_ = std::move(fresh);
}

std::shared_ptr<const GuardConfig> Guard::config() const {
    std::lock_guard lock(mutex_);
    return config_;
}

GuardResult Guard::act(const GuardRequest& request) {
    const auto config = this->config();
    GuardResult result;
    settle(result, [&] {
        std::optional<reaper::ContainerInfo> inspected;
        try {
            inspected = engine_.inspect(request.container);
            result.name = inspected->name;
            result.session = owning_session(inspected->labels, config->labels);
        } catch (const reaper::NotFound&) {
            // nullopt: judge() makes it `gone`.
        }
        result.outcome = judge(inspected, request, *config);
        if (result.outcome == Outcome::acted && came_alive(request.expect))
            result.outcome = Outcome::refused_session_alive;
        if (result.outcome == Outcome::acted) call(inspected->id, request);
    });
    count(result);
    record(request, result, *config);
    return result;
}

GuardResult Guard::act(const ObjectRequest& request) {
    const auto config = this->config();
    const ObjectRef& object = request.object;
    GuardResult result;
    // In use (a network's active endpoints: 403; a volume in use: 409) is a failure like any
    // other: retried with backoff until whatever holds it is gone.
    settle(result, [&] {
        std::optional<InspectedObject> inspected;
        try {
            inspected = object.kind == ObjectKind::network
                            ? InspectedObject::of(engine_.inspect_network(object.id))
                            : InspectedObject::of(engine_.inspect_volume(object.id));
            result.name = inspected->name;
            result.session = owning_session(inspected->labels, config->labels);
        } catch (const reaper::NotFound&) {
            // nullopt: judge() makes it `gone`.
        }
        result.outcome = judge(inspected, request, *config);
        if (result.outcome == Outcome::acted && came_alive(request.expect))
            result.outcome = Outcome::refused_session_alive;
        if (result.outcome == Outcome::acted) {
            if (object.kind == ObjectKind::network)
                engine_.remove_network(inspected->id);
            else
                engine_.remove_volume(inspected->id);
        } else if (result.outcome == Outcome::failed) {
            result.error = "still attached to " + std::to_string(inspected->attached) + " container" +
                           (inspected->attached == 1 ? "" : "s");
        }
    });
    count(result);
    record(request, result, *config);
    return result;
}

void Guard::call(const std::string& id, const GuardRequest& request) {
    switch (request.act) {
        case ContainerAct::remove: engine_.remove(id, reaper::RemoveOptions{true, true}); break;
        case ContainerAct::stop: engine_.stop(id, request.stop_grace); break;
        case ContainerAct::kill: engine_.kill(id, "SIGKILL"); break;
    }
}

// Refusals and dry runs are logged here, so every caller's are; what was done (or failed)
// is the caller's to log, in its own words.
void Guard::record(const GuardRequest& request, const GuardResult& result, const GuardConfig& config) {
    const bool refused = is_refusal(result.outcome);
    if (!refused && result.outcome != Outcome::dry_run) return;
    std::string act(to_string(request.act));
    std::string subject = "container " + (result.name.empty() ? request.container
                                                               : result.name + " (" + short_id(request.container) + ")");
    std::vector<LogField> fields{{"CONTAINER_ID", request.container}};
    if (!result.name.empty()) fields.push_back({"CONTAINER_NAME", result.name});
    if (result.session) fields.push_back({"SESSION_ID", *result.session});
    if (auto reason = to_string(request.reason); !reason.empty())
        fields.push_back({"REASON", std::string(reason)});
    if (refused) {
        fields.push_back({"ACTION", "refused"});
        fields.push_back({"REFUSAL", std::string(to_string(result.outcome))});
        sink_(Priority::warning, {},
              "not going to " + act + " " + subject + ": " +
                  refusal_text(result.outcome, request.container, "container", request.expect, result,
                               config) +
                  "; left alone",
              std::move(fields));
    } else {
        fields.push_back({"ACTION", dry_run_action(act)});  // as the capper's own dry-run records
        sink_(Priority::notice, message_id::would_reap, "dry run: would " + act + " " + subject,
              std::move(fields));
    }
}

void Guard::record(const ObjectRequest& request, const GuardResult& result, const GuardConfig& config) {
    const bool refused = is_refusal(result.outcome);
    if (!refused && result.outcome != Outcome::dry_run) return;
    const ObjectRef& object = request.object;
    std::string subject = describe(object, result.name);
    auto fields = object_fields(object, result.name);
    if (result.session) fields.push_back({"SESSION_ID", *result.session});
    fields.push_back({"REASON", std::string(to_string(request.reason))});
    if (refused) {
        fields.push_back({"ACTION", "refused"});
        fields.push_back({"REFUSAL", std::string(to_string(result.outcome))});
        sink_(Priority::warning, {},
              "not going to remove " + subject + ": " +
                  refusal_text(result.outcome, object.id, to_string(object.kind), request.expect, result,
                               config) +
                  "; left alone",
              std::move(fields));
    } else {
        fields.push_back({"ACTION", dry_run_action(to_string(ContainerAct::remove))});
        sink_(Priority::notice, message_id::would_reap, "dry run: would remove " + subject,
              std::move(fields));
    }
}

void Guard::lease_opening(const std::string& session) {
    std::lock_guard lock(mutex_);
    ++leases_opened_[session];
}

void Guard::forget_session(const std::string& session) {
    std::lock_guard lock(mutex_);
    leases_opened_.erase(session);
}

bool Guard::came_alive(const Expectation& expect) const {
    if (!expect.leases_opened || !expect.session) return false;
    std::lock_guard lock(mutex_);
    auto it = leases_opened_.find(*expect.session);
    // More, not different: a count the door forgot (forget_session racing a new lease) reads
    // as 0 and must not stop the reaps of a session that is not alive.
    return it != leases_opened_.end() && it->second > *expect.leases_opened;
}

void Guard::count(const GuardResult& result) {
    if (result.unanswered)
        ++unanswered_;
    else
        counts_[static_cast<std::size_t>(result.outcome)]++;
}

std::map<std::string, std::uint64_t> Guard::counts() const {
    std::map<std::string, std::uint64_t> out;
    for (std::size_t i = 0; i < outcome_count; ++i)
        if (auto n = counts_[i].load()) out[std::string(to_string(static_cast<Outcome>(i)))] = n;
    if (auto n = unanswered_.load()) out["unanswered"] = n;
    return out;
}

}  // namespace reaperd
