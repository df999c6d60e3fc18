#include "engine.hpp"

#include "errno_text.hpp"

#include <Poco/Pipe.h>
#include <Poco/PipeStream.h>
#include <Poco/Process.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <stdexcept>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace fs = std::filesystem;

namespace reaper::test {

namespace {

std::string read_text(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

// $REAPERD_TEST_CACHE, where scripts/fetch-engines.sh and fetch-testcontainers.sh put what
// they fetch.
std::string test_cache_dir() {
    const char* cache = std::getenv("REAPERD_TEST_CACHE");
    return cache && *cache ? cache : "/var/cache/reaperd-test";
}

TestEngine engine_from_environment() {
    const char* value = std::getenv("REAPER_TEST_ENGINE");
    TestEngine engine;
    engine.name = value && *value ? value : "docker";
    if (engine.name == "docker") return engine;
    if (engine.name == "podman") {
        engine.kind = EngineKind::podman;
        return engine;
    }
    if (engine.name != "docker-trixie" && engine.name != "docker-sid")
        throw std::runtime_error("REAPER_TEST_ENGINE=" + engine.name +
                                 ": the harness runs docker (the default), docker-trixie, docker-sid or podman");
    const std::string suite = engine.name.substr(7);
    const std::string dir = test_cache_dir() + "/engines/" + suite;
    if (fs::exists(dir + "/unavailable"))
        throw std::runtime_error("REAPER_TEST_ENGINE=" + engine.name + ": scripts/fetch-engines.sh found it unavailable here: " +
                                 read_text(dir + "/unavailable"));
    if (!fs::exists(dir + "/root/usr/sbin/dockerd"))
        throw std::runtime_error("REAPER_TEST_ENGINE=" + engine.name + ": no engine in " + dir +
                                 "; run scripts/fetch-engines.sh " + suite);
    engine.root = dir + "/root";
    return engine;
}

}  // namespace

const TestEngine& test_engine() {
    static const TestEngine engine = engine_from_environment();
    return engine;
}

EngineKind test_engine_kind() { return test_engine().kind; }

std::string testcontainers_node_modules() {
    const auto dir = test_cache_dir() + "/npm/testcontainers/node_modules";
    if (!fs::exists(dir + "/testcontainers/package.json"))
        throw std::runtime_error("no testcontainers-node in " + dir + "; run scripts/fetch-testcontainers.sh");
    return dir;
}

std::string PrivateEngine::podman_cli(const std::string& args) const {
    const char* rootless = std::getenv("REAPER_PODMAN_ROOTLESS");
    if (rootless && *rootless) return "podman --remote --url " + address() + " " + args;
    return "env CONTAINERS_CONF=" + dir_ + "/containers.conf podman --root " + dir_ + "/root --runroot " + dir_ +
           "/run --tmpdir " + dir_ + "/tmp --storage-driver vfs " + args;
}

std::string TestEngine::docker_cli() const { return root.empty() ? "/usr/bin/docker" : root + "/usr/bin/docker"; }
std::string TestEngine::compose_v2() const { return root.empty() ? "" : root + "/usr/bin/docker-compose"; }
std::string TestEngine::cli_plugins_dir() const { return root.empty() ? "" : root + "/usr/libexec/docker/cli-plugins"; }

const char* to_string(EngineKind kind) { return kind == EngineKind::podman ? "podman" : "docker"; }

struct PrivateEngine::Guard {
    Poco::Pipe to_guard;
    Poco::Pipe from_guard;
    Poco::ProcessHandle handle;
    Poco::PipeOutputStream out{to_guard};
    Poco::PipeInputStream in{from_guard};

    static Poco::ProcessHandle launch(EngineKind kind, const std::string& tls_dir, Poco::Pipe& to, Poco::Pipe& from) {
        const char* guard = kind == EngineKind::podman ? REAPER_PODMAN_GUARD : REAPER_ENGINE_GUARD;
        Poco::Process::Env env;
        if (!tls_dir.empty()) env["REAPER_ENGINE_TLS_DIR"] = tls_dir;
        if (kind == EngineKind::docker && !test_engine().root.empty()) env["REAPER_ENGINE_ROOT"] = test_engine().root;
        auto handle = Poco::Process::launch(guard, {}, &to, &from, nullptr, env);
        // Our pipe ends must not leak into other children (a reaperd under test), or the
        // guard would not see EOF when this process dies.
        ::fcntl(to.writeHandle(), F_SETFD, FD_CLOEXEC);
        ::fcntl(from.readHandle(), F_SETFD, FD_CLOEXEC);
        return handle;
    }
    Guard(EngineKind kind, const std::string& tls_dir) : handle(launch(kind, tls_dir, to_guard, from_guard)) {}
};

PrivateEngine::PrivateEngine() : PrivateEngine(test_engine_kind(), "") {}

// podman-guard has no TLS listener: a TLS engine is always dockerd.
PrivateEngine::PrivateEngine(const std::string& tls_dir) : PrivateEngine(EngineKind::docker, tls_dir) {}

PrivateEngine::PrivateEngine(EngineKind kind, const std::string& tls_dir) : kind_(kind), guard_(new Guard(kind_, tls_dir)) {
    std::string line;
    if (!std::getline(guard_->in, line) || line.rfind("ready ", 0) != 0) {
        delete guard_;
        throw std::runtime_error(std::string("private ") + to_string(kind_) + " engine did not start: " + line);
    }
    // "ready <dir>", or "ready <dir> <tls address>" (engine-guard with REAPER_ENGINE_TLS_DIR).
    dir_ = line.substr(6);
    if (auto space = dir_.find(' '); space != std::string::npos) {
        tls_address_ = dir_.substr(space + 1);
        dir_.resize(space);
    }
    // A rootless mode that quietly ran the engine as root would pass every test and show
    // nothing: the socket's owner is the uid the engine runs as.
    const char* rootless_mode = std::getenv(kind_ == EngineKind::podman ? "REAPER_PODMAN_ROOTLESS" : "REAPER_DOCKER_ROOTLESS");
    const bool rootless = rootless_mode && *rootless_mode;
    struct stat socket_stat {};
    std::string wrong;
    if (::stat(socket_path().c_str(), &socket_stat) != 0)
        wrong = "its socket cannot be read: " + reaper::detail::errno_text(errno);
    else if ((socket_stat.st_uid != 0) != rootless)
        wrong = std::string(rootless ? "should run rootless" : "should run as root") + ", and its socket's owner is uid " +
                std::to_string(socket_stat.st_uid);
    if (!wrong.empty()) {
        delete guard_;
        throw std::runtime_error(std::string("private ") + to_string(kind_) + " engine at " + socket_path() + ": " + wrong);
    }
    Client client(client_options());
    import_busybox_image(client, image);
}

// Asked on first use: Podman takes ~4 s to answer /version.
const std::string& PrivateEngine::version() const {
    if (version_.empty()) {
        Client client(client_options());
        version_ = client.version().version;
    }
    return version_;
}

int PrivateEngine::major_version() const { return std::atoi(version().c_str()); }

PrivateEngine::~PrivateEngine() {
    guard_->out.close();  // EOF: the guard stops the engine and removes the dir
    guard_->handle.wait();
    delete guard_;
}

ClientOptions PrivateEngine::client_options() const {
    ClientOptions options;
    options.address = EngineAddress::parse(address());
    options.request_timeout = std::chrono::seconds{30};
    return options;
}

int PrivateEngine::daemon_pid() const {
    if (kind_ == EngineKind::podman) return -1;
    std::ifstream in(dir_ + "/docker.pid");  // engine-guard's --pidfile
    int pid = -1;
    return in >> pid ? pid : -1;
}

namespace {
void run_shell(const std::string& command) {
    if (std::system(command.c_str()) != 0) throw std::runtime_error("failed: " + command);
}
}  // namespace

RemovalPin::RemovalPin(const std::string& container_id) {
    const std::string root = engine().data_root();
    const std::string mount_id_file = root + "/image/vfs/layerdb/mounts/" + container_id + "/mount-id";
    std::ifstream in(mount_id_file);
    std::string mount_id;
    if (!(in >> mount_id)) throw std::runtime_error("no vfs mount id for " + container_id + " in " + mount_id_file);
    const std::string path = root + "/vfs/dir/" + mount_id + "/pinned";
    run_shell("touch " + path + " && chattr +i " + path);
    path_ = path;
}

RemovalPin::~RemovalPin() {
    try {
        release();
    } catch (const std::exception& e) {
        std::cerr << "RemovalPin: " << e.what() << std::endl;
    }
}

void RemovalPin::release() {
    if (path_.empty()) return;
    run_shell("chattr -i " + path_);
    path_.clear();
}

std::string PrivateEngine::command(const std::string& line) {
    guard_->out << line << std::endl;
    std::string answer;
    std::getline(guard_->in, answer);
    return answer;
}

void PrivateEngine::kill() {
    if (command("kill") != "killed") throw std::runtime_error("engine-guard did not kill the engine");
}

void PrivateEngine::start() {
    auto answer = command("start");
    if (answer.rfind("ready ", 0) != 0) throw std::runtime_error("engine did not restart: " + answer);
}

PrivateEngine& engine() {
    static PrivateEngine instance;
    return instance;
}

EngineFront::EngineFront(EngineProfile profile) : profile_(std::move(profile)) {
    char pattern[] = "/tmp/reaper-front.XXXXXX";
    if (!::mkdtemp(pattern)) throw std::runtime_error("mkdtemp failed for the engine front");
    dir_ = pattern;
    const std::string log = dir_ + "/front.log";
    std::vector<std::string> args{ENGINE_FRONT_PATH,
                                  "--listen", socket_path(),
                                  "--upstream", engine().socket_path(),
                                  "--min-api", profile_.min_api_version,
                                  "--max-api", profile_.max_api_version,
                                  "--engine-version", profile_.engine_version};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    pid_t pid = -1;
    int rc = ::posix_spawn(&pid, ENGINE_FRONT_PATH, &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
        fs::remove_all(dir_);
        throw std::runtime_error("spawning engine_front: " + reaper::detail::errno_text(rc));
    }
    pid_ = pid;

    // Up in a few ms; the limit is for a loaded 2-core machine.
    ClientOptions options = client_options();
    options.request_timeout = std::chrono::seconds{1};
    Client probe(options);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds{10};
    for (;;) {
        try {
            probe.ping();
            return;
        } catch (const EngineError&) {
            // Not listening yet.
        }
        bool exited = ::waitpid(pid_, nullptr, WNOHANG) == pid_;
        if (exited) pid_ = -1;
        if (exited || std::chrono::steady_clock::now() > deadline) {
            std::string why = log_text();
            stop();
            throw std::runtime_error("engine_front for " + profile_.name +
                                     (exited ? " exited" : " did not answer /_ping") +
                                     "; its log:\n" + why);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds{10});
    }
}

EngineFront::~EngineFront() { stop(); }

void EngineFront::stop() noexcept {
    if (pid_ > 0) {
        ::kill(pid_, SIGTERM);
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds{5};
        while (::waitpid(pid_, nullptr, WNOHANG) == 0) {
            if (std::chrono::steady_clock::now() > deadline) {
                ::kill(pid_, SIGKILL);
                ::waitpid(pid_, nullptr, 0);
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds{5});
        }
        pid_ = -1;
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
}

ClientOptions EngineFront::client_options() const {
    ClientOptions options = engine().client_options();
    options.address = EngineAddress::parse(address());
    return options;
}

std::string EngineFront::log_text() const {
    std::ifstream in(dir_ + "/front.log");
    return std::string(std::istreambuf_iterator<char>(in), {});
}

void import_busybox_image(Client& client, const std::string& reference) {
    fs::path root = fs::temp_directory_path() / unique_name("reaper-rootfs");
    fs::create_directories(root / "bin");
    fs::copy_file("/bin/busybox", root / "bin/busybox");
    for (const char* tool : {"sh", "sleep", "yes", "echo", "cat", "true", "false", "ls", "head",
                             "dd", "kill", "trap", "seq", "env", "touch", "rm", "test"}) {
        fs::create_symlink("busybox", root / "bin" / tool);
    }
    fs::create_directories(root / "tmp");
    fs::path tarball = root.string() + ".tar";
    std::string tar_command = "tar -C '" + root.string() + "' -cf '" + tarball.string() + "' .";
    if (std::system(tar_command.c_str()) != 0) throw std::runtime_error("tar failed: " + tar_command);
    std::ifstream in(tarball, std::ios::binary);
    client.import_image(in, reference);
    fs::remove_all(root);
    fs::remove(tarball);
}

std::size_t open_fd_count() {
    std::size_t n = 0;
    for ([[maybe_unused]] auto& entry : fs::directory_iterator("/proc/self/fd")) ++n;
    return n;
}

std::string unique_name(const std::string& prefix) {
    static std::atomic<unsigned> counter{0};
    return prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

}  // namespace reaper::test
