// A program outside the reaperd tree that uses the installed libreaper as an application would:
// an engine client from DOCKER_HOST, an image imported from a tar (argv[1]), and a Session
// that creates a labelled container, runs a command in it and removes it on close. Exits 0
// when every step did what the library promises; prints what failed otherwise.
#include <reaper/client.hpp>
#include <reaper/control.hpp>
#include <reaper/session.hpp>

#include <chrono>
#include <exception>
#include <fstream>
#include <iostream>
#include <string>

using namespace std::chrono_literals;

namespace {

int fail(const std::string& what) {
    std::cerr << "consumer: " << what << "\n";
    return 1;
}

}  // namespace

int main(int argc, char** argv) try {
    if (argc != 2) return fail("usage: consumer ROOTFS_TAR");
    const std::string image = "reaper-consumer/busybox:latest";

    reaper::ClientOptions client_options;
    client_options.address = reaper::EngineAddress::from_environment();
    reaper::Client client(client_options);
    client.ping();
    std::ifstream tar(argv[1], std::ios::binary);
    if (!tar) return fail(std::string("cannot read ") + argv[1]);
    client.import_image(tar, image);

    reaper::SessionOptions options;
    options.use_daemon = false;  // no reaperd in this test; a Session works alone
    options.ready_settle = 0ms;
    options.readiness_probe = {"test", "-d", "/tmp"};
    reaper::Session session(options);
    reaper::ContainerSpec spec;
    spec.image = image;
    spec.cmd = {"sleep", "600"};
    session.create(spec);
    const std::string id = session.container_id();
    const auto info = client.inspect(id);
    if (!info.state.running) return fail("the session's container is not running");
    if (info.labels.count("reaperd.session") == 0 || info.labels.at("reaperd.session") != session.id())
        return fail("the session's container lacks reaperd.session=" + session.id());
    if (session.engine().exec(id, {"true"}, 10s) != 0) return fail("exec true did not exit 0");

    const auto result = session.close();
    if (result.container != reaper::TeardownResult::Container::Removed)
        return fail(std::string("close: ") + reaper::to_string(result.container));
    try {
        client.inspect(id);
        return fail("the container is still there after close()");
    } catch (const reaper::NotFound&) {
    }
    reaper::control::validate_session_id(session.id());
    std::cout << "consumer: session " << session.id() << " created, used and removed " << id
              << " through the installed libreaper\n";
    return 0;
} catch (const std::exception& e) {
    return fail(std::string("failed: ") + e.what());
}
