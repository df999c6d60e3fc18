#include "reaperctl_format.hpp"

#include "reaper/units.hpp"

#include <Poco/Dynamic/Var.h>
#include <Poco/Exception.h>
#include <Poco/JSON/Array.h>
#include <Poco/JSON/Object.h>
#include <Poco/JSON/ParseHandler.h>
#include <Poco/JSON/Parser.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace reaperctl {

namespace {

using Poco::Dynamic::Var;
using Poco::JSON::Array;
using Poco::JSON::Object;

bool is_object(const Var& value) { return value.type() == typeid(Object::Ptr); }
bool is_array(const Var& value) { return value.type() == typeid(Array::Ptr); }

std::string label(const std::string& key) {
    std::string out = key;
    std::replace(out.begin(), out.end(), '_', ' ');
    return out;
}

// Columns a terminal gives text that reaper::terminal_safe made: one per code point (wide
// characters aside), so a name such as "sessiön" keeps its column aligned.
std::size_t columns_of(std::string_view text) {
    return static_cast<std::size_t>(
        std::count_if(text.begin(), text.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xc0) != 0x80; }));
}

// A table cell past this many columns is cut, so that one label value of the engine's (a
// session id may be any length) cannot pad every row of its column; 64-hex container ids fit.
constexpr std::size_t max_cell_columns = 80;

std::string scalar_text(const Var& value) {
    if (value.isEmpty()) return "-";
    if (is_object(value)) {
        std::ostringstream out;
        value.extract<Object::Ptr>()->stringify(out);
        return out.str();
    }
    if (is_array(value)) {
        std::ostringstream out;
        value.extract<Array::Ptr>()->stringify(out);
        return out.str();
    }
    if (value.isBoolean()) return value.extract<bool>() ? "yes" : "no";
    const auto text = value.convert<std::string>();
    return text.empty() ? "\"\"" : reaper::terminal_safe(text);
}

// Cuts `cell` to max_cell_columns, ending it with "..."; true if it did.
bool cut_cell(std::string& cell) {
    if (columns_of(cell) <= max_cell_columns) return false;
    std::size_t kept = 0;
    std::size_t end = 0;
    while (end < cell.size() && kept < max_cell_columns - 3) {
        ++end;
        while (end < cell.size() && (static_cast<unsigned char>(cell[end]) & 0xc0) == 0x80)
            ++end;
        ++kept;
    }
    cell.resize(end);
    cell += "...";
    return true;
}

bool all_objects(const Array& array) {
    for (std::size_t i = 0; i < array.size(); ++i) {
        if (!is_object(array.get(i))) return false;
    }
    return array.size() > 0;
}

void render_table(const Array& rows, const std::string& indent, std::ostringstream& out) {
    std::vector<std::string> columns;
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const auto row = rows.getObject(static_cast<unsigned>(i));
        for (const auto& key : row->getNames()) {
            if (std::find(columns.begin(), columns.end(), key) == columns.end()) columns.push_back(key);
        }
    }
    std::vector<std::vector<std::string>> cells;
    std::vector<std::size_t> widths;
    std::vector<std::string> header;
    for (const auto& column : columns) {
        std::string name = label(column);
        std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) {
            return static_cast<char>(std::toupper(c));
        });
        header.push_back(name);
        widths.push_back(columns_of(name));
    }
    std::size_t cut = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const auto row = rows.getObject(static_cast<unsigned>(i));
        std::vector<std::string> line;
        for (std::size_t c = 0; c < columns.size(); ++c) {
            line.push_back(row->has(columns[c]) ? scalar_text(row->get(columns[c])) : "-");
            if (cut_cell(line.back())) ++cut;
            widths[c] = std::max(widths[c], columns_of(line.back()));
        }
        cells.push_back(std::move(line));
    }
    const auto print_row = [&](const std::vector<std::string>& line) {
        std::string text = indent;
        for (std::size_t c = 0; c < line.size(); ++c) {
            text += line[c];
            if (c + 1 < line.size()) text += std::string(widths[c] - columns_of(line[c]) + 2, ' ');
        }
        out << text << '\n';
    };
    print_row(header);
    for (const auto& line : cells) print_row(line);
    if (cut > 0) {
        out << indent << "(" << cut << (cut == 1 ? " cell" : " cells") << " cut at " << max_cell_columns
            << " characters; --json shows them whole)\n";
    }
}

void render_object(const Object& object, const std::string& indent, std::ostringstream& out) {
    // getNames() keeps the daemon's order; iterating the object would sort the keys.
    for (const auto& key : object.getNames()) {
        const auto value = object.get(key);
        if (is_object(value)) {
            const auto child = value.extract<Object::Ptr>();
            if (child->size() == 0) {
                out << indent << label(key) << ": none\n";
                continue;
            }
            out << indent << label(key) << ":\n";
            render_object(*child, indent + "  ", out);
        } else if (is_array(value)) {
            const auto array = value.extract<Array::Ptr>();
            if (array->size() == 0) {
                out << indent << label(key) << ": none\n";
            } else if (all_objects(*array)) {
                out << indent << label(key) << " (" << array->size() << "):\n";
                render_table(*array, indent + "  ", out);
            } else {
                out << indent << label(key) << ": ";
                for (std::size_t i = 0; i < array->size(); ++i) {
                    out << (i ? ", " : "") << scalar_text(array->get(static_cast<unsigned>(i)));
                }
                out << '\n';
            }
        } else {
            out << indent << label(key) << ": " << scalar_text(value) << '\n';
        }
    }
}

std::string counted(std::uint64_t n, const std::string& kinds) {
    std::string word = kinds;
    if (n == 1 && word.size() > 1 && word.back() == 's') word.pop_back();
    return std::to_string(n) + " " + word;
}

}  // namespace

std::string format_counts(const reaper::control::KindCounts& counts) {
    std::string text;
    for (const auto& [kind, n] : counts) {
        if (n == 0) continue;
        text += (text.empty() ? "" : ", ") + counted(n, kind);
    }
    return text.empty() ? "nothing" : text;
}

std::string format_end_reply(const std::string& session, const reaper::control::Reply& reply) {
    std::string text = "session " + session;
    if (!reply.known) return text + " ended";  // an older daemon says no more
    if (reply.already_ended.value_or(false)) {
        text += " had already ended";
    } else if (!*reply.known) {
        text += " ended (reaperd knew nothing of it; what is made under it later is reaped)";
        return text;
    } else {
        text += " ended";
    }
    if (reply.dry_run.value_or(false)) return text + "; dry run: reaperd removes nothing";
    if (reply.reaps_queued) {
        const auto queued = format_counts(*reply.reaps_queued);
        text += queued == "nothing" ? "; nothing to reap" : "; " + queued + " queued for reaping";
    }
    return text;
}

std::string format_orphan_reply(const std::string& reference, const reaper::control::Reply& reply) {
    if (reply.container.empty()) return "orphan report for " + reaper::terminal_safe(reference) + " accepted";
    const auto container = reaper::terminal_safe(reply.container);
    std::string text = "container ";
    text += reply.name.empty() ? container : reaper::terminal_safe(reply.name) + " (" + container + ")";
    if (!reply.session.empty()) text += " of session " + reaper::terminal_safe(reply.session);
    if (reply.dry_run.value_or(false)) return text + ": dry run: would reap it";
    if (!reply.queued.value_or(false)) return text + ": not queued";
    text += ": queued for reaping";
    if (!reply.owned) text += " (the engine did not answer; its label is checked before any removal)";
    return text;
}

std::string format_status(std::string_view status_json) {
    Var parsed;
    try {
        Poco::JSON::Parser parser(new Poco::JSON::ParseHandler(true));
        parsed = parser.parse(std::string(status_json));
    } catch (const Poco::Exception& e) {
        throw std::invalid_argument("status is not valid JSON: " + e.message());
    }
    if (!is_object(parsed)) throw std::invalid_argument("status is not a JSON object");
    std::ostringstream out;
    render_object(*parsed.extract<Object::Ptr>(), "", out);
    return out.str();
}

}  // namespace reaperctl
