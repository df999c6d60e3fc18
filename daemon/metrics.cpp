#include "metrics.hpp"

#include <sstream>

namespace reaperd {

namespace {
void header(std::ostringstream& out, const char* name, const char* type, const char* help) {
    out << "# HELP " << name << ' ' << help << '\n' << "# TYPE " << name << ' ' << type << '\n';
}

// Label values in the exposition format escape backslash, quote and newline.
std::string escape_label(const std::string& value) {
    std::string out;
    for (char c : value) {
        if (c == '\\') out += "\\\\";
        else if (c == '"') out += "\\\"";
        else if (c == '\n') out += "\\n";
        else out += c;
    }
    return out;
}
}  // namespace

void Metrics::action(const std::string& kind) {
    std::lock_guard lock(mutex_);
    ++actions_[kind];
}

std::map<std::string, std::uint64_t> Metrics::actions() const {
    std::lock_guard lock(mutex_);
    return actions_;
}

std::string Metrics::render(const Gauges& gauges) const {
    std::ostringstream out;
    header(out, "reaperd_tracked_containers", "gauge", "Session-owned containers being tracked.");
    out << "reaperd_tracked_containers " << gauges.tracked_containers << '\n';
    header(out, "reaperd_sessions", "gauge", "Known sessions by state.");
    for (const char* state : {"leased", "grace", "ended", "unclaimed"}) {
        auto it = gauges.sessions_by_state.find(state);
        out << "reaperd_sessions{state=\"" << state << "\"} "
            << (it == gauges.sessions_by_state.end() ? 0 : it->second) << '\n';
    }
    header(out, "reaperd_pending_reaps", "gauge", "Reaps queued or being retried.");
    out << "reaperd_pending_reaps " << gauges.pending_reaps << '\n';
    header(out, "reaperd_engine_up", "gauge", "1 when the engine answers, else 0.");
    out << "reaperd_engine_up " << (gauges.engine_up ? 1 : 0) << '\n';
    header(out, "reaperd_reaps_done_total", "counter", "Containers removed.");
    out << "reaperd_reaps_done_total " << reaps_done() << '\n';
    header(out, "reaperd_reaps_failed_total", "counter", "Removal attempts that failed.");
    out << "reaperd_reaps_failed_total " << reaps_failed() << '\n';
    header(out, "reaperd_log_bytes_dropped_total", "counter",
           "Container log bytes cut away by log caps.");
    out << "reaperd_log_bytes_dropped_total " << gauges.log_bytes_dropped << '\n';
    header(out, "reaperd_actions_total", "counter", "Actions taken, by kind.");
    auto all_actions = actions();
    for (const auto& [kind, count] : gauges.log_actions) all_actions[kind] += count;
    for (const auto& [kind, count] : all_actions)
        out << "reaperd_actions_total{action=\"" << escape_label(kind) << "\"} " << count << '\n';
    header(out, "reaperd_engine_reconnects_total", "counter",
           "Times the engine connection was re-established after a loss.");
    out << "reaperd_engine_reconnects_total " << engine_reconnects() << '\n';
    return out.str();
}

}  // namespace reaperd
