// A request that may have reached the engine is sent once (issue 10, point 5), against the
// real engine: a FaultFront (tests/harness/fault_front.hpp) forwards the create, lets the
// engine make the container, and drops the connection instead of its answer. The client
// then knows only that its connection broke on a kept-alive connection, the case in which it
// used to send any request again: a create sent twice is two containers, one of them
// untracked. The scripted version is client_test's
// a_request_that_may_have_reached_the_engine_is_sent_once. Docker only (not in the Podman
// selection): Podman 4.3's create events carry no labels, and the Session case counts them.
#include "engine.hpp"
#include "fault_front.hpp"

#include <reaper/client.hpp>
#include <reaper/session.hpp>

#include <boost/test/unit_test.hpp>

#include <Poco/JSON/Object.h>
#include <Poco/JSON/Parser.h>

#include <chrono>
#include <ctime>

using namespace reaper;
using namespace std::chrono_literals;
using reaper::test::engine;
using reaper::test::FaultFront;
using reaper::test::unique_name;

namespace {

ContainerSpec sleeper(const std::string& label_key, const std::string& label_value) {
    ContainerSpec spec;
    spec.image = test::PrivateEngine::image;
    spec.cmd = {"sleep", "300"};
    spec.labels = {{label_key, label_value}};
    return spec;
}

// The containers carrying `label` (key=value), asked of the engine itself, not the front.
std::vector<ContainerSummary> containers_labelled(Client& engine_client, const std::string& label) {
    ListOptions list;
    list.all = true;
    list.filters["label"] = {label};
    return engine_client.list_containers(list);
}

// The engine's own record of the containers it made with `label` since `since` (unix
// seconds): its create events, which outlive the containers.
int creates_since(Client& engine_client, std::int64_t since, const std::string& label) {
    EventsOptions options;
    options.filters = {{"type", {"container"}}, {"event", {"create"}}, {"label", {label}}};
    options.since = since;
    options.until = std::time(nullptr) + 1;
    auto stream = engine_client.events(options);
    int n = 0;
    while (stream->next()) ++n;
    return n;
}

std::string id_in(const std::string& create_answer) {
    Poco::JSON::Parser parser;
    return parser.parse(create_answer).extract<Poco::JSON::Object::Ptr>()->getValue<std::string>("Id");
}

}  // namespace

// The scenario: a create on a reused keep-alive connection whose answer is lost after
// the engine made the container. The call fails; the engine holds exactly one container.
BOOST_AUTO_TEST_CASE(a_create_whose_answer_was_lost_fails_and_makes_one_container) {
    FaultFront front(engine().socket_path());
    Client direct(engine().client_options());
    const std::string label_key = "request-once.test";
    const std::string label_value = unique_name("lost-create");

    Client client(front.client_options());
    client.list_containers({});  // a GET, leaving a kept-alive connection for the create
    const int connections_before = front.connections_accepted();
    front.drop_answer_of_next("POST", "/containers/create");
    bool failed = false;
    try {
        client.create(sleeper(label_key, label_value));
    } catch (const EngineError& e) {
        BOOST_TEST_MESSAGE("create failed as it must: " << e.what());
        failed = true;
    }
    BOOST_TEST(failed, "the create succeeded although its answer was lost");

    auto dropped = front.dropped();
    BOOST_REQUIRE(dropped);
    BOOST_TEST_MESSAGE("dropped the engine's answer to " << dropped->request << ": " << dropped->status);
    BOOST_TEST(dropped->status == 201);  // the engine did make it
    BOOST_TEST(dropped->connections_accepted == connections_before);  // on the reused connection
    const auto found = containers_labelled(direct, label_key + "=" + label_value);
    BOOST_TEST(found.size() == 1u);
    for (const auto& c : found) {
        BOOST_TEST(c.id == id_in(dropped->body));
        direct.remove(c.id, RemoveOptions{.force = true});
    }
    client.ping();  // the client is still usable: a fresh connection
}

// A GET is safe to send again: one whose answer is lost on a reused connection goes again on
// a new one, and the call succeeds.
BOOST_AUTO_TEST_CASE(a_get_whose_answer_was_lost_is_sent_again_and_succeeds) {
    FaultFront front(engine().socket_path());
    Client client(front.client_options());
    client.ping();
    const int connections_before = front.connections_accepted();
    front.drop_answer_of_next("GET", "/containers/json");
    BOOST_CHECK_NO_THROW(client.list_containers({}));
    auto dropped = front.dropped();
    BOOST_REQUIRE(dropped);
    BOOST_TEST(dropped->connections_accepted == connections_before);
    BOOST_TEST(front.connections_accepted() == connections_before + 1);
}

// The library Session whose create answer is lost: its open fails with the client's error, the
// engine made exactly one container for it, and the failed open removes that one (found by
// its open marker) and not the running container of a sibling Session sharing the session id.
BOOST_AUTO_TEST_CASE(a_session_whose_create_answer_was_lost_removes_only_its_own_container) {
    FaultFront front(engine().socket_path());
    Client direct(engine().client_options());
    const std::int64_t since = std::time(nullptr) - 1;

    SessionOptions o;
    o.session_id = unique_name("lost-open");
    o.use_daemon = false;
    o.ready_settle = 0ms;
    o.engine_factory = client_factory(engine().client_options());
    Session sibling(o);
    sibling.create(sleeper("request-once.test", "sibling"));

    o.engine_factory = client_factory(front.client_options());
    Session session(o);
    // The open negotiates first (GET /version), so its create goes on a reused connection.
    front.drop_answer_of_next("POST", "/containers/create");
    bool failed = false;
    try {
        session.create(sleeper("request-once.test", "lost"));
    } catch (const EngineError& e) {
        BOOST_TEST_MESSAGE("open failed as it must: " << e.what());
        failed = true;
    }
    BOOST_TEST(failed, "the open succeeded although its create's answer was lost");

    auto dropped = front.dropped();
    BOOST_REQUIRE(dropped);
    BOOST_TEST(dropped->status == 201);
    BOOST_TEST(dropped->connections_accepted == 1);  // one connection: the create reused it
    const std::string lost_id = id_in(dropped->body);
    const std::string session_label = o.label_key + "=" + o.session_id;
    // One container made by the failed open, besides the sibling's.
    BOOST_TEST(creates_since(direct, since, session_label) == 2);
    // The failed open removed its own, found by its marker...
    BOOST_CHECK_THROW(direct.inspect(lost_id), NotFound);
    BOOST_REQUIRE(session.teardown_result());
    BOOST_TEST(to_string(session.teardown_result()->container) == "removed");
    BOOST_TEST(session.teardown_result()->container_id == lost_id);
    // ...and only that one: the sibling's runs on.
    const auto left = containers_labelled(direct, session_label);
    BOOST_REQUIRE(left.size() == 1u);
    BOOST_TEST(left[0].id == sibling.container_id());
    BOOST_TEST(direct.inspect(sibling.container_id()).state.running);
    BOOST_TEST(to_string(sibling.close().container) == "removed");
}
