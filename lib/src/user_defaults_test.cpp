#include "user_defaults.hpp"

#include <boost/test/unit_test.hpp>

#include <map>
#include <set>
#include <string>
#include <vector>

using namespace reaper::defaults;

namespace {

using Vars = std::map<std::string, std::string>;

Environment environment(const Vars& vars) {
    return [vars](const std::string& name) -> std::optional<std::string> {
        auto it = vars.find(name);
        if (it == vars.end()) return std::nullopt;
        return it->second;
    };
}

SocketProbe serving(std::set<std::string> paths) {
    return [paths](const std::string& path) { return paths.count(path) > 0; };
}

// The message of the DefaultsError daemon_paths throws, or "" if none.
std::string refusal(uid_t uid, const Vars& vars) {
    try {
        daemon_paths(uid, environment(vars));
    } catch (const DefaultsError& e) {
        return e.what();
    }
    return "";
}

const Vars user{{"HOME", "/home/u"}, {"XDG_RUNTIME_DIR", "/run/user/1000"}};

}  // namespace

BOOST_AUTO_TEST_SUITE(user_defaults)

BOOST_AUTO_TEST_CASE(config_files_follow_the_user) {
    struct Row {
        uid_t uid;
        Vars vars;
        std::vector<std::string> files;
    };
    const std::vector<Row> rows{
        {0, user, {"/etc/reaperd/reaperd.yaml"}},
        {1000, user, {"/home/u/.config/reaperd/reaperd.yaml", "/etc/reaperd/reaperd.yaml"}},
        {1000, {{"HOME", "/home/u"}, {"XDG_CONFIG_HOME", "/cfg"}}, {"/cfg/reaperd/reaperd.yaml", "/etc/reaperd/reaperd.yaml"}},
        // A relative XDG value is ignored, as the XDG spec says.
        {1000, {{"HOME", "/home/u"}, {"XDG_CONFIG_HOME", "cfg"}}, {"/home/u/.config/reaperd/reaperd.yaml", "/etc/reaperd/reaperd.yaml"}},
        {1000, {}, {"/etc/reaperd/reaperd.yaml"}},
    };
    for (const Row& row : rows) BOOST_TEST(config_files(row.uid, environment(row.vars)) == row.files, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(daemon_paths_follow_the_user) {
    struct Row {
        uid_t uid;
        Vars vars;
        std::string socket;
        std::string state;
    };
    const std::vector<Row> rows{
        {0, user, "/run/reaperd/control.sock", "/var/lib/reaperd"},
        {0, {}, "/run/reaperd/control.sock", "/var/lib/reaperd"},
        {1000, user, "/run/user/1000/reaperd/control.sock", "/home/u/.local/state/reaperd"},
        {1000, {{"XDG_RUNTIME_DIR", "/r"}, {"XDG_STATE_HOME", "/s"}}, "/r/reaperd/control.sock", "/s/reaperd"},
        {1000, {{"XDG_RUNTIME_DIR", "/r"}, {"XDG_STATE_HOME", "s"}, {"HOME", "/h"}}, "/r/reaperd/control.sock", "/h/.local/state/reaperd"},
    };
    for (const Row& row : rows) {
        const DaemonPaths paths = daemon_paths(row.uid, environment(row.vars));
        BOOST_TEST(paths.control_socket == row.socket);
        BOOST_TEST(paths.state_dir == row.state);
    }
}

BOOST_AUTO_TEST_CASE(a_user_without_a_runtime_dir_is_refused_never_sent_to_run) {
    for (const Vars& vars : {Vars{{"HOME", "/home/u"}}, Vars{{"HOME", "/home/u"}, {"XDG_RUNTIME_DIR", ""}},
                             Vars{{"HOME", "/home/u"}, {"XDG_RUNTIME_DIR", "run/user/1000"}}}) {
        BOOST_TEST(refusal(1000, vars).find("XDG_RUNTIME_DIR is not set to an absolute path") != std::string::npos);
    }
    BOOST_TEST(refusal(1000, {{"XDG_RUNTIME_DIR", "/r"}}).find("neither XDG_STATE_HOME nor HOME") != std::string::npos);
    BOOST_TEST(refusal(0, {}) == "");
}

BOOST_AUTO_TEST_CASE(engine_is_docker_host_else_the_first_user_socket_that_answers) {
    const std::string docker = "/run/user/1000/docker.sock";
    const std::string podman = "/run/user/1000/podman/podman.sock";
    struct Row {
        uid_t uid;
        Vars vars;
        std::set<std::string> answering;
        std::optional<std::string> engine;
    };
    Vars with_host = user;
    with_host["DOCKER_HOST"] = "unix:///elsewhere.sock";
    const std::vector<Row> rows{
        // root's engine and $DOCKER_HOST are taken as they are, answering or not.
        {0, user, {}, "unix:///var/run/docker.sock"},
        {0, with_host, {}, "unix:///elsewhere.sock"},
        {1000, with_host, {docker, podman}, "unix:///elsewhere.sock"},
        {1000, user, {docker, podman}, "unix://" + docker},
        {1000, user, {podman}, "unix://" + podman},
        {1000, user, {}, std::nullopt},
        {1000, {{"HOME", "/home/u"}}, {docker, podman}, std::nullopt},
    };
    for (const Row& row : rows) BOOST_TEST(choose_engine(row.uid, environment(row.vars), serving(row.answering)).value_or("none") ==
                                           row.engine.value_or("none"));
    BOOST_TEST(engine_candidates(1000, environment(user)) ==
                   (std::vector<std::string>{"unix://" + docker, "unix://" + podman}),
               boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(clients_find_the_users_daemon_after_reaperd_socket) {
    const std::string mine = "/run/user/1000/reaperd/control.sock";
    const std::string system = "/run/reaperd/control.sock";
    struct Row {
        uid_t uid;
        Vars vars;
        std::set<std::string> present;
        std::string socket;
    };
    Vars with_variable = user;
    with_variable["REAPERD_SOCKET"] = "/tmp/x.sock";
    Vars with_empty_variable = user;
    with_empty_variable["REAPERD_SOCKET"] = "";
    const std::vector<Row> rows{
        {1000, with_variable, {mine, system}, "/tmp/x.sock"},
        {1000, with_empty_variable, {mine, system}, mine},
        {1000, user, {mine, system}, mine},
        // No user daemon: the system one, which control.group may open to this user.
        {1000, user, {system}, system},
        // Neither: the user's own, so the connection error names it.
        {1000, user, {}, mine},
        {1000, {}, {mine}, system},
        {0, user, {mine}, system},
    };
    for (const Row& row : rows) BOOST_TEST(client_socket(row.uid, environment(row.vars), serving(row.present)) == row.socket);
}

BOOST_AUTO_TEST_CASE(probes_tell_a_serving_socket_from_a_stale_file) {
    BOOST_TEST(!socket_answers("/nonexistent/x.sock"));
    BOOST_TEST(!socket_exists("/nonexistent/x.sock"));
    BOOST_TEST(!socket_exists("/etc/passwd"));
}

BOOST_AUTO_TEST_SUITE_END()
