// reaperd.yaml as an admin might mistype it. The promise: a Config or a ConfigError listing
// located problems, nothing else; and every accepted config survives format_config and
// parsing back unchanged (what --check-config shows is what the daemon runs).
#include "check.hpp"

#include "config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string text = fuzz_text(data, size);
    reaperd::Config config;
    try {
        config = reaperd::parse_config(text, "fuzz.yaml");
    } catch (const reaperd::ConfigError& e) {
        FUZZ_CHECK(!e.problems().empty());
        FUZZ_CHECK(*e.what() != '\0');
        return 0;
    }
    const std::string formatted = reaperd::format_config(config);
    FUZZ_CHECK(reaperd::parse_config(formatted, "formatted.yaml") == config);
    return 0;
}
