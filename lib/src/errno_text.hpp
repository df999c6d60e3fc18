// Internal to libreaper and reaperd (not installed): how an errno value reads in a message.
#pragma once

#include <string>

namespace reaper::detail {

// The system's text for errno value `code` ("No such file or directory"), or "unknown error"
// for 0: a failed call that left errno unset says so instead of "Success". Thread-safe (not
// std::strerror, whose buffer another thread may overwrite).
std::string errno_text(int code);

}  // namespace reaper::detail
