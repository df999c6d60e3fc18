#include "engine.hpp"

#include <Poco/Pipe.h>
#include <Poco/PipeStream.h>
#include <Poco/Process.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <fcntl.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace reaper::test {

struct PrivateEngine::Guard {
    Poco::Pipe to_guard;
    Poco::Pipe from_guard;
    Poco::ProcessHandle handle;
    Poco::PipeOutputStream out{to_guard};
    Poco::PipeInputStream in{from_guard};

    static Poco::ProcessHandle launch(Poco::Pipe& to, Poco::Pipe& from) {
        auto handle = Poco::Process::launch(REAPER_ENGINE_GUARD, {}, &to, &from, nullptr);
        // Our pipe ends must not leak into other children (a reaperd under test), or the
        // guard would not see EOF when this process dies.
        ::fcntl(to.writeHandle(), F_SETFD, FD_CLOEXEC);
        ::fcntl(from.readHandle(), F_SETFD, FD_CLOEXEC);
        return handle;
    }
    Guard() : handle(launch(to_guard, from_guard)) {}
};

PrivateEngine::PrivateEngine() : guard_(new Guard) {
    std::string line;
    if (!std::getline(guard_->in, line) || line.rfind("ready ", 0) != 0) {
        delete guard_;
        throw std::runtime_error("private engine did not start: " + line);
    }
    dir_ = line.substr(6);
    Client client(client_options());
    import_busybox_image(client, image);
}

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

void import_busybox_image(Engine& client, const std::string& reference) {
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
