// The log capper's inotify dispatcher (logcap.hpp): one inotify descriptor, a watch on each
// watched log directory, and which containers each watch serves (two containers may share a
// directory), so that a raw event becomes "this container's log may have changed".
//
// Contract: used by the watcher thread only. The descriptor is non-blocking: drain() reads
// what is queued and returns, never waits. A directory that goes (IN_IGNORED: its container
// was removed) loses its watch here before the containers hear of it, so unwatch() after
// that is a no-op. A lost event shows as an overflow, which the caller must take as "every
// container may have changed". The constructor throws std::system_error if inotify is
// unavailable; nothing else throws.
#pragma once

#include "unique_fd.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace reaperd::logcap {

// One event as it concerns one container.
struct DirEvent {
    enum class Kind {
        overflow,  // events were lost: `id` and `name` are empty
        dir_gone,  // the container's log directory is gone, with its watch
        entry,     // something happened to `name` in the directory
    };
    Kind kind = Kind::entry;
    std::string_view id;
    std::string_view name;
    // For `entry`: the name was created, deleted or renamed (a rotation replaced the file),
    // not only written to.
    bool replaced = false;
};

class InotifyDispatcher {
public:
    InotifyDispatcher();

    int fd() const { return inotify_.get(); }
    // Watches `dir` for container `id`. Returns the watch descriptor, or -1 with errno set.
    int watch(const std::string& dir, const std::string& id);
    // `id` no longer needs watch `wd`; the watch goes when no container needs it.
    void unwatch(int wd, const std::string& id);
    // Reads every queued event and hands each, per container it concerns, to `on_event`.
    // Returns whether any event was read. `on_event` must not call watch() or unwatch().
    bool drain(const std::function<void(const DirEvent&)>& on_event);

private:
    reaper::detail::UniqueFd inotify_;
    std::map<int, std::vector<std::string>> by_wd_;
};

}  // namespace reaperd::logcap
