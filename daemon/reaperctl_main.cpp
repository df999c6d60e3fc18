#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
    if (argc == 2 && std::strcmp(argv[1], "--version") == 0) {
        std::printf("reaperctl %s\n", REAPER_VERSION);
        return 0;
    }
    std::fprintf(stderr, "reaperctl: not implemented yet; only --version works\n");
    return 64;
}
