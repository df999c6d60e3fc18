#include "vocabulary.hpp"

#include <boost/test/unit_test.hpp>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

using namespace reaperd;

namespace {

// Every row names a distinct value and a distinct, non-empty name; the rows are the values
// 0..N-1 (enumerators without initializers), so no value lacks its row; each name reads
// back as its value, and what no row names reads as nothing.
template <class Enum, std::size_t N, class ToString, class FromString>
void check_table(const std::array<Named<Enum>, N>& table, ToString to_name, FromString from_name) {
    std::set<int> values;
    std::set<std::string_view> names;
    for (const auto& row : table) {
        BOOST_TEST(!row.name.empty());
        BOOST_TEST(names.insert(row.name).second, "two rows name " << row.name);
        BOOST_TEST(values.insert(static_cast<int>(row.value)).second, row.name << "'s value has another row");
        BOOST_TEST(to_name(row.value) == row.name);
        BOOST_TEST((from_name(row.name) == std::optional<Enum>(row.value)), row.name);
    }
    for (std::size_t i = 0; i < N; ++i) BOOST_TEST(values.count(static_cast<int>(i)) == 1u, "value " << i);
    BOOST_TEST(!from_name("").has_value());
    BOOST_TEST(!from_name("no-such-name").has_value());
}

std::string read(const std::string& relative) {
    std::ifstream in(std::string(REAPER_SOURCE_DIR) + "/" + relative);
    BOOST_REQUIRE_MESSAGE(in, "cannot read " << relative);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

// The line of `text` that starts with `start` (a markdown table row).
std::string row_of(const std::string& text, const std::string& start) {
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);)
        if (line.rfind(start, 0) == 0) return line;
    BOOST_FAIL("no line starts with " << start);
    return {};
}

// The `quoted` words of a markdown line, after its first cell.
std::set<std::string> quoted(const std::string& line) {
    std::set<std::string> words;
    const std::string rest = line.substr(line.find('|', 1));
    for (auto open = rest.find('`'); open != std::string::npos;) {
        const auto close = rest.find('`', open + 1);
        if (close == std::string::npos) break;
        if (close == open + 1) {  // `` quotes nothing; its second mark may open a word
            open = close;
            continue;
        }
        words.insert(rest.substr(open + 1, close - open - 1));
        open = rest.find('`', close + 1);
    }
    return words;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_value_has_exactly_one_name_and_names_round_trip) {
    check_table(end_reason_names, [](EndReason r) { return to_string(r); }, end_reason_from_string);
    check_table(reap_reason_names, [](ReapReason r) { return to_string(r); }, reap_reason_from_string);
    check_table(log_action_names, [](LogAction a) { return to_string(a); }, log_action_from_string);
    check_table(logcap::cap_reason_names, [](logcap::CapReason r) { return logcap::to_string(r); },
                logcap::cap_reason_from_string);
    check_table(logcap::cut_method_names, [](logcap::CutMethod m) { return logcap::to_string(m); },
                logcap::cut_method_from_string);
}

// The names users filter on (REASON=, the metric labels, status, the state file) are those
// of reaperd before the vocabularies were types: old state files load, dashboards keep working.
BOOST_AUTO_TEST_CASE(names_are_the_ones_already_published) {
    BOOST_TEST(to_string(EndReason::end) == "end");
    BOOST_TEST(to_string(EndReason::lease_expired) == "lease_expired");
    BOOST_TEST(to_string(EndReason::unclaimed) == "unclaimed");
    BOOST_TEST(to_string(ReapReason::session_ended) == "session_ended");
    BOOST_TEST(to_string(ReapReason::max_age) == "max_age");
    BOOST_TEST(to_string(ReapReason::orphan) == "orphan");
    BOOST_TEST(logcap::to_string(logcap::CapReason::own_cap) == "max_size");
    BOOST_TEST(logcap::to_string(logcap::CapReason::total_budget) == "total_max_size");
    BOOST_TEST(to_string(LogAction::truncate) == "truncate");
}

BOOST_AUTO_TEST_CASE(the_door_names_a_reap_or_a_cap_reason_and_none) {
    BOOST_TEST(to_string(ActReason{ReapReason::orphan}) == "orphan");
    BOOST_TEST(to_string(ActReason{logcap::CapReason::total_budget}) == "total_max_size");
    BOOST_TEST(to_string(ActReason{}).empty());
}

// One spelling for every dry run (it was would_reap in the loop, would-remove at the door
// and would-truncate in the log capper).
BOOST_AUTO_TEST_CASE(a_dry_run_action_is_would_underscore_the_action) {
    BOOST_TEST(dry_run_action("reap") == "would_reap");
    BOOST_TEST(dry_run_action(to_string(LogAction::truncate)) == "would_truncate");
}

// docs/systemd.md's REASON row lists exactly the reason names, its ACTION row every log
// action and its dry-run form; README's metric rows name every end reason and log action;
// no doc spells a dry run the old way.
BOOST_AUTO_TEST_CASE(the_docs_list_the_tables_names) {
    const std::string systemd_md = read("docs/systemd.md");
    const std::string readme = read("README.md");

    std::set<std::string> reasons;
    for (const auto& row : end_reason_names) reasons.emplace(row.name);
    for (const auto& row : reap_reason_names) reasons.emplace(row.name);
    for (const auto& row : logcap::cap_reason_names) reasons.emplace(row.name);
    const auto documented_reasons = quoted(row_of(systemd_md, "| `REASON` |"));
    BOOST_TEST(documented_reasons == reasons, boost::test_tools::per_element());

    const auto actions = quoted(row_of(systemd_md, "| `ACTION` |"));
    BOOST_TEST(actions.count(dry_run_action("reap")) == 1u);
    for (const auto& row : log_action_names) {
        BOOST_TEST(actions.count(std::string(row.name)) == 1u, row.name);
        BOOST_TEST(actions.count(dry_run_action(row.name)) == 1u, dry_run_action(row.name));
    }
    for (const auto& action : actions) {
        if (action.rfind("would", 0) != 0) continue;
        const std::string rest = action.substr(dry_run_prefix.size());
        BOOST_TEST((action.rfind(dry_run_prefix, 0) == 0 && (rest == "reap" || log_action_from_string(rest))),
                   action);
    }

    const auto ended = quoted(row_of(readme, "| `reaperd_sessions_ended_total{reason}` |"));
    for (const auto& row : end_reason_names) BOOST_TEST(ended.count(std::string(row.name)) == 1u, row.name);
    const auto counted = quoted(row_of(readme, "| `reaperd_actions_total{action}` |"));
    for (const auto& row : log_action_names) BOOST_TEST(counted.count(std::string(row.name)) == 1u, row.name);
    BOOST_TEST(counted.count(dry_run_action("reap")) == 1u);

    for (const auto* doc : {&systemd_md, &readme}) BOOST_TEST(doc->find("`would-") == std::string::npos);
}
