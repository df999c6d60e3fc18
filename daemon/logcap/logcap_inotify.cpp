#include "logcap_inotify.hpp"

#include <algorithm>
#include <cerrno>
#include <system_error>

#include <sys/inotify.h>
#include <unistd.h>

namespace reaperd::logcap {

namespace {

// Events on the log's directory that matter: writes to the live file (and the gzip of a
// rotation), and the live file being replaced, renamed or deleted by a rotation.
constexpr std::uint32_t watch_mask = IN_MODIFY | IN_CREATE | IN_MOVED_FROM | IN_MOVED_TO |
                                     IN_DELETE | IN_DELETE_SELF | IN_ONLYDIR | IN_EXCL_UNLINK;

}  // namespace

InotifyDispatcher::InotifyDispatcher() : inotify_(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {
    if (!inotify_) throw std::system_error(errno, std::system_category(), "inotify_init1");
}

int InotifyDispatcher::watch(const std::string& dir, const std::string& id) {
    int wd = ::inotify_add_watch(inotify_.get(), dir.c_str(), watch_mask);
    if (wd >= 0) by_wd_[wd].push_back(id);
    return wd;
}

void InotifyDispatcher::unwatch(int wd, const std::string& id) {
    if (wd < 0) return;
    auto it = by_wd_.find(wd);
    if (it == by_wd_.end()) return;
    std::erase(it->second, id);
    if (!it->second.empty()) return;
    ::inotify_rm_watch(inotify_.get(), wd);
    by_wd_.erase(it);
}

bool InotifyDispatcher::drain(const std::function<void(const DirEvent&)>& on_event) {
    alignas(struct inotify_event) char buffer[16 * 1024];
    bool any = false;
    while (true) {
        ssize_t n = ::read(inotify_.get(), buffer, sizeof buffer);
        if (n <= 0) break;
        any = true;
        for (char* p = buffer; p < buffer + n;) {
            auto* event = reinterpret_cast<struct inotify_event*>(p);
            p += sizeof(struct inotify_event) + event->len;
            if (event->mask & IN_Q_OVERFLOW) {
                on_event({DirEvent::Kind::overflow, {}, {}, false});
                continue;
            }
            auto it = by_wd_.find(event->wd);
            if (it == by_wd_.end()) continue;
            if (event->mask & IN_IGNORED) {
                const auto ids = std::move(it->second);
                by_wd_.erase(it);
                for (const auto& id : ids) on_event({DirEvent::Kind::dir_gone, id, {}, false});
                continue;
            }
            std::string_view name = event->len ? std::string_view(event->name) : std::string_view();
            const bool replaced = event->mask & (IN_CREATE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE);
            for (const auto& id : it->second) on_event({DirEvent::Kind::entry, id, name, replaced});
        }
    }
    return any;
}

}  // namespace reaperd::logcap
