#include "logcap_records.hpp"

#include <stdexcept>
#include <utility>

namespace reaperd::logcap {

std::vector<LogField> container_fields(const RecordSubject& subject, std::string_view action) {
    return {{"CONTAINER_ID", std::string(subject.id)},
            {"CONTAINER_NAME", std::string(subject.name)},
            {"SESSION_ID", std::string(subject.session)},
            {"ACTION", std::string(action)}};
}

std::string describe(const RecordSubject& subject) {
    return "container " + std::string(subject.name) + " (" + std::string(subject.id.substr(0, 12)) + ")";
}

bool CutCoalescer::note(const Cut& cut, TimePoint now, std::chrono::milliseconds window) {
    ++cuts_;
    dropped_bytes_ += cut.dropped_bytes;
    last_ = cut;
    return !last_record_ || now - *last_record_ >= window;
}

std::optional<TimePoint> CutCoalescer::due_at(std::chrono::milliseconds window) const {
    if (cuts_ == 0) return std::nullopt;
    return *last_record_ + window;
}

void CutCoalescer::flush(const LogSink& sink, const RecordSubject& subject, std::uint64_t cap_bytes,
                         std::uint64_t total_budget_bytes, TimePoint now) {
    if (cuts_ == 0) return;
    auto fields = container_fields(subject, "truncate");
    fields.push_back({"LOG_BYTES_BEFORE", std::to_string(last_.before_bytes)});
    fields.push_back({"LOG_BYTES_AFTER", std::to_string(last_.after_bytes)});
    fields.push_back({"LOG_BYTES_DROPPED", std::to_string(dropped_bytes_)});
    fields.push_back({"LOG_MAX_SIZE", std::to_string(cap_bytes)});
    fields.push_back({"REASON", std::string(to_string(last_.reason))});
    fields.push_back({"ACTION_COUNT", std::to_string(cuts_)});
    fields.push_back({"CUT_METHOD", last_.method ? std::string(to_string(*last_.method)) : "none"});
    fields.push_back({"LOG_BYTES_KEPT", std::to_string(last_.kept_bytes)});
    std::string what = cuts_ == 1 ? "from " + format_size(last_.before_bytes) + " to " + format_size(last_.after_bytes)
                                  : std::to_string(cuts_) + " times, dropping " + format_size(dropped_bytes_) +
                                        " (last from " + format_size(last_.before_bytes) + " to " +
                                        format_size(last_.after_bytes) + ")";
    std::string how;
    if (!last_.method) {
        how = "; deleted its oldest rotations";
    } else if (*last_.method == CutMethod::punch_hole) {
        how = "; punched out the oldest part, keeping the newest " + format_size(last_.kept_bytes);
        // Docker 23+'s plain read stops at the hole (moby issue 53631); its tail and follow
        // readers start from the end, and the offsets they hold are still valid. A tail of more
        // lines than were kept reads the whole hole first (~3 s of a core per GiB), then shows
        // nothing; a follower that lags into the hole (behind a runaway within ~30 ms) ends.
        if (!std::exchange(told_how_to_read_, true))
            how += " (read all that was kept with `reaperctl logs " + std::string(subject.id.substr(0, 12)) +
                   "`, and follow it past later cuts with `-f`; `docker logs --tail N` reads fewer lines "
                   "than were kept, and `docker logs -f` goes on unless it falls behind by more than was "
                   "kept, which ends it on Docker 23+; a plain `docker logs` on Docker 23+, or of a local "
                   "log on any Docker, stops at the hole and shows nothing)";
    } else {
        how = "; truncated it to 0";
    }
    sink(Priority::notice, message_id::log_capped,
         "cut the log of " + describe(subject) + " " + what +
             (last_.reason == CapReason::own_cap ? ", cap " + format_size(cap_bytes)
                                                 : ", over the total budget " + format_size(total_budget_bytes)) +
             how,
         std::move(fields));
    cuts_ = 0;
    dropped_bytes_ = 0;
    last_record_ = now;
}

// A switch, not a search: a new LogAction does not build warning-free (-Wswitch) until it is
// given its engine act here or is, like truncate, none.
const EngineAction& engine_action(LogAction action) {
    static constexpr EngineAction stop{LogAction::stop, ContainerAct::stop, "stopped"};
    static constexpr EngineAction kill{LogAction::kill, ContainerAct::kill, "killed"};
    static constexpr EngineAction remove{LogAction::remove, ContainerAct::remove, "removed"};
    switch (action) {
        case LogAction::stop: return stop;
        case LogAction::kill: return kill;
        case LogAction::remove: return remove;
        case LogAction::truncate: break;
    }
    throw std::logic_error("log action " + std::string(to_string(action)) + " is not an engine act");
}

}  // namespace reaperd::logcap
