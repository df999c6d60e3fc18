// Issue 10, "nothing alive goes", against a real engine with reaperd as a child process:
// an orphan reported by name is pinned to its full id (a new container that takes the name,
// of a leased session, is never touched by the retries); reports that name another session's
// container, or none, are refused; and the log capper's remove and stop follow a SIGHUP that
// drops the label key or turns dry run on.
#include "daemon_fixture.hpp"

#include <Poco/Net/HTTPClientSession.h>
#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/HTTPResponse.h>
#include <Poco/Net/SocketAddress.h>
#include <Poco/Net/StreamSocket.h>

#include <array>
#include <cstdio>
#include <set>

using namespace reaperd::itest;

namespace {

// A container of the test's own, created with a name of its choosing.
std::string create(const std::string& name, const reaper::Labels& labels,
                   std::vector<std::string> cmd = {"sleep", "600"}) {
    reaper::ContainerSpec spec;
    spec.name = name;
    spec.image = reaper::test::PrivateEngine::image;
    spec.cmd = std::move(cmd);
    spec.labels = labels;
    std::string id = engine_client().create(spec);
    engine_client().start(id);
    return id;
}

bool running(const std::string& id) {
    try {
        return engine_client().inspect(id).state.running;
    } catch (const reaper::NotFound&) {
        return false;
    }
}

struct Ran {
    int status = -1;
    std::string output;  // stdout and stderr
};

Ran reaperctl(const Reaperd& d, const std::string& args) {
    std::string command = std::string(REAPERCTL_PATH) + " --socket " + d.socket + " " + args + " 2>&1";
    Ran ran;
    FILE* pipe = ::popen(command.c_str(), "r");
    BOOST_REQUIRE(pipe != nullptr);
    std::array<char, 4096> buffer{};
    while (std::fgets(buffer.data(), buffer.size(), pipe)) ran.output += buffer.data();
    int status = ::pclose(pipe);
    ran.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return ran;
}

// POST /containers/{id}/rename (the library's client has no rename): frees a name while
// the container that had it stays.
void rename_container(const std::string& id, const std::string& name) {
    Poco::Net::StreamSocket socket;
    socket.connect(Poco::Net::SocketAddress(reaper::test::engine().socket_path()));
    Poco::Net::HTTPClientSession session(socket);
    Poco::Net::HTTPRequest request(Poco::Net::HTTPRequest::HTTP_POST,
                                   "/containers/" + id + "/rename?name=" + name,
                                   Poco::Net::HTTPMessage::HTTP_1_1);
    request.setHost("engine");
    request.setContentLength(0);
    session.sendRequest(request);
    Poco::Net::HTTPResponse response;
    session.receiveResponse(response);
    BOOST_REQUIRE_MESSAGE(response.getStatus() == Poco::Net::HTTPResponse::HTTP_NO_CONTENT,
                          "rename " << id << " to " << name << ": HTTP " << response.getStatus());
}

std::vector<std::string> pending_containers(const Reaperd& d) {
    std::vector<std::string> ids;
    auto pending = d.status()->getArray("pending");
    for (std::size_t i = 0; i < pending->size(); ++i)
        ids.push_back(pending->getObject(static_cast<unsigned>(i))->getValue<std::string>("container"));
    return ids;
}

// ~2.9 MB of json log once /tmp/go exists (15,000 lines from `yes`), then quiet: over a
// 1 MiB cap at a moment the test chooses, without filling the disk.
std::vector<std::string> writer_on_go() {
    return {"sh", "-c",
            "while ! test -e /tmp/go; do sleep 0.1; done; "
            "yes 0123456789012345678901234567890123456789012345678901234567890123456789"
            "012345678901234567890123456789012345678901234567890123456789 | head -n 15000; "
            "exec sleep 600"};
}

// Waits until reaperd has handled every event of `id` so far (its start included): the
// watcher handles events in order, so once a container created after it is tracked, so is
// everything before. Without this, a reload could overtake the start event, and reaperd would
// feed the capper the container as the new labels see it (not owned), so the capper would
// never ask the door at all.
void settle(Reaperd& d, Cleanup& cleanup, const std::string& id) {
    const std::string marker_session = "marker-" + id.substr(0, 12);
    reaper::ContainerSpec spec;
    spec.name = reaper::test::unique_name("marker");
    spec.image = reaper::test::PrivateEngine::image;
    spec.cmd = {"sleep", "600"};
    spec.labels = session_label(marker_session);
    cleanup.ids.push_back(engine_client().create(spec));
    BOOST_REQUIRE(eventually([&] { return d.containers_of(marker_session) == 1; }));
}

void reload(Reaperd& d, const std::string& sessions_yaml, const std::string& reaper_yaml) {
    std::size_t before = d.log_count("configuration reloaded");
    d.write_config(sessions_yaml, reaper_yaml);
    ::kill(d.pid(), SIGHUP);
    BOOST_REQUIRE(eventually([&] { return d.log_count("configuration reloaded") > before; }));
}

}  // namespace

// (a) `reaperctl orphan web --session A`, the engine answers 500 to each delete; `web` is
// renamed out of the way and the name taken by a container of session B, which holds a
// lease. The retries keep acting on the first container's full id only; once its delete can
// succeed it goes, and the new `web` stays.
BOOST_AUTO_TEST_CASE(an_orphan_reported_by_name_is_retried_by_its_full_id_never_by_the_name) {
    Cleanup cleanup;
    Reaperd d("", "  retry_initial: 200ms\n  retry_max: 1s\n");
    d.start();
    const std::string name = reaper::test::unique_name("web");
    const std::string old_id = create(name, session_label("reuse-A"));
    cleanup.ids.push_back(old_id);
    reaper::test::RemovalPin pin(old_id);

    Ran report = reaperctl(d, "orphan " + name + " --session reuse-A");
    BOOST_TEST(report.status == 0, report.output);
    BOOST_TEST((pending_containers(d) == std::vector<std::string>{old_id}));  // pinned at once
    BOOST_REQUIRE(eventually([&] { return d.log_count("reap failed; will retry") >= 1; }, 30s));

    rename_container(old_id, name + "-old");
    auto lease = d.control().lease("reuse-B");
    const std::string new_id = create(name, session_label("reuse-B"));
    cleanup.ids.push_back(new_id);
    // Retries go on (retry_max 1s): each must find the pinned container, never the name.
    std::size_t failures = d.log_count("reap failed; will retry");
    BOOST_TEST(eventually([&] { return d.log_count("reap failed; will retry") >= failures + 2; }, 30s));
    BOOST_TEST(running(new_id));
    BOOST_TEST((pending_containers(d) == std::vector<std::string>{old_id}));

    pin.release();  // the delete can succeed now
    BOOST_TEST(eventually([&] { return !exists(old_id); }, 30s));
    BOOST_TEST(eventually([&] { return d.pending_reaps() == 0u; }, 30s));
    std::this_thread::sleep_for(1500ms);
    BOOST_TEST(running(new_id));
    BOOST_TEST(d.log_count("CONTAINER_ID=" + old_id + " ACTION=remove") >= 1u);
    BOOST_TEST(d.log_count("CONTAINER_ID=" + new_id + " ACTION=remove") == 0u);
    BOOST_TEST(d.session_state("reuse-B") == "leased");
}

// (b) Reports that do not name one container reaperd owns, of the session given, get an
// error reply naming the problem; nothing is queued, nothing removed.
BOOST_AUTO_TEST_CASE(orphan_reports_naming_another_session_or_no_owned_container_are_refused) {
    Cleanup cleanup;
    Reaperd d;
    d.start();
    const std::string name = reaper::test::unique_name("web");
    const std::string web = create(name, session_label("refuse-A"));
    const std::string plain = create(reaper::test::unique_name("plain"), {{"app", "db"}});
    cleanup.ids = {web, plain};

    Ran wrong = reaperctl(d, "orphan " + name + " --session refuse-B");
    BOOST_TEST(wrong.status == 1, wrong.output);
    BOOST_TEST(wrong.output.find("belongs to session refuse-A, not refuse-B") != std::string::npos, wrong.output);
    BOOST_TEST(wrong.output.find(web) != std::string::npos, wrong.output);

    Ran none = reaperctl(d, "orphan " + name + "-nobody");
    BOOST_TEST(none.status == 1, none.output);
    BOOST_TEST(none.output.find("no container matches \"" + name + "-nobody\"") != std::string::npos, none.output);

    Ran unowned = reaperctl(d, "orphan " + plain.substr(0, 12));
    BOOST_TEST(unowned.status == 1, unowned.output);
    BOOST_TEST(unowned.output.find("carries no session label") != std::string::npos, unowned.output);

    // An id prefix that several containers share: the engine answers it with an error.
    std::string prefix = web[0] == plain[0] ? web.substr(0, 1) : "";
    std::set<char> first_digits{web[0], plain[0]};
    while (prefix.empty()) {  // at most 15 more
        std::string id = create(reaper::test::unique_name("prefix"), session_label("refuse-A"));
        cleanup.ids.push_back(id);
        if (!first_digits.insert(id[0]).second) prefix = id.substr(0, 1);
    }
    Ran ambiguous = reaperctl(d, "orphan " + prefix);
    BOOST_TEST(ambiguous.status == 1, ambiguous.output);
    BOOST_TEST(ambiguous.output.find("cannot resolve \"" + prefix + "\" to one container") != std::string::npos,
               ambiguous.output);

    std::this_thread::sleep_for(1s);
    BOOST_TEST(d.pending_reaps() == 0u);
    for (const auto& id : cleanup.ids) BOOST_TEST(running(id), id);
    BOOST_TEST(d.log_count("container reaped") == 0u);
}

// (c) The capper's remove after a SIGHUP that drops reaperd.session from sessions.labels:
// the container is not owned any more, and it stays, running, its log over its cap.
BOOST_AUTO_TEST_CASE(the_log_capper_follows_a_reload_that_drops_the_label_key) {
    Cleanup cleanup;
    const std::string logs = "logs:\n  action: remove\n";
    Reaperd d("", logs);
    d.start();
    const std::string id = create(reaper::test::unique_name("capped"),
                                  {{"reaperd.session", "capped-1"}, {"reaperd.log-max-size", "1MiB"}},
                                  writer_on_go());
    cleanup.ids.push_back(id);
    settle(d, cleanup, id);
    reload(d, "  labels: [org.testcontainers.sessionId]\n", logs);
    BOOST_TEST(engine_client().exec(id, {"touch", "/tmp/go"}, 10s) == 0);
    BOOST_TEST(eventually([&] { return d.log_count("REFUSAL=refused_not_owned") >= 1; }, 30s), d.log_text());
    std::this_thread::sleep_for(1500ms);
    BOOST_TEST(running(id));
    BOOST_TEST(d.log_count("not going to remove container") >= 1u);
    BOOST_TEST(d.log_count("ACTION=remove") == 0u);
}

// (c') The capper's stop after a SIGHUP that turns reaper.dry_run on: it says what it would
// do, and the container keeps running.
BOOST_AUTO_TEST_CASE(the_log_capper_follows_a_reload_to_dry_run) {
    Cleanup cleanup;
    const std::string logs = "logs:\n  action: stop\n";
    Reaperd d("", logs);
    d.start();
    const std::string id = create(reaper::test::unique_name("capped"),
                                  {{"reaperd.session", "capped-2"}, {"reaperd.log-max-size", "1MiB"}},
                                  writer_on_go());
    cleanup.ids.push_back(id);
    settle(d, cleanup, id);
    reload(d, "", "  dry_run: true\n" + logs);
    BOOST_TEST(engine_client().exec(id, {"touch", "/tmp/go"}, 10s) == 0);
    BOOST_TEST(eventually([&] { return d.log_count("dry run: would stop container") >= 1; }, 30s), d.log_text());
    std::this_thread::sleep_for(1500ms);
    BOOST_TEST(running(id));
    BOOST_TEST(d.log_count("ACTION=stop") == 0u);
}
