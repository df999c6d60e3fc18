#include "errno_text.hpp"

#include <system_error>

namespace reaper::detail {

std::string errno_text(int code) {
    return code != 0 ? std::system_category().message(code) : std::string("unknown error");
}

}  // namespace reaper::detail
