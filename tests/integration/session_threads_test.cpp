// Many Sessions in the threads of one process, against a real private engine.
#include <reaper/session.hpp>

#include "engine.hpp"
#include "session_fixture.hpp"

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <thread>

using namespace reaper;
using namespace session_itest;
using namespace std::chrono_literals;

// 50 sessions from 8 threads, every other one failing on purpose (its container exits at
// once): afterwards no fd leaked and no container of these sessions is left.
BOOST_FIXTURE_TEST_CASE(fifty_sessions_eight_threads, Fixture) {
    auto o = options();
    o.use_daemon = true;  // unreachable on purpose: the failed connects must not leak either
    o.control_socket = test::engine().dir() + "/no-reaperd.sock";
    o.log = {};
    {
        Session warm_up(o);
        warm_up.create(sleeper());
    }
    const auto baseline = test::open_fd_count();

    constexpr int total = 50, threads = 8;
    std::atomic<int> next{0}, opened{0}, failed{0}, unexpected{0};
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t)
        workers.emplace_back([&] {
            for (int i = next++; i < total; i = next++) {
                auto spec = sleeper();
                if (i % 2) spec.cmd = {"sh", "-c", "exit 1"};
                try {
                    Session session(o);
                    try {
                        session.create(spec);
                        ++opened;
                    } catch (const NotReady&) {
                        ++failed;
                    }
                } catch (...) {
                    ++unexpected;
                }
            }
        });
    for (auto& w : workers) w.join();
    BOOST_TEST(opened == total / 2);
    BOOST_TEST(failed == total / 2);
    BOOST_TEST(unexpected == 0);
    BOOST_TEST(record->close_calls == total + 1);

    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (test::open_fd_count() != baseline && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(50ms);
    BOOST_TEST(test::open_fd_count() == baseline);

    ListOptions list;
    list.all = true;
    list.filters["label"] = {label_key};
    BOOST_TEST(observer.list_containers(list).empty());
}
