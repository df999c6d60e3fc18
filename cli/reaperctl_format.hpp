// How reaperctl shows the daemon's status to a person. The status object's layout belongs to
// the daemon and may grow, so this renders whatever it finds: scalars as "name: value",
// objects as indented sections, arrays of objects as aligned tables (columns = the union of
// their keys, in first-seen order), other arrays as comma-separated lists.
#pragma once

#include "reaper/control.hpp"

#include <string>
#include <string_view>

namespace reaperctl {

// Renders a status JSON object as text for a terminal. Throws std::invalid_argument if the
// text is not a JSON object. Every value goes through reaper::terminal_safe; an empty string
// shows as ""; a table cell past 80 characters is cut with "...", and a line under the table
// says how many were cut.
std::string format_status(std::string_view status_json);

// The counts that are not 0, in the daemon's words: "3 containers, 1 network"; "nothing"
// when all are 0.
std::string format_counts(const reaper::control::KindCounts& counts);

// What `reaperctl end SESSION` prints: "session S ended; 3 containers queued for reaping".
// A daemon that says less (an older one answers {"ok":true}) gets "session S ended".
std::string format_end_reply(const std::string& session, const reaper::control::Reply& reply);

// What `reaperctl orphan C` prints once the report is accepted: the full id it was pinned
// to, its session and whether its reap is queued.
std::string format_orphan_reply(const std::string& reference, const reaper::control::Reply& reply);

}  // namespace reaperctl
