#include <reaper/session.hpp>

#include <reaper/control.hpp>
#include <reaper/log_rotation.hpp>
#include <reaper/units.hpp>

#include <algorithm>
#include <cstdint>
#include <iomanip>
#include <random>
#include <sstream>
#include <thread>
#include <unistd.h>

namespace reaper {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string describe(const std::exception_ptr& error) {
    if (!error) return {};
    try {
        std::rethrow_exception(error);
    } catch (const std::exception& e) {
        return e.what();
    } catch (...) {
        return "unknown exception";
    }
}


void sleep_until_at_most(Clock::time_point deadline, milliseconds step) {
    auto now = Clock::now();
    if (now >= deadline) return;
    std::this_thread::sleep_for(std::min<Clock::duration>(step, deadline - now));
}

}  // namespace

const char* to_string(LogLevel level) {
    switch (level) {
        case LogLevel::Debug: return "debug";
        case LogLevel::Info: return "info";
        case LogLevel::Warning: return "warning";
        case LogLevel::Error: return "error";
    }
    return "?";
}

const char* to_string(TeardownResult::Container outcome) {
    switch (outcome) {
        case TeardownResult::Container::None: return "none";
        case TeardownResult::Container::Removed: return "removed";
        case TeardownResult::Container::Kept: return "kept";
        case TeardownResult::Container::Orphaned: return "orphaned";
    }
    return "?";
}

LogSink stderr_log_sink(LogLevel min_level) {
    return [min_level](const LogRecord& record) {
        if (record.level < min_level) return;
        std::string line = "reaper: ";
        line += to_string(record.level);
        line += ": session " + record.session_id;
        if (!record.container_id.empty()) line += " container " + record.container_id.substr(0, 12);
        line += ": " + record.message;
        if (record.error) line += ": " + describe(record.error);
        // A session id, a tool's own label or the engine's error text may hold anything.
        line = terminal_safe(line) + '\n';
        // One write per record: lines of concurrent sessions stay whole.
        [[maybe_unused]] auto written = ::write(2, line.data(), line.size());
    };
}

EngineFactory client_factory(ClientOptions options) {
    return [options = std::move(options)]() -> std::unique_ptr<Engine> {
        return std::make_unique<Client>(options);
    };
}

namespace {

// `words` random 32-bit words as hex, 8 digits each.
std::string random_hex(int words) {
    std::random_device device;
    std::ostringstream out;
    out << std::hex << std::setfill('0');
    for (int i = 0; i < words; ++i) out << std::setw(8) << std::uint32_t{device()};
    return out.str();
}

}  // namespace

std::string make_session_id() { return "s-" + random_hex(2); }

Session::Session(SessionOptions options)
    : options_(std::move(options)),
      session_id_(options_.session_id.empty() ? make_session_id() : options_.session_id) {
    try {
        control::validate_session_id(session_id_);
    } catch (const control::ProtocolViolation& e) {
        throw std::invalid_argument(std::string("bad session id: ") + e.what());
    }
    if (options_.label_key.empty()) throw std::invalid_argument("session label key is empty");
    if (!options_.engine_factory) {
        options_.engine_factory = client_factory(ClientOptions::from_environment());
    }
    if (options_.control_socket.empty()) options_.control_socket = control::socket_path_from_environment();
}

Session::~Session() { close(); }

Engine& Session::engine() {
    if (!engine_) throw std::logic_error("session " + session_id_ + " is not open");
    return *engine_;
}

bool Session::holds_lease() const {
    try {
        return lease_keeper_ && lease_keeper_->holds();
    } catch (...) {
        return false;
    }
}

void Session::log(LogLevel level, std::string message, std::exception_ptr error) const noexcept {
    try {
        emit(LogRecord{level, session_id_, container_id_, std::move(message), std::move(error)});
    } catch (...) {
        // Building the record ran out of memory: nothing to say it with.
    }
}

void Session::emit(LogRecord record) const noexcept {
    if (!options_.log) return;
    try {
        std::lock_guard lock(log_mutex_);
        options_.log(record);
    } catch (...) {
        // A failing sink must not turn teardown into a throwing operation.
    }
}

void Session::acquire_lease() {
    if (!options_.use_daemon) return;
    control::LeaseKeeperOptions keeper;
    // Runs on the keeper's thread: it reads only what never changes while the keeper runs
    // (not container_id_, which the opening thread writes).
    keeper.observer = [this](control::LeaseEvent event, const std::exception_ptr& error) {
        std::string message;
        switch (event) {
            case control::LeaseEvent::Lost:
                message = "reaperd closed the lease (stopped or restarting); taking it again";
                break;
            case control::LeaseEvent::Failing:
                message = "reaperd not reachable at " + options_.control_socket + "; will keep trying";
                break;
            case control::LeaseEvent::Taken:
                message = "holding a reaperd lease via " + options_.control_socket;
                break;
        }
        emit(LogRecord{LogLevel::Info, session_id_, {}, std::move(message), error});
    };
    lease_keeper_ = std::make_unique<control::LeaseKeeper>(
        control::ControlClient(options_.control_socket, options_.control_timeout), session_id_,
        std::move(keeper));
    if (auto failure = lease_keeper_->start()) {
        log(LogLevel::Info,
            "reaperd not reachable at " + options_.control_socket + "; working without a lease until it answers",
            failure);
    } else {
        log(LogLevel::Debug, "holding a reaperd lease via " + options_.control_socket);
    }
}

void Session::create(const ContainerSpec& spec) {
    open_created(spec, options_.readiness_probe, options_.ready_timeout);
}

void Session::create_from_template(const SessionTemplate& tmpl) {
    ContainerSpec spec = tmpl.spec;
    spec.name.clear();
    open_created(spec, tmpl.readiness_probe.empty() ? options_.readiness_probe : tmpl.readiness_probe,
                 tmpl.ready_timeout.value_or(options_.ready_timeout));
}

void Session::create_from_template(const TemplateLibrary& templates, const std::string& name) {
    create_from_template(templates.get(name));
}

void Session::open_created(const ContainerSpec& requested, const std::vector<std::string>& probe,
                           milliseconds ready_timeout) {
    if (requested.image.empty()) throw std::invalid_argument("container spec has no image");
    ContainerSpec spec = requested;
    auto [label, inserted] = spec.labels.emplace(options_.label_key, session_id_);
    if (!inserted && label->second != session_id_)
        throw std::invalid_argument("container spec already carries label " + options_.label_key + "=" +
                                    label->second + ", not this session's " + session_id_);
    if (spec.log_config.type.empty()) spec.log_config.type = options_.log_driver;
    open_marker_ = random_hex(4);  // 128 bits: no other open anywhere picks the same
    spec.labels[open_marker_label] = open_marker_;

    open_with([&] {
        add_log_rotation(spec);  // after the lease is taken: its reply tells reaperd's cap
        created_ = true;
        container_id_ = engine_->create(spec);
        log(LogLevel::Debug, "created container from image " + spec.image);
        engine_->start(container_id_);
        wait_ready(probe, ready_timeout);
    });
}

void Session::add_log_rotation(ContainerSpec& spec) const {
    if (!options_.rotate_logs || !driver_rotates(spec.log_config.type) || sets_rotation(spec.log_config.options))
        return;
    std::uint64_t cap = default_log_cap_bytes;
    if (options_.log_cap_bytes) {
        cap = *options_.log_cap_bytes;
    } else if (lease_keeper_) {
        if (const auto reply = lease_keeper_->lease_reply(); reply && reply->log_max_size) cap = *reply->log_max_size;
    }
    spec.log_config.options.merge(rotation_options(log_cap_for(spec.labels, cap)));
}

void Session::attach(const std::string& id_or_name) {
    if (id_or_name.empty()) throw std::invalid_argument("attach: empty container id or name");
    open_with([&] {
        delete_on_exit_ = options_.delete_on_exit.value_or(false);
        container_id_ = engine_->inspect(id_or_name).id;
        log(LogLevel::Debug, "attached to " + id_or_name);
        wait_ready(options_.readiness_probe, options_.ready_timeout);
    });
}

void Session::open_with(const std::function<void()>& steps) {
    if (phase_ != Phase::Fresh)
        throw std::logic_error("session " + session_id_ + " was already opened; a Session opens once");
    phase_ = Phase::Closed;  // until the client is acquired, a failure leaves nothing to clean
    teardown_ = TeardownResult{};
    engine_ = options_.engine_factory();
    if (!engine_) throw std::logic_error("engine factory returned no engine");
    phase_ = Phase::Open;
    teardown_.reset();
    delete_on_exit_ = options_.delete_on_exit.value_or(true);
    try {
        acquire_lease();
        steps();
    } catch (...) {
        auto original = std::current_exception();
        cleanup_failed_open();
        std::rethrow_exception(original);
    }
}

void Session::wait_ready(const std::vector<std::string>& probe, milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    const std::string short_id = container_id_.substr(0, 12);
    std::string waiting_for = "running";
    bool probe_passed = probe.empty();
    bool settling = false;
    Clock::time_point ready_since{};
    for (;;) {
        ContainerInfo info = engine_->inspect(container_id_);
        const auto& state = info.state;
        if (!state.running && !state.restarting) {
            std::ostringstream what;
            what << "container " << short_id << " is not running (status " << state.status << ", exit code "
                 << state.exit_code;
            if (!state.error.empty()) what << ", error: " << state.error;
            what << ")";
            throw NotReady(what.str());
        }
        if (info.has_healthcheck && state.health_status == "unhealthy")
            throw NotReady("container " + short_id + " is unhealthy");
        const bool healthy = !info.has_healthcheck || state.health_status == "healthy";
        if (!state.running) {
            waiting_for = "running";
        } else if (!healthy) {
            waiting_for = "healthy";
        } else if (!probe_passed) {
            waiting_for = "the readiness probe to exit 0";
            auto remaining = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
            auto probe_timeout = std::max(milliseconds{1}, std::min(options_.probe_timeout, remaining));
            try {
                int exit_code = engine_->exec(container_id_, probe, probe_timeout);
                probe_passed = exit_code == 0;
                if (!probe_passed) log(LogLevel::Debug, "readiness probe exited " + std::to_string(exit_code));
            } catch (const Conflict&) {
                // The container stopped under the probe: the next inspect tells how.
            } catch (const Timeout&) {
                log(LogLevel::Debug, "readiness probe did not finish within " +
                                         std::to_string(probe_timeout.count()) + " ms");
            }
        }
        const bool ready = state.running && healthy && probe_passed;
        if (!ready) {
            settling = false;
        } else {
            // A container that dies right after starting still shows "running" for a moment.
            if (!settling) ready_since = Clock::now();
            settling = true;
            if (Clock::now() - ready_since >= options_.ready_settle) return;
            waiting_for = "it to stay running for " + std::to_string(options_.ready_settle.count()) + " ms";
        }
        if (Clock::now() >= deadline)
            throw NotReady("container " + short_id + " not ready within " + std::to_string(timeout.count()) +
                           " ms (waiting for " + waiting_for + ")");
        auto step = options_.ready_poll_interval;
        if (settling)
            step = std::min(step, std::chrono::duration_cast<milliseconds>(ready_since + options_.ready_settle -
                                                                           Clock::now()) + milliseconds{1});
        sleep_until_at_most(deadline, step);
    }
}

void Session::cleanup_failed_open() noexcept {
    TeardownResult result;
    result.container_id = container_id_;
    if (created_) {
        if (!container_id_.empty()) {
            // A half-created sandbox must not outlive the failed open: force straight away.
            remove_container(result, true);
        } else {
            remove_after_failed_create(result);
        }
    }
    release_lease_and_client();
    teardown_ = result;
}

// The create call failed, yet the engine may have made the container (a timeout or a broken
// connection after the request went out). Only this open's marker says which one is ours:
// other Sessions may share the session id and its label, and their containers must stay.
void Session::remove_after_failed_create(TeardownResult& result) noexcept {
    std::vector<ContainerSummary> found;
    try {
        ListOptions list;
        list.all = true;
        // The engine ANDs label filters: this session's label and this open's marker.
        list.filters["label"] = {options_.label_key + "=" + session_id_,
                                 std::string(open_marker_label) + "=" + open_marker_};
        found = engine_->list_containers(list);
    } catch (...) {
        last_cleanup_error_ = std::current_exception();
        log(LogLevel::Warning, "after a failed create, could not look for the container this open may have made",
            last_cleanup_error_);
        return;
    }
    for (const auto& summary : found) {
        container_id_ = summary.id;
        log(LogLevel::Info, "the failed create made this container after all; removing it");
        remove_container(result, true);
    }
    container_id_.clear();
}

void Session::remove_container(TeardownResult& result, bool force_first) noexcept {
    const auto deadline = Clock::now() + options_.teardown_budget;
    const std::string id = container_id_;
    result.container_id = id;
    std::exception_ptr last_error;
    auto gone = [&] {
        result.container = TeardownResult::Container::Removed;
        log(LogLevel::Debug, result.forced ? "container force-removed" : "container removed");
    };
    if (!force_first) {
        try {
            engine_->remove(id, RemoveOptions{});
            return gone();
        } catch (const NotFound&) {
            return gone();
        } catch (...) {
            last_error = std::current_exception();
            log(LogLevel::Info, "delete refused; killing and force-removing", last_error);
        }
    }
    result.forced = true;
    milliseconds backoff{50};
    for (;;) {
        try {
            engine_->kill(id);
        } catch (const NotFound&) {
            return gone();
        } catch (...) {
            // Not running any more, or the kill failed: the force-remove below decides.
        }
        try {
            engine_->remove(id, RemoveOptions{.force = true});
            return gone();
        } catch (const NotFound&) {
            return gone();
        } catch (...) {
            last_error = std::current_exception();
        }
        // RemovalInProgress (the engine's own removal under way) ends with the container
        // gone, as may any other failure: look again.
        try {
            engine_->inspect(id);
        } catch (const NotFound&) {
            return gone();
        } catch (...) {
        }
        if (Clock::now() + backoff >= deadline) break;
        std::this_thread::sleep_for(backoff);
        backoff = std::min(backoff * 2, milliseconds{500});
    }
    last_cleanup_error_ = last_error;
    result.container = TeardownResult::Container::Orphaned;
    report_orphan(result);
    log(LogLevel::Warning,
        std::string("container left behind after ") + std::to_string(options_.teardown_budget.count()) +
            " ms of removal attempts; " +
            (result.orphan_reported ? "reported to reaperd as an orphan" : "reaperd was not told"),
        last_error);
}

void Session::report_orphan(TeardownResult& result) noexcept {
    if (!options_.use_daemon) return;
    try {
        control::ControlClient(options_.control_socket, options_.control_timeout)
            .report_orphan(result.container_id, session_id_);
        result.orphan_reported = true;
    } catch (...) {
        log(LogLevel::Info, "could not report the orphan to reaperd at " + options_.control_socket,
            std::current_exception());
    }
}

void Session::release_lease_and_client() noexcept {
    lease_keeper_.reset();  // stops its thread and closes the lease
    if (engine_) {
        engine_->close();
        engine_.reset();
    }
    container_id_.clear();
    phase_ = Phase::Closed;
}

TeardownResult Session::close() noexcept {
    if (teardown_) return *teardown_;
    TeardownResult result;
    if (phase_ == Phase::Open && engine_) {
        result.container_id = container_id_;
        if (!container_id_.empty()) {
            if (!delete_on_exit_) {
                result.container = TeardownResult::Container::Kept;
                log(LogLevel::Debug, "delete-on-exit is off; container kept");
            } else {
                remove_container(result, false);
            }
        }
    }
    release_lease_and_client();
    teardown_ = result;
    return result;
}

}  // namespace reaper
