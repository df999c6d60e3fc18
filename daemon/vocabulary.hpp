// reaperd's vocabularies: the values it writes as REASON= and ACTION= in the journal, as
// metric labels (reaperd_sessions_ended_total{reason}, reaperd_actions_total{action}), in
// status JSON, in the state file, and that logs.action reads. Each is an enum with ONE
// table of {value, name}: to_string() and *_from_string() read that table, and so does
// vocabulary_test, which checks that every value has exactly one name, that names round-trip,
// that docs/systemd.md's REASON row lists exactly the reasons, and that its ACTION row and
// README's metric rows name every end reason, log action and dry-run action.
//
// Adding a value: its enumerator, its row in the table, and the code that acts on it: the
// switches over the enum do not build warning-free (-Wswitch) until they handle it
// (an end reason: daemon.cpp's end_message; a log action: daemon.cpp's capper_actions, the
// engine act in logcap/logcap_records.cpp's engine_action and the worker's counter in logcap/logcap.cpp).
// The docs check (vocabulary_test) then names the docs to extend.
// Names are what users filter and alert on, and what old state files hold: never rename one.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

namespace reaperd {

template <class Enum>
struct Named {
    Enum value;
    std::string_view name;
};

// A table's two lookups, behind each vocabulary's to_string and *_from_string below.
template <class Enum, std::size_t N>
constexpr std::string_view name_in(const std::array<Named<Enum>, N>& table, Enum value) noexcept {
    for (const auto& row : table)
        if (row.value == value) return row.name;
    return {};  // never while vocabulary_test holds: every value has its row
}
template <class Enum, std::size_t N>
constexpr std::optional<Enum> value_in(const std::array<Named<Enum>, N>& table,
                                       std::string_view name) noexcept {
    for (const auto& row : table)
        if (row.name == name) return row.value;
    return std::nullopt;
}

// Why a session ended: Session::end_reason, REASON= of "session ended", the `reason` label of
// reaperd_sessions_ended_total, `end_reason` in status and in the state file.
// One byte: a tombstone keeps one, and 100,000 tombstones may be held.
enum class EndReason : std::uint8_t {
    end,            // its owner ended it (`reaperctl end`, the control protocol's "end")
    lease_expired,  // its last lease closed and sessions.lease_grace passed
    unclaimed,      // it never took a lease within sessions.unclaimed_grace
};
inline constexpr std::array<Named<EndReason>, 3> end_reason_names{{
    {EndReason::end, "end"},
    {EndReason::lease_expired, "lease_expired"},
    {EndReason::unclaimed, "unclaimed"},
}};

// Why a container (network, volume) is reaped: PendingReap::reason, REASON= of its reap
// records and of the door's refusals, `reason` of status `pending`, and the state file.
enum class ReapReason {
    session_ended,  // its session ended (networks and volumes: always this)
    max_age,        // it passed sessions.max_age or its reaperd.max-age label
    orphan,         // an orphan report (`reaperctl orphan`, the library's failed delete)
};
inline constexpr std::array<Named<ReapReason>, 3> reap_reason_names{{
    {ReapReason::session_ended, "session_ended"},
    {ReapReason::max_age, "max_age"},
    {ReapReason::orphan, "orphan"},
}};

// What the log capper does to a container past its cap (logs.action): the config's words,
// ACTION= of "log capped" records, the `action` label of reaperd_actions_total.
enum class LogAction { truncate, stop, kill, remove };
inline constexpr std::array<Named<LogAction>, 4> log_action_names{{
    {LogAction::truncate, "truncate"},
    {LogAction::stop, "stop"},
    {LogAction::kill, "kill"},
    {LogAction::remove, "remove"},
}};

namespace logcap {
// Why the log capper acts: REASON= of its records and of the door's records for its calls.
enum class CapReason {
    own_cap,       // the container's own cap: logs.max_size or its reaperd.log-max-size label
    total_budget,  // logs.total_max_size, the budget over all capped logs
};
inline constexpr std::array<Named<CapReason>, 2> cap_reason_names{{
    {CapReason::own_cap, "max_size"},
    {CapReason::total_budget, "total_max_size"},
}};
std::string_view to_string(CapReason reason) noexcept;
std::optional<CapReason> cap_reason_from_string(std::string_view name) noexcept;

// How a cut shortens a live log: CUT_METHOD= of its records.
enum class CutMethod {
    punch_hole,  // the oldest part's blocks freed, the apparent size and offsets kept
    truncate,    // the file truncated to 0
};
inline constexpr std::array<Named<CutMethod>, 2> cut_method_names{{
    {CutMethod::punch_hole, "punch_hole"},
    {CutMethod::truncate, "truncate"},
}};
std::string_view to_string(CutMethod method) noexcept;
std::optional<CutMethod> cut_method_from_string(std::string_view name) noexcept;
}  // namespace logcap

std::string_view to_string(EndReason reason) noexcept;
std::optional<EndReason> end_reason_from_string(std::string_view name) noexcept;
std::string_view to_string(ReapReason reason) noexcept;
std::optional<ReapReason> reap_reason_from_string(std::string_view name) noexcept;
std::string_view to_string(LogAction action) noexcept;
std::optional<LogAction> log_action_from_string(std::string_view name) noexcept;

// Why the door (guard.hpp) is asked to act: a reap's reason or a log cap's; none leaves
// REASON= out of its records.
using ActReason = std::variant<std::monostate, ReapReason, logcap::CapReason>;
std::string_view to_string(const ActReason& reason) noexcept;  // "" for none

// A dry run's ACTION= (and reaperd_actions_total label) for `action`: "would_" + action, one
// spelling for every caller ("would_reap", "would_remove", "would_truncate", ...).
inline constexpr std::string_view dry_run_prefix = "would_";
std::string dry_run_action(std::string_view action);

}  // namespace reaperd
