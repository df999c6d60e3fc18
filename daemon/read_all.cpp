#include "read_all.hpp"

#include <cerrno>

#include <unistd.h>

namespace reaperd {

int read_all(int fd, std::string& text) {
    char buffer[65536];
    for (;;) {
        const ssize_t n = ::read(fd, buffer, sizeof buffer);
        if (n > 0)
            text.append(buffer, static_cast<std::size_t>(n));
        else if (n == 0)
            return 0;
        else if (errno != EINTR)
            return errno;
    }
}

}  // namespace reaperd
