#include "log.hpp"

#include "reaper/units.hpp"

#include <systemd/sd-journal.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace reaperd {

namespace {

enum class Target { journal, stderr_lines };

const char* priority_name(Priority p) {
    switch (p) {
        case Priority::err: return "error";
        case Priority::warning: return "warning";
        case Priority::notice: return "notice";
        case Priority::info: return "info";
        case Priority::debug: return "debug";
    }
    return "info";
}

// systemd sets JOURNAL_STREAM to "<dev>:<inode>" of the stream it connected to stdout and
// stderr. It is inherited by children whose stderr was redirected elsewhere, so it only
// counts when it still names our stderr.
bool stderr_is_journal_stream() {
    const char* stream = std::getenv("JOURNAL_STREAM");
    if (stream == nullptr) return false;
    unsigned long long dev = 0, ino = 0;
    if (std::sscanf(stream, "%llu:%llu", &dev, &ino) != 2) return false;
    struct stat st {};
    if (fstat(STDERR_FILENO, &st) != 0) return false;
    return static_cast<unsigned long long>(st.st_dev) == dev &&
           static_cast<unsigned long long>(st.st_ino) == ino;
}

// REAPERD_LOG_TARGET=journal|stderr overrides the detection (for tests and for users who
// want plain lines from a service). Otherwise: the journal when systemd connected our
// stderr to it, or when journald's socket is there and we are not run from a terminal
// (a user at a terminal wants to see the lines).
Target detect_target() {
    if (const char* forced = std::getenv("REAPERD_LOG_TARGET")) {
        if (std::strcmp(forced, "journal") == 0) return Target::journal;
        if (std::strcmp(forced, "stderr") == 0) return Target::stderr_lines;
    }
    if (stderr_is_journal_stream()) return Target::journal;
    if (std::getenv("JOURNAL_STREAM") != nullptr) return Target::stderr_lines;
    if (isatty(STDERR_FILENO)) return Target::stderr_lines;
    struct stat st {};
    if (stat("/run/systemd/journal/socket", &st) == 0 && S_ISSOCK(st.st_mode)) return Target::journal;
    return Target::stderr_lines;
}

Target target() {
    static const Target chosen = detect_target();
    return chosen;
}

// Journal field names are upper-case letters, digits and '_', not starting with '_'
// (those are trusted fields journald sets itself) nor a digit, at most 64 characters.
std::string journal_field_name(const std::string& name) {
    std::string out;
    for (char c : name) {
        if (c >= 'a' && c <= 'z') out += static_cast<char>(c - 'a' + 'A');
        else if ((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) out += c;
        else out += '_';
    }
    while (!out.empty() && (out.front() == '_' || (out.front() >= '0' && out.front() <= '9')))
        out.erase(out.begin());
    if (out.size() > 64) out.resize(64);
    return out.empty() ? "FIELD" : out;
}

// Keeps a record on one line that no value can forge or use to drive a terminal: newline, tab
// and CR as \n, \t and \r, other control characters and bytes that are not UTF-8 as \xNN
// (reaper::terminal_safe); a value with spaces, quotes or '=' is quoted, so `key=value` pairs
// can be split back apart.
std::string escaped(std::string_view text, bool quote_if_needed) {
    bool needs_quotes = false;
    std::string out;
    for (char c : text) {
        switch (c) {
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            case '\\': out += "\\\\"; break;
            case '"':
                out += quote_if_needed ? "\\\"" : "\"";
                needs_quotes = true;
                break;
            case ' ':
            case '=':
                out += c;
                needs_quotes = true;
                break;
            default: out += c;
        }
    }
    // The escapes above are ASCII, so terminal_safe sees every character whole.
    out = reaper::terminal_safe(out);
    if (quote_if_needed && (needs_quotes || out.empty())) return "\"" + out + "\"";
    return out;
}

std::mutex stderr_mutex;

void write_stderr_line(Priority priority, std::string_view message_id, std::string_view message,
                       const std::vector<LogField>& fields) {
    // "<N>" first: when this stream does end up in journald (e.g. JOURNAL_STREAM forced
    // off), it still takes the priority from it.
    std::string line = "<";
    line += std::to_string(static_cast<int>(priority));
    line += ">";
    line += priority_name(priority);
    line += ": ";
    line += escaped(message, false);
    for (const auto& f : fields) {
        line += ' ';
        line += f.name;
        line += '=';
        line += escaped(f.value, true);
    }
    if (!message_id.empty()) {
        line += " MESSAGE_ID=";
        line += message_id;
    }
    line += '\n';
    std::lock_guard lock(stderr_mutex);
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
}

// sd_journal_sendv takes "NAME=value" items; values may hold newlines or any bytes.
bool send_to_journal(Priority priority, std::string_view message_id, std::string_view message,
                     const std::vector<LogField>& fields) {
    std::vector<std::string> items;
    items.reserve(fields.size() + 4);
    items.push_back("MESSAGE=" + std::string(message));
    items.push_back("PRIORITY=" + std::to_string(static_cast<int>(priority)));
    items.push_back("SYSLOG_IDENTIFIER=reaperd");
    if (!message_id.empty()) items.push_back("MESSAGE_ID=" + std::string(message_id));
    for (const auto& f : fields) items.push_back(journal_field_name(f.name) + "=" + f.value);
    std::vector<iovec> iov(items.size());
    for (std::size_t i = 0; i < items.size(); ++i) {
        iov[i].iov_base = items[i].data();
        iov[i].iov_len = items[i].size();
    }
    return sd_journal_sendv(iov.data(), static_cast<int>(iov.size())) >= 0;
}

}  // namespace

void log(Priority priority, std::string_view message_id, std::string_view message,
         std::vector<LogField> fields) {
    try {
        // A journald that went away must not silence the daemon: fall back to stderr.
        if (target() == Target::journal && send_to_journal(priority, message_id, message, fields))
            return;
        write_stderr_line(priority, message_id, message, fields);
    } catch (...) {
        // Logging must never take the daemon down; an allocation failure here loses one line.
    }
}

}  // namespace reaperd
