#include "vocabulary.hpp"

namespace reaperd {

namespace logcap {
std::string_view to_string(CapReason reason) noexcept { return name_in(cap_reason_names, reason); }
std::optional<CapReason> cap_reason_from_string(std::string_view name) noexcept {
    return value_in(cap_reason_names, name);
}
std::string_view to_string(CutMethod method) noexcept { return name_in(cut_method_names, method); }
std::optional<CutMethod> cut_method_from_string(std::string_view name) noexcept {
    return value_in(cut_method_names, name);
}
}  // namespace logcap

std::string_view to_string(EndReason reason) noexcept { return name_in(end_reason_names, reason); }
std::optional<EndReason> end_reason_from_string(std::string_view name) noexcept {
    return value_in(end_reason_names, name);
}

std::string_view to_string(ReapReason reason) noexcept { return name_in(reap_reason_names, reason); }
std::optional<ReapReason> reap_reason_from_string(std::string_view name) noexcept {
    return value_in(reap_reason_names, name);
}

std::string_view to_string(LogAction action) noexcept { return name_in(log_action_names, action); }
std::optional<LogAction> log_action_from_string(std::string_view name) noexcept {
    return value_in(log_action_names, name);
}

std::string_view to_string(const ActReason& reason) noexcept {
    if (const auto* reap = std::get_if<ReapReason>(&reason)) return to_string(*reap);
    if (const auto* cap = std::get_if<logcap::CapReason>(&reason)) return to_string(*cap);
    return {};
}

std::string dry_run_action(std::string_view action) {
    std::string out(dry_run_prefix);
    out += action;
    return out;
}

}  // namespace reaperd
