// A session-template file as a test author might get it wrong. The promise: a library of
// templates or a TemplateError naming the place, nothing else.
#include "check.hpp"

#include <reaper/template.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string text = fuzz_text(data, size);
    try {
        const auto library = reaper::TemplateLibrary::parse(text, "fuzz.yaml");
        for (const auto& name : library.names()) FUZZ_CHECK(!library.get(name).spec.image.empty());
    } catch (const reaper::TemplateError& e) {
        FUZZ_CHECK(*e.what() != '\0');
    }
    return 0;
}
