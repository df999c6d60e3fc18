// How reaperctl shows the daemon's status to a person. The status object's layout belongs to
// the daemon and may grow, so this renders whatever it finds: scalars as "name: value",
// objects as indented sections, arrays of objects as aligned tables (columns = the union of
// their keys, in first-seen order), other arrays as comma-separated lists.
#pragma once

#include <string>
#include <string_view>

namespace reaperd {

// Renders a status JSON object as text for a terminal. Throws std::invalid_argument if the
// text is not a JSON object.
std::string format_status(std::string_view status_json);

}  // namespace reaperd
