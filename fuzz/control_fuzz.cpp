// One line on the control socket, from a confused or hostile client (requests) or a broken
// daemon (replies). The promise: a Request/Reply or ProtocolViolation, nothing else; every
// accepted request encodes and parses back to itself; every reply the daemon builds parses.
#include "check.hpp"

#include <reaper/control.hpp>

#include <string_view>

namespace {

std::string_view without_newline(const std::string& line) {
    FUZZ_CHECK(!line.empty() && line.back() == '\n');
    FUZZ_CHECK(line.find('\n') == line.size() - 1);
    return std::string_view(line).substr(0, line.size() - 1);
}

void request(const std::string& line) {
    reaper::control::Request parsed;
    try {
        parsed = reaper::control::parse_request(line);
    } catch (const reaper::control::ProtocolViolation&) {
        return;
    }
    const std::string encoded = reaper::control::encode_request(parsed);
    const auto again = reaper::control::parse_request(without_newline(encoded));
    FUZZ_CHECK(again.op == parsed.op);
    FUZZ_CHECK(again.session == parsed.session);
    FUZZ_CHECK(again.container == parsed.container);
    FUZZ_CHECK(again.proxy == parsed.proxy);
    FUZZ_CHECK(again.labelled == parsed.labelled);
}

// Whatever a reply says, what parses encodes to one line that parses back to the same fields.
void reply(const std::string& line) {
    reaper::control::Reply parsed;
    try {
        parsed = reaper::control::parse_reply(line);
    } catch (const reaper::control::ProtocolViolation&) {
        return;
    }
    const auto again = reaper::control::parse_reply(without_newline(reaper::control::encode_reply(parsed)));
    FUZZ_CHECK(again.ok == parsed.ok);
    FUZZ_CHECK(again.owned == parsed.owned);
    FUZZ_CHECK(again.queued == parsed.queued);
    FUZZ_CHECK(again.known == parsed.known);
    FUZZ_CHECK(again.ready == parsed.ready);
    FUZZ_CHECK(again.reaps_queued == parsed.reaps_queued);
    FUZZ_CHECK(again.remaining == parsed.remaining);
}

// The daemon quotes client input in its error replies; whatever that input was, the reply
// must stay one parseable line.
void error_reply(const std::string& message) {
    const auto parsed = reaper::control::parse_reply(without_newline(reaper::control::encode_error(message)));
    FUZZ_CHECK(!parsed.ok);
    FUZZ_CHECK(!parsed.error.empty() || message.empty());
}

void status_reply(const std::string& status_json) {
    std::string encoded;
    try {
        encoded = reaper::control::encode_status_reply(status_json);
    } catch (const reaper::control::ProtocolViolation&) {
        return;
    }
    const auto parsed = reaper::control::parse_reply(without_newline(encoded));
    FUZZ_CHECK(parsed.ok);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string line = fuzz_text(data, size);
    request(line);
    reply(line);
    error_reply(line);
    status_reply(line);
    return 0;
}
