// The state file after a crash, a full disk or a hand edit. The promise: a PersistedState or
// StateCorrupt (the daemon then sets the file aside), nothing else; and what encode_state
// writes decodes to the same state.
#include "check.hpp"

#include "state.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string text = fuzz_text(data, size);
    reaperd::PersistedState state;
    try {
        state = reaperd::decode_state(text);
    } catch (const reaperd::StateCorrupt&) {
        return 0;
    }
    const std::string encoded = reaperd::encode_state(state);
    FUZZ_CHECK(reaperd::encode_state(reaperd::decode_state(encoded)) == encoded);
    return 0;
}
