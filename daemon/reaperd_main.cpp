#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
    if (argc == 2 && std::strcmp(argv[1], "--version") == 0) {
        std::printf("reaperd %s\n", REAPER_VERSION);
        return 0;
    }
    std::fprintf(stderr, "reaperd: the daemon is not implemented yet; only --version works\n");
    return 64;
}
