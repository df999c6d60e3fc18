// Reading a whole file through an fd the caller opened, for the two files reaperd reads at
// start-up (its config and its state), which report open and read failures differently.
#pragma once

#include <string>

namespace reaperd {

// Appends everything left to read on `fd` to `text`. Returns 0 at end of file, or the errno
// of the read that failed (EINTR is retried); `text` then holds what was read before it.
int read_all(int fd, std::string& text);

}  // namespace reaperd
