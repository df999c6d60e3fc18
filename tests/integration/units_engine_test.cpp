// The label reaperd.log-max-size against the engine it imitates: the private dockerd rotates
// a json-file log under `--log-opt max-size=1k` exactly where reaper::parse_docker_size("1k")
// (and so the label "1k") says the cap is: 1000 bytes, decimal. Had Docker read it as 1024,
// the rotated file would hold one record more than the check allows.
#include "engine.hpp"
#include "logcap/logcap_policy.hpp"

#include <reaper/client.hpp>
#include <reaper/units.hpp>

#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

using reaper::test::engine;
using reaper::test::unique_name;
using namespace std::chrono_literals;

BOOST_AUTO_TEST_CASE(the_log_max_size_label_caps_where_docker_max_size_does) {
    const std::string max_size = "1k";
    const std::uint64_t cap = reaper::parse_docker_size(max_size);
    BOOST_TEST(cap == 1000u);
    BOOST_TEST(reaperd::logcap::resolve_cap({{reaperd::logcap::max_size_label, max_size}}, 1u << 30).cap_bytes == cap);

    reaper::Client client{engine().client_options()};
    reaper::ContainerSpec spec;
    spec.name = unique_name("units");
    spec.image = reaper::test::PrivateEngine::image;
    // Records of 145 bytes (74 characters, the json-file envelope, a 30-byte timestamp):
    // 7 of them are 1015 bytes, past a 1000-byte cap but under a 1024-byte one, so the first
    // rotation tells the two readings apart (measured here: rotated at 1015 bytes, 7 records,
    // in each of 2 runs). 10 records make exactly one rotation either way.
    spec.cmd = {"sh", "-c",
                "i=0; while [ $i -lt 10 ]; do "
                "echo 01234567890123456789012345678901234567890123456789012345678901234567890123; "
                "i=$((i+1)); done; exec sleep 600"};
    spec.labels = {{"reaper.test", "units"}};
    spec.log_config.type = "json-file";
    spec.log_config.options = {{"max-size", max_size}, {"max-file", "2"}};
    const std::string id = client.create(spec);
    struct Cleanup {
        reaper::Client& client;
        std::string id;
        ~Cleanup() {
            try {
                client.remove(id, {true, true});
            } catch (const std::exception&) {
            }
        }
    } cleanup{client, id};
    client.start(id);
    const std::string rotated = client.inspect(id).log_path + ".1";

    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (!std::filesystem::exists(rotated) && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(50ms);
    BOOST_TEST_REQUIRE(std::filesystem::exists(rotated));
    std::this_thread::sleep_for(500ms);  // the last records reach the live file, not this one

    std::ifstream in(rotated, std::ios::binary);
    std::vector<std::string> records;
    for (std::string line; std::getline(in, line);)
        records.push_back(line + "\n");
    BOOST_TEST_REQUIRE(!records.empty());
    std::uint64_t size = 0;
    for (const auto& r : records)
        size += r.size();
    const std::uint64_t last = records.back().size();
    BOOST_TEST_MESSAGE("rotated at " << size << " bytes, " << records.size() << " records of about "
                                     << last << " bytes");
    // moby's LogFile rotates before a write once the file holds >= capacity bytes: the
    // rotated file reached the cap only with its last record.
    BOOST_TEST(size >= cap);
    BOOST_TEST(size - last < cap);
}
