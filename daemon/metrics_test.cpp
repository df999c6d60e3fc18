#include "metrics.hpp"

#include <boost/test/unit_test.hpp>

using namespace reaperd;

BOOST_AUTO_TEST_CASE(renders_every_metric_in_prometheus_text_format) {
    Metrics m;
    m.reap_done();
    m.reap_done();
    m.reap_failed();
    m.engine_reconnect();
    m.action("reap");
    m.action("reap");
    m.action("end_session");
    Gauges g;
    g.tracked_containers = 12;
    g.sessions_by_state = {{"leased", 3}, {"ended", 1}};
    g.pending_reaps = 1;
    g.engine_up = true;
    g.log_bytes_dropped = 4096;
    g.log_actions = {{"truncate", 5}, {"reap", 1}};
    std::string text = m.render(g);
    for (const char* line : {
             "# TYPE reaperd_tracked_containers gauge\n",
             "reaperd_tracked_containers 12\n",
             "reaperd_sessions{state=\"leased\"} 3\n",
             "reaperd_sessions{state=\"grace\"} 0\n",
             "reaperd_sessions{state=\"ended\"} 1\n",
             "reaperd_sessions{state=\"unclaimed\"} 0\n",
             "reaperd_pending_reaps 1\n",
             "reaperd_engine_up 1\n",
             "# TYPE reaperd_reaps_done_total counter\n",
             "reaperd_reaps_done_total 2\n",
             "reaperd_reaps_failed_total 1\n",
             "reaperd_log_bytes_dropped_total 4096\n",
             "reaperd_actions_total{action=\"reap\"} 3\n",
             "reaperd_actions_total{action=\"end_session\"} 1\n",
             "reaperd_actions_total{action=\"truncate\"} 5\n",
             "reaperd_engine_reconnects_total 1\n",
         })
        BOOST_TEST(text.find(line) != std::string::npos, line);
    BOOST_TEST(text.back() == '\n');
}

BOOST_AUTO_TEST_CASE(action_label_values_are_escaped) {
    Metrics m;
    m.action("a\"b\\c\nd");
    std::string text = m.render({});
    BOOST_TEST(text.find("reaperd_actions_total{action=\"a\\\"b\\\\c\\nd\"} 1\n") != std::string::npos);
}
