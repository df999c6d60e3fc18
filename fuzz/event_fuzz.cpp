// One line of the engine's /events stream, as a broken or hostile engine (or a proxy cutting
// the stream) might send it. The promise: an Event or ProtocolError, nothing else; and an
// event's id, whatever it holds, cannot steer a request to another endpoint once it is put
// into a URL path.
#include "check.hpp"

#include <reaper/client.hpp>

#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string line = fuzz_text(data, size);
    reaper::Event event;
    try {
        event = reaper::parse_event_line(line);
    } catch (const reaper::ProtocolError&) {
        return 0;
    }
    const std::string segment = reaper::url_encode(event.id);
    FUZZ_CHECK(segment.find_first_of("/?#") == std::string::npos);
    return 0;
}
