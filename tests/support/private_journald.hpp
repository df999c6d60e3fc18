// A real systemd-journald of a test's own: started in a private mount namespace (a tmpfs on
// /run, so the test's processes log to it and never to the host's journal), with volatile
// storage bind-mounted from a temp dir that journalctl -D reads afterwards. Used by the
// journal tests, which must see what journald itself stores, not what a fake would.
#pragma once

#include <boost/test/unit_test.hpp>

#include <Poco/JSON/Object.h>
#include <Poco/JSON/Parser.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace reaper::test {

// Runs `command` through the shell and returns its stdout; the test fails (with the output)
// when it does not exit 0.
inline std::string run_output(const std::string& command) {
    std::string out;
    FILE* pipe = popen(command.c_str(), "r");
    BOOST_REQUIRE(pipe != nullptr);
    std::array<char, 4096> buf{};
    std::size_t n = 0;
    while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
    int status = pclose(pipe);
    BOOST_TEST_INFO("command: " << command << "\noutput:\n" << out);
    BOOST_REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return out;
}

inline std::string file_text(const std::filesystem::path& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

// One journald session, run in the constructor: starts journald, runs `while_running` (bash;
// $dir is the temp dir, $self this test binary), syncs and stops journald, then runs
// `after` (bash, e.g. checks of what the body left in $dir). The whole script must exit 0.
class PrivateJournald {
public:
    PrivateJournald(const std::string& name, const std::string& while_running, const std::string& after = {}) {
        std::string tmpl = "/tmp/" + name + ".XXXXXX";
        BOOST_REQUIRE(mkdtemp(tmpl.data()) != nullptr);
        dir_ = tmpl;
        std::filesystem::create_directories(dir_ / "storage");
        const std::string self = std::filesystem::read_symlink("/proc/self/exe");
        const std::string script = R"(
set -e
dir=$1 self=$2
mount -n -t tmpfs tmpfs /run
mkdir -p /run/systemd/journal /run/log/journal /run/systemd/journald.conf.d
mount -n --bind "$dir/storage" /run/log/journal
printf '[Journal]\nStorage=volatile\nReadKMsg=no\nForwardToSyslog=no\nForwardToWall=no\nAudit=no\nRateLimitIntervalSec=0\n' \
  >/run/systemd/journald.conf.d/test.conf
/lib/systemd/systemd-journald >"$dir/journald.log" 2>&1 &
journald=$!
for _ in $(seq 1 400); do [ -S /run/systemd/journal/socket ] && break; sleep 0.05; done
[ -S /run/systemd/journal/socket ] || { echo "journald did not start"; cat "$dir/journald.log"; exit 1; }
)" + while_running + R"(
journalctl --sync
kill -TERM "$journald"
wait "$journald" || true
)" + after;
        std::ofstream(dir_ / "run.sh") << script;
        output_ = run_output("unshare --mount --propagation private bash " + (dir_ / "run.sh").string() + " " +
                             dir_.string() + " " + self + " 2>&1");
    }
    ~PrivateJournald() {
        std::error_code ignored;
        std::filesystem::remove_all(dir_, ignored);
    }
    PrivateJournald(const PrivateJournald&) = delete;
    PrivateJournald& operator=(const PrivateJournald&) = delete;

    const std::filesystem::path& dir() const { return dir_; }
    // What the script printed (stdout and stderr), for failure messages.
    const std::string& output() const { return output_; }

    // The records journald stored that match `match` (a journalctl match such as
    // TEST_RUN=x or _PID=123), as journalctl's JSON objects, in order.
    std::vector<Poco::JSON::Object::Ptr> records(const std::string& match) const {
        const std::string out = run_output("journalctl --no-pager -D " + (dir_ / "storage").string() + " -o json " + match);
        std::vector<Poco::JSON::Object::Ptr> result;
        std::istringstream lines(out);
        std::string line;
        while (std::getline(lines, line)) {
            if (line.empty() || line.front() != '{') continue;
            Poco::JSON::Parser parser;
            result.push_back(parser.parse(line).extract<Poco::JSON::Object::Ptr>());
        }
        return result;
    }

private:
    std::filesystem::path dir_;
    std::string output_;
};

}  // namespace reaper::test
