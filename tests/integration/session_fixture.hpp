// Shared by the Session real-engine tests: a real Client that records removes and close()
// calls (and can be told to fail removes), and a fixture with an observer client.
#pragma once

#include <reaper/session.hpp>

#include "engine.hpp"

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace session_itest {

using namespace reaper;
using namespace std::chrono_literals;


inline const std::string label_key = "session-engine-test.session";

// A real Client that counts close() calls and records each remove() and how it ended.
class RecordingEngine final : public Engine {
public:
    struct Record {
        std::mutex mutex;
        std::vector<std::string> removes;  // "force=0 conflict", "force=1 ok", ...
        std::atomic<int> close_calls{0};
        std::atomic<std::size_t> connections_after_close{~std::size_t{0}};
        std::atomic<bool> fail_removes{false};  // fault injection: every remove answers 500
    };
    RecordingEngine(std::shared_ptr<Record> record)
        : record_(std::move(record)), client_(test::engine().client_options()) {}

    std::vector<ContainerSummary> list_containers(const ListOptions& o) override { return client_.list_containers(o); }
    ContainerInfo inspect(const std::string& id) override { return client_.inspect(id); }
    std::string create(const ContainerSpec& spec) override { return client_.create(spec); }
    void start(const std::string& id) override { client_.start(id); }
    void kill(const std::string& id, const std::string& signal) override { client_.kill(id, signal); }
    void remove(const std::string& id, const RemoveOptions& options) override {
        std::string call = options.force ? "force=1 " : "force=0 ";
        if (record_->fail_removes) {
            note(call + "injected");
            throw ServerError(500, "injected", "remove: 500 injected");
        }
        try {
            client_.remove(id, options);
            note(call + "ok");
        } catch (const EngineError& e) {
            note(call + to_string(e.kind()));
            throw;
        }
    }
    int exec(const std::string& id, const std::vector<std::string>& cmd, std::chrono::milliseconds timeout) override {
        return client_.exec(id, cmd, timeout);
    }
    void close() noexcept override {
        ++record_->close_calls;
        client_.close();
        record_->connections_after_close = client_.open_connections();
    }

private:
    void note(const std::string& call) {
        std::lock_guard lock(record_->mutex);
        record_->removes.push_back(call);
    }
    std::shared_ptr<Record> record_;
    Client client_;
};

struct Fixture {
    std::shared_ptr<RecordingEngine::Record> record = std::make_shared<RecordingEngine::Record>();
    Client observer{test::engine().client_options()};

    ~Fixture() { observer.close(); }

    SessionOptions options() {
        SessionOptions o;
        o.engine_factory = [record = record]() { return std::make_unique<RecordingEngine>(record); };
        o.label_key = label_key;
        o.use_daemon = false;
        o.ready_timeout = 30s;
        // Generous on a loaded machine: a container exiting at once must be seen exited.
        o.ready_settle = 1s;
        return o;
    }
    static ContainerSpec sleeper() {
        ContainerSpec spec;
        spec.image = test::PrivateEngine::image;
        spec.cmd = {"sleep", "3600"};
        return spec;
    }
    std::vector<ContainerSummary> containers_of(const std::string& session_id) {
        ListOptions list;
        list.all = true;
        list.filters["label"] = {label_key + "=" + session_id};
        return observer.list_containers(list);
    }
    bool exists(const std::string& id) {
        try {
            observer.inspect(id);
            return true;
        } catch (const NotFound&) {
            return false;
        }
    }
};

}  // namespace session_itest
