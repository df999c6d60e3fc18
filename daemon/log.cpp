#include "log.hpp"

#include <cstdio>
#include <mutex>
#include <string>

namespace reaperd {

namespace {
const char* priority_name(Priority p) {
    switch (p) {
        case Priority::err: return "error";
        case Priority::warning: return "warning";
        case Priority::notice: return "notice";
        case Priority::info: return "info";
        case Priority::debug: return "debug";
    }
    return "info";
}
std::mutex stderr_mutex;
}  // namespace

void log(Priority priority, std::string_view message_id, std::string_view message,
         std::vector<LogField> fields) {
    try {
        std::string line = "<" + std::to_string(static_cast<int>(priority)) + ">" +
                           priority_name(priority) + ": " + std::string(message);
        for (const auto& f : fields) line += " " + f.name + "=" + f.value;
        if (!message_id.empty()) line += " MESSAGE_ID=" + std::string(message_id);
        line += "\n";
        std::lock_guard lock(stderr_mutex);
        std::fwrite(line.data(), 1, line.size(), stderr);
    } catch (...) {
        // Logging must never take the daemon down; an allocation failure here loses one line.
    }
}

}  // namespace reaperd
