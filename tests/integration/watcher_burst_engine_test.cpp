// A burst of containers created (and started) under a session that has already ended, as
// scripts/load.sh makes them: each must go soon after its create, while a live session's
// containers and unlabelled ones in the same burst stay. The watcher registers a container
// from its create event's labels, without waiting for the inspect the engine answers only
// once the start is done (issue 11). Engine-neutral: Docker's and Podman's events carry the
// labels alike.
//
// Measured on the engine's own clock, from its events. What is asserted is the watcher's
// part: for a started container, from the moment it could be removed (its start event: the
// engine lets nothing act on a container mid-start) to reaperd's removal reaching it (its
// kill); for one only created, from its create to reaperd queueing its reap (seen in
// reaperd's status, polled, or at the latest its destroy). Create to destroy is printed, not
// held to a bound: on this 2-core test box at load ~13 the engine itself took up to 12 s from
// a create to its start and up to 5 s from a kill to the destroy, and the reaper's pace
// (daemon/reaper.hpp) halves its in-flight limit on such answers, so a created-only one can
// wait its turn behind them (CI: created-only create to destroy p99 6.8 s while the started
// ones were reached within 1.9 s; idle here: 14 of 40 attempts answered in 2-5 s, limit 2).
#include "daemon_fixture.hpp"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace reaperd::itest;

namespace {

// When reaperd first listed each container among its pending reaps (ns since the epoch, the
// clock the engine's events use), from its status polled every 20 ms from a thread of its own.
class QueueLog {
public:
    explicit QueueLog(const Reaperd& daemon)
        : thread_([this, &daemon](std::stop_token stop) {
              reaper::control::StatusQuery query;
              query.pending = true;
              query.limit = 1'000;
              while (!stop.stop_requested()) {
                  try {
                      Poco::JSON::Parser parser;
                      auto status = parser.parse(daemon.control().status_json(query))
                                        .extract<Poco::JSON::Object::Ptr>();
                      const std::int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                   std::chrono::system_clock::now().time_since_epoch())
                                                   .count();
                      auto pending = status->getArray("pending");
                      std::lock_guard lock(mutex_);
                      for (std::size_t i = 0; i < pending->size(); ++i)
                          first_seen_.emplace(
                              pending->getObject(static_cast<unsigned>(i))->getValue<std::string>("container"),
                              now);
                  } catch (const std::exception&) {
                      // A status that failed is a look missed; the destroy bounds the wait.
                  }
                  std::this_thread::sleep_for(20ms);
              }
          }) {}
    std::optional<std::int64_t> first_seen(const std::string& id) {
        std::lock_guard lock(mutex_);
        auto it = first_seen_.find(id);
        if (it == first_seen_.end()) return std::nullopt;
        return it->second;
    }

private:
    std::mutex mutex_;
    std::map<std::string, std::int64_t> first_seen_;
    std::jthread thread_;  // last: stopped and joined before the map goes
};

// Records every container's create and destroy time (ns, the engine's clock) from a stream
// of its own, from before the burst.
class EventLog {
public:
    EventLog() : client_(reaper::test::engine().client_options()) {
        reaper::EventsOptions options;
        options.filters = {{"type", {"container"}},
                           {"event", {"create", "start", "kill", "destroy", "remove"}}};
        stream_ = client_.events(options);
        thread_ = std::thread([this] {
            try {
                while (auto event = stream_->next()) {
                    std::lock_guard lock(mutex_);
                    // The first of each (Podman says "remove" where Docker says "destroy").
                    const std::string action = event->action == "remove" ? "destroy" : event->action;
                    times_[event->id].emplace(action, event->time_nano);
                }
            } catch (const std::exception&) {
                // The engine went away: the waits below fail and say so.
            }
        });
    }
    ~EventLog() {
        stream_->cancel();
        thread_.join();
    }
    struct Spans {
        std::vector<double> lifetime_ms;  // create to destroy
        std::vector<double> reaction_ms;  // removable (create, or start if any) to kill or destroy
        std::vector<double> queued_ms;    // create to queued (first listed, or the destroy)
    };
    // Nullopt while one of `ids` has no create or destroy event yet.
    std::optional<Spans> spans(const std::vector<std::string>& ids, QueueLog& queue) {
        std::lock_guard lock(mutex_);
        Spans out;
        for (const auto& id : ids) {
            auto times = times_.find(id);
            if (times == times_.end()) return std::nullopt;
            const auto& t = times->second;
            if (!t.count("create") || !t.count("destroy")) return std::nullopt;
            auto removable = t.at("create");
            if (auto start = t.find("start"); start != t.end()) removable = std::max(removable, start->second);
            auto reached = t.at("destroy");
            if (auto kill = t.find("kill"); kill != t.end()) reached = std::min(reached, kill->second);
            out.lifetime_ms.push_back(static_cast<double>(t.at("destroy") - t.at("create")) / 1e6);
            out.reaction_ms.push_back(static_cast<double>(std::max<std::int64_t>(reached - removable, 0)) / 1e6);
            const auto queued = std::min(queue.first_seen(id).value_or(t.at("destroy")), t.at("destroy"));
            out.queued_ms.push_back(static_cast<double>(std::max<std::int64_t>(queued - t.at("create"), 0)) / 1e6);
        }
        return out;
    }

private:
    reaper::Client client_;
    std::unique_ptr<reaper::EventStream> stream_;
    std::mutex mutex_;
    std::map<std::string, std::map<std::string, std::int64_t>> times_;  // by id, by action
    std::thread thread_;
};

// The lines of reaperd's metrics on its removal pace: its in-flight limit and how long the
// engine took to answer each attempt.
std::string removal_pace(const std::string& metrics) {
    std::istringstream lines(metrics);
    std::string out;
    for (std::string line; std::getline(lines, line);)
        if (line.rfind("reaperd_removal_limit ", 0) == 0 || line.rfind("reaperd_removal_attempt_seconds", 0) == 0)
            out += line + '\n';
    return out;
}

double percentile(std::vector<double> values, double p) {
    std::sort(values.begin(), values.end());
    auto index = static_cast<std::size_t>(p * static_cast<double>(values.size() - 1) + 0.5);
    return values[std::min(index, values.size() - 1)];
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_burst_under_an_ended_session_is_reaped_soon_after_each_create) {
    constexpr int doomed_count = 50;
    constexpr int threads = 4;
    Reaperd d("  lease_grace: 60s\n");
    d.start();
    auto live = d.control().lease("burst-live");
    auto ended = d.control().lease("burst-ended");
    BOOST_REQUIRE(eventually([&] { return d.session_state("burst-ended") == "leased"; }));
    d.control().end("burst-ended");
    BOOST_REQUIRE(eventually([&] { return d.session_state("burst-ended") == "ended"; }));
    EventLog events;
    QueueLog queue(d);

    std::mutex mutex;
    std::vector<std::string> doomed, created_only, survivors, survivor_start_errors;
    std::atomic<int> next{0};
    auto burst = [&] {
        reaper::Client client(reaper::test::engine().client_options());
        for (int i; (i = next++) < doomed_count;) {
            // Every fifth container of the burst belongs to the live session, every tenth
            // (of the others) to nobody: both must stay.
            reaper::Labels labels = session_label("burst-ended");
            bool stays = i % 5 == 0;
            if (stays) labels = i % 10 == 0 ? reaper::Labels{} : session_label("burst-live");
            reaper::ContainerSpec spec;
            spec.name = reaper::test::unique_name("reaperd-burst");
            spec.image = reaper::test::PrivateEngine::image;
            spec.cmd = {"sleep", "600"};
            spec.labels = labels;
            std::string id = client.create(spec);
            // Every other doomed one is only created: nothing but reaperd holds it up, and
            // a watcher that waited on the starts around it would be seen at once.
            const bool start = stays || i % 2 == 0;
            std::string start_error;
            try {
                if (start) client.start(id);
            } catch (const reaper::EngineError& e) {
                // Reaped before its start reached the engine (404, or 409 "marked for
                // removal"): what a client racing an ended session sees.
                start_error = e.what();
            }
            std::lock_guard lock(mutex);
            (stays ? survivors : start ? doomed : created_only).push_back(id);
            if (stays && !start_error.empty()) survivor_start_errors.push_back(start_error);
        }
    };
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) workers.emplace_back(burst);
    for (auto& w : workers) w.join();
    BOOST_TEST(survivor_start_errors.empty());

    std::optional<EventLog::Spans> started, created;
    BOOST_REQUIRE_MESSAGE(eventually([&] {
                              started = events.spans(doomed, queue);
                              created = events.spans(created_only, queue);
                              return started && created;
                          }),
                          "not every container of the ended session was reaped; reaperd's log:\n"
                              << d.log_text());
    auto report = [](const char* what, const std::vector<double>& ms) {
        BOOST_TEST_MESSAGE(what << ": p50 " << percentile(ms, 0.50) << " ms, p99 " << percentile(ms, 0.99)
                                << " ms, max " << *std::max_element(ms.begin(), ms.end()) << " ms");
    };
    report("started, removable to reaped", started->reaction_ms);
    report("started, create to destroy", started->lifetime_ms);
    report("created only, create to queued", created->queued_ms);
    report("created only, create to destroy", created->lifetime_ms);
    BOOST_TEST_MESSAGE("the reaper's pace:\n" << removal_pace(d.control().metrics_text()));
    // load.sh holds reaperd to 1.5 s at 5x; these bounds only catch a watcher that waits on
    // each start again (p99 10 s), without failing on a loaded test machine.
    BOOST_TEST(percentile(started->reaction_ms, 0.99) <= 5000.0);
    BOOST_TEST(percentile(created->queued_ms, 0.99) <= 5000.0);

    // The registry follows the engine: the live session's containers are all tracked.
    const auto live_count = static_cast<int>(std::count_if(survivors.begin(), survivors.end(), [&](const std::string& id) {
        return engine_client().inspect(id).labels.count("reaperd.session") == 1;
    }));
    BOOST_TEST(eventually([&] { return d.containers_of("burst-live") == live_count; }, 10s));
    std::this_thread::sleep_for(2s);  // lease_grace is 60s: nothing of theirs may go meanwhile
    for (const auto& id : survivors) {
        BOOST_TEST(exists(id), id);
        BOOST_TEST(engine_client().inspect(id).state.running, id);
    }
    BOOST_TEST(d.session_state("burst-live") == "leased");
    BOOST_TEST(d.pending_reaps() == 0u);
    for (const auto& id : survivors) {
        reaper::RemoveOptions force;
        force.force = true;
        engine_client().remove(id, force);
    }
}
