// Opens a sandbox Session, runs a command in it, and lets the Session clean up.
//
//   session_example [--template FILE NAME | IMAGE] [-v]
//
// The engine is found through DOCKER_HOST (default unix:///var/run/docker.sock); reaperd,
// if it runs, through REAPERD_SOCKET (default /run/reaperd/control.sock).
#include <reaper/session.hpp>

#include <chrono>
#include <iostream>
#include <string>

int main(int argc, char** argv) {
    using namespace std::chrono_literals;
    std::string image = "busybox:latest", template_file, template_name;
    bool verbose = false;
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg == "-v") {
            verbose = true;
        } else if (arg == "--template" && i + 2 < argc) {
            template_file = argv[++i];
            template_name = argv[++i];
        } else if (!arg.empty() && arg[0] != '-') {
            image = arg;
        } else {
            std::cerr << "usage: session_example [--template FILE NAME | IMAGE] [-v]\n";
            return 2;
        }
    }

    reaper::SessionOptions options;
    options.ready_timeout = 30s;
    if (verbose) options.log = reaper::stderr_log_sink(reaper::LogLevel::Debug);

    try {
        reaper::Session session(options);
        if (!template_file.empty()) {
            session.create_from_template(reaper::TemplateLibrary::load_file(template_file), template_name);
        } else {
            reaper::ContainerSpec spec;
            spec.image = image;
            spec.cmd = {"sleep", "3600"};
            session.create(spec);
        }
        std::cout << "session " << session.id() << ": container " << session.container_id().substr(0, 12)
                  << " is ready" << (session.holds_lease() ? " (reaperd holds a lease)" : "") << "\n";
        int exit_code = session.engine().exec(session.container_id(), {"echo", "hello from the sandbox"}, 10s);
        std::cout << "exec exited " << exit_code << "\n";
        auto result = session.close();  // the destructor would do the same
        std::cout << "container " << reaper::to_string(result.container) << "\n";
        return exit_code == 0 ? 0 : 1;
    } catch (const std::exception& e) {
        // Whatever failed, the session already removed what it created and closed its client.
        std::cerr << "session_example: " << e.what() << "\n";
        return 1;
    }
}
