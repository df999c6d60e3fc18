#include "notify.hpp"

#include <systemd/sd-daemon.h>

#include <ctime>
#include <string>

namespace reaperd::notify {

void ready() { sd_notify(0, "READY=1"); }

void reloading() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    auto usec = static_cast<unsigned long long>(ts.tv_sec) * 1000000ULL + ts.tv_nsec / 1000;
    std::string message = "RELOADING=1\nMONOTONIC_USEC=" + std::to_string(usec);
    sd_notify(0, message.c_str());
}

void stopping() { sd_notify(0, "STOPPING=1"); }

void status(std::string_view line) {
    // A newline would end the STATUS= assignment and start another one.
    std::string message = "STATUS=";
    for (char c : line) message += (c == '\n' || c == '\r') ? ' ' : c;
    sd_notify(0, message.c_str());
}

void watchdog() { sd_notify(0, "WATCHDOG=1"); }

std::optional<std::chrono::milliseconds> watchdog_interval() {
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return std::nullopt;
    return std::chrono::milliseconds{usec / 2000};
}

}  // namespace reaperd::notify
