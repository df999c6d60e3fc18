// systemd's service notification protocol (sd_notify). Every call is a no-op when
// NOTIFY_SOCKET is unset, so the daemon runs the same outside systemd.
#pragma once

#include <chrono>
#include <optional>
#include <string_view>

namespace reaperd::notify {

void ready();                         // READY=1: engine answered and initial sync done
void reloading();                     // RELOADING=1 with MONOTONIC_USEC, on SIGHUP
void stopping();                      // STOPPING=1, on SIGTERM
void status(std::string_view line);   // STATUS=<one-line summary>
void watchdog();                      // WATCHDOG=1: call only from the turning main loop
// How often to ping: half of WATCHDOG_USEC, or nullopt when no watchdog is armed.
std::optional<std::chrono::milliseconds> watchdog_interval();

}  // namespace reaperd::notify
