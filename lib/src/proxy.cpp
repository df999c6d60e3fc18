// The labelling engine proxy (reaper/proxy.hpp).
//
// A raw-bytes relay: heads are parsed here, bodies and hijacked streams are copied as bytes.
// Poco's HTTPServer does not fit a pass-through that must hijack: its MessageHeader caps a
// field value at 8192 bytes, while `docker build` sends every registry credential in one
// base64 X-Registry-Config header (the engine's Go server takes heads up to 1 MiB); the bytes
// that follow a hijacked head sit in its session buffer; and it re-frames what it forwards.
// Poco parses and checks the JSON of the create bodies.
//
// Per tool connection, two threads: the request side (tool -> engine) reads a head, forwards
// it with its body, then waits for the answer's head before reading on (tools do not
// pipeline, and the answer says whether the connection stays HTTP or turns raw), watching the
// tool meanwhile so that a tool that leaves is noticed during a long wait or a quiet stream.
// The answer side (engine -> tool) reads each answer head, matches it with the oldest
// request sent, and relays the body as it arrives.
#include <reaper/proxy.hpp>

#include "errno_text.hpp"
#include "signals_blocked.hpp"
#include "unique_fd.hpp"
#include <reaper/control.hpp>
#include <reaper/log_rotation.hpp>

#include <Poco/JSON/Array.h>
#include <Poco/JSON/Object.h>
#include <Poco/JSON/Parser.h>
#include <Poco/Exception.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

namespace reaper {

namespace {

// The engine's Go server refuses heads over 1 MiB (http.DefaultMaxHeaderBytes); so do we.
constexpr std::size_t max_head_bytes = 1024 * 1024;
// One read of a relayed body or stream. Reads of a 100 MB `docker logs` averaged ~8 KB (what
// the engine had flushed by then), so a larger buffer would not fill; with this one the CLI
// read it at 0.91-0.99 of the direct rate (bench/proxy_bench.cpp).
constexpr std::size_t io_chunk = 64 * 1024;
// A create's answer is read into memory (as it is relayed) only to log the new object's id.
constexpr std::size_t max_captured_answer = 64 * 1024;
constexpr auto upstream_connect_timeout_ms = 5000;
// The proxy's own questions to the engine (GET /_ping, /info): dockerd answers /info in
// milliseconds; a create waits for them once per proxy.
constexpr std::chrono::milliseconds engine_question_timeout{10'000};

// ---- descriptors --------------------------------------------------------------------------

using detail::UniqueFd;

[[noreturn]] void throw_errno(const std::string& what) {
    throw std::system_error(errno, std::generic_category(), what);
}

using detail::AllSignalsBlocked;
using detail::errno_text;

// An eventfd to wake a thread that waits in poll().
class Wakeup {
public:
    Wakeup() : fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
        if (!fd_) throw_errno("eventfd");
    }
    void notify() noexcept {
        std::uint64_t one = 1;
        [[maybe_unused]] auto n = ::write(fd_.get(), &one, sizeof one);
    }
    void drain() noexcept {
        std::uint64_t count = 0;
        [[maybe_unused]] auto n = ::read(fd_.get(), &count, sizeof count);
    }
    int fd() const noexcept { return fd_.get(); }

private:
    UniqueFd fd_;
};

// A connection that ended or broke under the relay: the end of this connection, not an error
// worth more than a debug line.
class Broken : public std::runtime_error {
    using std::runtime_error::runtime_error;
};

void send_all(int fd, std::string_view data) {
    while (!data.empty()) {
        const auto n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            throw Broken("write: " + errno_text(errno));
        }
        data.remove_prefix(static_cast<std::size_t>(n));
    }
}

// ---- reading ------------------------------------------------------------------------------

// Buffered reads from one socket: heads are found in the buffer, bodies taken from it.
class Reader {
public:
    explicit Reader(int fd) : fd_(fd), buffer_(io_chunk) {}

    std::string_view buffered() const noexcept {
        return {buffer_.data() + begin_, end_ - begin_};
    }
    void consume(std::size_t n) noexcept {
        begin_ += n;
        if (begin_ == end_) begin_ = end_ = 0;
    }
    // Reads what the socket has (at least one byte) after what is buffered; false at EOF.
    bool fill() {
        if (end_ == buffer_.size()) {
            if (begin_ > 0) {
                std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
                end_ -= begin_;
                begin_ = 0;
            } else {
                buffer_.resize(buffer_.size() * 2);
            }
        }
        for (;;) {
            const auto n = ::recv(fd_, buffer_.data() + end_, buffer_.size() - end_, 0);
            if (n > 0) {
                end_ += static_cast<std::size_t>(n);
                return true;
            }
            if (n == 0) return false;
            if (errno == EINTR) continue;
            // A reset is how a peer that left mid-exchange usually shows up.
            if (errno == ECONNRESET || errno == EPIPE) return false;
            throw Broken("read: " + errno_text(errno));
        }
    }
    // The next head, up to and including its empty line. nullopt at EOF before its first
    // byte; throws HttpError past max_head_bytes and Broken at EOF inside it.
    std::optional<std::string> read_head();

private:
    int fd_;
    std::vector<char> buffer_;
    std::size_t begin_ = 0;
    std::size_t end_ = 0;
};

// A request the proxy answers itself: status and message.
struct HttpError {
    int status;
    std::string message;
};

std::optional<std::string> Reader::read_head() {
    std::size_t searched = 0;
    for (;;) {
        auto data = buffered();
        if (searched == 0) {
            // Empty lines before a head are skipped, as Go's server does before a request.
            std::size_t lead = 0;
            while (lead < data.size() && (data[lead] == '\r' || data[lead] == '\n')) ++lead;
            consume(lead);
            data = buffered();
        }
        // The head ends at its first empty line; Go's reader takes bare "\n" line ends too.
        for (auto i = std::max<std::size_t>(searched, 1); i < data.size(); ++i) {
            if (data[i] != '\n') continue;
            if (data[i - 1] == '\n' || (i >= 2 && data[i - 1] == '\r' && data[i - 2] == '\n')) {
                if (i + 1 > max_head_bytes) throw HttpError{431, "request head larger than 1 MiB"};
                std::string head(data.substr(0, i + 1));
                consume(i + 1);
                return head;
            }
        }
        searched = data.size();
        if (data.size() > max_head_bytes) throw HttpError{431, "request head larger than 1 MiB"};
        if (!fill()) {
            if (buffered().empty()) return std::nullopt;
            throw Broken("the peer closed the connection inside a head");
        }
    }
}

// ---- heads --------------------------------------------------------------------------------

bool iequals(std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return std::tolower(static_cast<unsigned char>(x)) ==
                      std::tolower(static_cast<unsigned char>(y));
           });
}

std::string_view trim(std::string_view text) {
    while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
    while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\r'))
        text.remove_suffix(1);
    return text;
}

struct Head {
    std::string first_line;
    std::vector<std::pair<std::string, std::string>> fields;

    std::vector<std::string_view> all(std::string_view name) const {
        std::vector<std::string_view> values;
        for (const auto& [n, v] : fields)
            if (iequals(n, name)) values.emplace_back(v);
        return values;
    }
    bool has(std::string_view name) const { return !all(name).empty(); }
};

Head parse_head(std::string_view text) {
    Head head;
    bool first = true;
    while (!text.empty()) {
        auto end = text.find('\n');
        auto line = text.substr(0, end);
        text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.empty()) break;
        if (first) {
            head.first_line = std::string(line);
            first = false;
            continue;
        }
        // Obsolete line folding is refused, as RFC 9112 section 5.2 allows and Go does.
        if (line.front() == ' ' || line.front() == '\t') throw HttpError{400, "folded header line"};
        const auto colon = line.find(':');
        if (colon == std::string_view::npos || colon == 0) throw HttpError{400, "malformed header line"};
        const auto name = line.substr(0, colon);
        if (name.find_first_of(" \t") != std::string_view::npos)
            throw HttpError{400, "malformed header name"};
        head.fields.emplace_back(std::string(name), std::string(trim(line.substr(colon + 1))));
    }
    return head;
}

// How a body is delimited (RFC 9112 section 6.3).
struct Framing {
    enum class Kind { None, Length, Chunked, UntilClose };
    Kind kind = Kind::None;
    std::uint64_t length = 0;
};

std::uint64_t parse_content_length(const Head& head) {
    std::optional<std::uint64_t> length;
    for (auto value : head.all("Content-Length")) {
        // "5, 5" from a joined list is one length; anything else ambiguous is refused.
        while (!value.empty()) {
            auto comma = value.find(',');
            auto item = trim(value.substr(0, comma));
            value.remove_prefix(comma == std::string_view::npos ? value.size() : comma + 1);
            std::uint64_t n = 0;
            auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), n);
            if (item.empty() || ec != std::errc{} || end != item.data() + item.size())
                throw HttpError{400, "invalid Content-Length"};
            if (length && *length != n) throw HttpError{400, "conflicting Content-Length values"};
            length = n;
        }
    }
    return length.value_or(0);
}

// Whether an answer's Transfer-Encoding ends in chunked; other codings are not ours to decode.
std::optional<bool> transfer_chunked(const Head& head) {
    const auto values = head.all("Transfer-Encoding");
    if (values.empty()) return std::nullopt;
    std::string_view last;
    for (auto value : values) {
        while (!value.empty()) {
            auto comma = value.find(',');
            auto item = trim(value.substr(0, comma));
            value.remove_prefix(comma == std::string_view::npos ? value.size() : comma + 1);
            if (!item.empty()) last = item;
        }
    }
    return iequals(last, "chunked");
}

Framing request_framing(const Head& head) {
    if (const auto codings = head.all("Transfer-Encoding"); !codings.empty()) {
        // Go's server answers 501 to anything but one "chunked"; the proxy must frame the
        // request as the engine would, or the two would disagree about where the next starts.
        if (codings.size() > 1 || !iequals(codings.front(), "chunked"))
            throw HttpError{501, "unsupported Transfer-Encoding"};
        return {Framing::Kind::Chunked, 0};
    }
    if (head.has("Content-Length")) {
        const auto length = parse_content_length(head);
        return length > 0 ? Framing{Framing::Kind::Length, length} : Framing{};
    }
    return {};
}

Framing response_framing(const Head& head, int status, bool head_request) {
    if (head_request || (status >= 100 && status < 200) || status == 204 || status == 304) return {};
    if (auto chunked = transfer_chunked(head))
        return *chunked ? Framing{Framing::Kind::Chunked, 0} : Framing{Framing::Kind::UntilClose, 0};
    if (head.has("Content-Length")) return {Framing::Kind::Length, parse_content_length(head)};
    return {Framing::Kind::UntilClose, 0};
}

struct RequestLine {
    std::string method;
    std::string target;
};

RequestLine parse_request_line(const std::string& line) {
    const auto first = line.find(' ');
    const auto last = line.rfind(' ');
    if (first == std::string::npos || first == last) throw HttpError{400, "malformed request line"};
    const auto version = std::string_view(line).substr(last + 1);
    if (!version.starts_with("HTTP/1.")) throw HttpError{505, "HTTP version not supported"};
    return {line.substr(0, first), line.substr(first + 1, last - first - 1)};
}

int parse_status(const std::string& line) {
    // "HTTP/1.1 200 OK"
    const auto space = line.find(' ');
    int status = 0;
    if (space != std::string::npos && line.size() >= space + 4) {
        auto [end, ec] = std::from_chars(line.data() + space + 1, line.data() + space + 4, status);
        if (ec == std::errc{} && end == line.data() + space + 4) return status;
    }
    throw Broken("malformed status line from the engine: " + line.substr(0, 80));
}

// ---- chunked bodies -----------------------------------------------------------------------

// Follows a chunked body through its bytes, so it can be relayed as it is and its end found.
class ChunkedScanner {
public:
    using DataSink = std::function<void(std::string_view)>;

    // Takes bytes of the body from the front of `data` and returns how many it took: all of
    // them, or fewer once the body ended. The chunks' data go to `on_data` when given.
    std::size_t feed(std::string_view data, const DataSink* on_data) {
        std::size_t i = 0;
        while (i < data.size() && state_ != State::Done) {
            const char c = data[i];
            switch (state_) {
                case State::Size:
                    if (in_extension_ && c != '\n') {
                        // An extension ("; name=value") is skipped to the line's end.
                    } else if (std::isxdigit(static_cast<unsigned char>(c)) && !size_closed_) {
                        if (size_ >> 56) throw Broken("chunk size too large");
                        size_ = size_ * 16 + static_cast<std::uint64_t>(hex_value(c));
                        ++digits_;
                    } else if (c == '\n') {
                        if (digits_ == 0) throw Broken("chunk size missing");
                        state_ = size_ == 0 ? State::TrailerLineStart : State::Data;
                        line_bytes_ = 0;
                    } else if (c == ';') {
                        in_extension_ = true;
                    } else if (c == '\r' || c == ' ' || c == '\t') {
                        size_closed_ = true;
                    } else {
                        throw Broken("malformed chunk size");
                    }
                    if (++line_bytes_ > max_line_bytes) throw Broken("chunk size line too long");
                    ++i;
                    break;
                case State::Data: {
                    const auto take = static_cast<std::size_t>(
                        std::min<std::uint64_t>(size_, data.size() - i));
                    if (on_data) (*on_data)(data.substr(i, take));
                    i += take;
                    size_ -= take;
                    if (size_ == 0) state_ = State::DataEnd;
                    break;
                }
                case State::DataEnd:
                    // Exactly CRLF, as Go's chunked reader wants it.
                    if (c == '\r' && !seen_cr_) {
                        seen_cr_ = true;
                    } else if (c == '\n' && seen_cr_) {
                        reset_size();
                    } else {
                        throw Broken("chunk data not followed by CRLF");
                    }
                    ++i;
                    break;
                case State::TrailerLineStart:
                    state_ = c == '\n' ? State::Done : c == '\r' ? State::TrailerEnd : State::TrailerLine;
                    ++i;
                    break;
                case State::TrailerEnd:
                    if (c != '\n') throw Broken("malformed chunked trailer");
                    state_ = State::Done;
                    ++i;
                    break;
                case State::TrailerLine:
                    if (c == '\n') state_ = State::TrailerLineStart;
                    if (++line_bytes_ > max_trailer_bytes) throw Broken("chunked trailer too long");
                    ++i;
                    break;
                case State::Done:
                    break;
            }
        }
        return i;
    }
    bool done() const noexcept { return state_ == State::Done; }

private:
    enum class State { Size, Data, DataEnd, TrailerLineStart, TrailerLine, TrailerEnd, Done };
    static constexpr std::size_t max_line_bytes = 4096;
    static constexpr std::size_t max_trailer_bytes = 64 * 1024;

    static int hex_value(char c) {
        if (c >= '0' && c <= '9') return c - '0';
        return std::tolower(static_cast<unsigned char>(c)) - 'a' + 10;
    }
    void reset_size() {
        state_ = State::Size;
        size_ = 0;
        digits_ = 0;
        line_bytes_ = 0;
        in_extension_ = false;
        size_closed_ = false;
        seen_cr_ = false;
    }

    State state_ = State::Size;
    std::uint64_t size_ = 0;
    int digits_ = 0;
    std::size_t line_bytes_ = 0;
    bool in_extension_ = false;
    bool size_closed_ = false;
    bool seen_cr_ = false;
};

// Relays a body of `framing` from `in` to `out` as its bytes arrive; `capture` (when given)
// collects the body's data up to max_captured_answer bytes. Throws Broken when `in` ends
// first. Not for UntilClose, which is a raw copy.
void relay_body(Reader& in, int out, const Framing& framing, std::string* capture) {
    auto keep = [capture](std::string_view data) {
        if (capture && capture->size() < max_captured_answer)
            capture->append(data.substr(0, max_captured_answer - capture->size()));
    };
    if (framing.kind == Framing::Kind::Length) {
        auto left = framing.length;
        while (left > 0) {
            if (in.buffered().empty() && !in.fill()) throw Broken("the body ended early");
            auto data = in.buffered().substr(0, static_cast<std::size_t>(
                                                    std::min<std::uint64_t>(left, in.buffered().size())));
            keep(data);
            send_all(out, data);
            in.consume(data.size());
            left -= data.size();
        }
    } else if (framing.kind == Framing::Kind::Chunked) {
        ChunkedScanner scanner;
        const ChunkedScanner::DataSink sink = keep;
        while (!scanner.done()) {
            if (in.buffered().empty() && !in.fill()) throw Broken("the chunked body ended early");
            const auto data = in.buffered();
            const auto used = scanner.feed(data, capture ? &sink : nullptr);
            send_all(out, data.substr(0, used));
            in.consume(used);
        }
    }
}

// Reads a whole body of `framing` into memory, decoded; nullopt when it exceeds `limit`
// (what was read of it is lost: the caller closes the connection).
std::optional<std::string> read_body(Reader& in, const Framing& framing, std::size_t limit) {
    std::string body;
    if (framing.kind == Framing::Kind::Length) {
        if (framing.length > limit) return std::nullopt;
        while (body.size() < framing.length) {
            if (in.buffered().empty() && !in.fill()) throw Broken("the request body ended early");
            auto data = in.buffered().substr(
                0, std::min<std::size_t>(framing.length - body.size(), in.buffered().size()));
            body.append(data);
            in.consume(data.size());
        }
    } else if (framing.kind == Framing::Kind::Chunked) {
        ChunkedScanner scanner;
        bool over = false;
        const ChunkedScanner::DataSink sink = [&](std::string_view data) {
            if (body.size() + data.size() > limit) over = true;
            if (!over) body.append(data);
        };
        while (!scanner.done() && !over) {
            if (in.buffered().empty() && !in.fill()) throw Broken("the chunked request body ended early");
            in.consume(scanner.feed(in.buffered(), &sink));
        }
        if (over) return std::nullopt;
    }
    return body;
}

// Copies bytes from `in` (its buffer first) to `out` until `in` ends, then passes the end on
// with shutdown(SHUT_WR), which is how `docker run -i` tells the container its stdin closed.
void copy_raw(Reader& in, int out) {
    for (;;) {
        if (in.buffered().empty() && !in.fill()) break;
        send_all(out, in.buffered());
        in.consume(in.buffered().size());
    }
    ::shutdown(out, SHUT_WR);
}

// ---- JSON text ----------------------------------------------------------------------------

std::string json_string(std::string_view text) {
    std::string out = "\"";
    for (char c : text) {
        const auto u = static_cast<unsigned char>(c);
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (u < 0x20) {
            char escaped[8];
            std::snprintf(escaped, sizeof escaped, "\\u%04x", u);
            out += escaped;
        } else {
            out += c;
        }
    }
    return out + "\"";
}

// The engine's error body: {"message":"..."}.
std::string error_answer(int status, const std::string& message, bool close) {
    const char* reason = status == 400   ? "Bad Request"
                         : status == 431 ? "Request Header Fields Too Large"
                         : status == 501 ? "Not Implemented"
                         : status == 502 ? "Bad Gateway"
                         : status == 505 ? "HTTP Version Not Supported"
                                         : "Error";
    const std::string body = "{\"message\":" + json_string(message) + "}\n";
    return "HTTP/1.1 " + std::to_string(status) + " " + reason +
           "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
           (close ? "\r\nConnection: close" : "") + "\r\n\r\n" + body;
}

std::size_t skip_ws(std::string_view text, std::size_t i) {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r')) ++i;
    return i;
}

// The index after the string starting at text[i] == '"'.
std::size_t skip_string(std::string_view text, std::size_t i) {
    for (++i; i < text.size(); ++i) {
        if (text[i] == '\\') {
            ++i;
        } else if (text[i] == '"') {
            return i + 1;
        }
    }
    throw LabelRefused("unterminated string");
}

// The index after the value starting at text[i].
std::size_t skip_value(std::string_view text, std::size_t i) {
    if (i >= text.size()) throw LabelRefused("unexpected end of JSON");
    if (text[i] == '"') return skip_string(text, i);
    if (text[i] == '{' || text[i] == '[') {
        int depth = 0;
        for (; i < text.size(); ++i) {
            const char c = text[i];
            if (c == '"') {
                i = skip_string(text, i) - 1;
            } else if (c == '{' || c == '[') {
                ++depth;
            } else if ((c == '}' || c == ']') && --depth == 0) {
                return i + 1;
            }
        }
        throw LabelRefused("unexpected end of JSON");
    }
    while (i < text.size() && std::string_view(",}] \t\r\n").find(text[i]) == std::string_view::npos) ++i;
    return i;
}

struct Member {
    std::string key;  // decoded
    std::size_t value_begin;
    std::size_t value_end;
};

// The members of the top-level object of `text` (already checked to be one by Poco), with
// where each value's text is.
std::vector<Member> top_level_members(std::string_view text) {
    std::vector<Member> members;
    auto i = skip_ws(text, 0);
    ++i;  // '{'
    for (;;) {
        i = skip_ws(text, i);
        if (i >= text.size()) throw LabelRefused("unexpected end of JSON");
        if (text[i] == '}') return members;
        if (text[i] == ',') {
            ++i;
            continue;
        }
        const auto key_end = skip_string(text, i);
        const auto raw_key = text.substr(i + 1, key_end - i - 2);
        std::string key(raw_key);
        if (raw_key.find('\\') != std::string_view::npos) {
            // An escaped key ("Lab\u0065ls"): Poco decodes it.
            Poco::JSON::Parser parser;
            auto object = parser.parse("{\"" + key + "\":0}").extract<Poco::JSON::Object::Ptr>();
            key = object->getNames().front();
        }
        i = skip_ws(text, key_end);
        if (i >= text.size() || text[i] != ':') throw LabelRefused("expected ':' in JSON");
        const auto value_begin = skip_ws(text, i + 1);
        const auto value_end = skip_value(text, value_begin);
        members.push_back({std::move(key), value_begin, value_end});
        i = value_end;
    }
}

// Go's encoding/json matches a field name case-insensitively, with Unicode simple folding:
// "labels", "LABELS", and "labelſ" (U+017F folds to 's') all reach Labels.
bool names_labels_field(std::string_view key) {
    // Folded by appending rather than by std::string::replace, which GCC 12's -Wrestrict
    // misreads at -O3 (the .deb's build).
    std::string folded;
    for (std::size_t i = 0; i < key.size(); ++i) {
        if (key.substr(i, 2) == "\xC5\xBF") {
            folded += 's';
            ++i;
        } else {
            folded += key[i];
        }
    }
    return iequals(folded, "labels");
}

}  // namespace

// ---- the pieces ---------------------------------------------------------------------------

const char* to_string(CreateKind kind) {
    switch (kind) {
        case CreateKind::None: return "none";
        case CreateKind::Container: return "container";
        case CreateKind::Network: return "network";
        case CreateKind::Volume: return "volume";
    }
    return "?";
}

CreateKind create_kind(std::string_view method, std::string_view target) {
    if (method != "POST") return CreateKind::None;
    auto raw_path = target.substr(0, target.find_first_of("?#"));
    // The engine's router sees the decoded path.
    std::string decoded;
    for (std::size_t i = 0; i < raw_path.size(); ++i) {
        int value = 0;
        if (raw_path[i] == '%' && i + 2 < raw_path.size() &&
            std::isxdigit(static_cast<unsigned char>(raw_path[i + 1])) &&
            std::isxdigit(static_cast<unsigned char>(raw_path[i + 2]))) {
            std::from_chars(raw_path.data() + i + 1, raw_path.data() + i + 3, value, 16);
            decoded += static_cast<char>(value);
            i += 2;
        } else {
            decoded += raw_path[i];
        }
    }
    // Cleaned as a path: a router that redirects "//containers/./create" creates nothing, and
    // labelling such a request anyway is harmless.
    std::vector<std::string_view> parts;
    std::string_view rest = decoded;
    while (!rest.empty()) {
        const auto slash = rest.find('/');
        const auto part = rest.substr(0, slash);
        rest.remove_prefix(slash == std::string_view::npos ? rest.size() : slash + 1);
        if (part.empty() || part == ".") continue;
        if (part == "..") {
            if (!parts.empty()) parts.pop_back();
            continue;
        }
        parts.push_back(part);
    }
    // The optional version prefix, "/v{version:[0-9.]+}" in the engine's router.
    if (parts.size() == 3 && parts[0].size() > 1 && parts[0][0] == 'v' &&
        parts[0].find_first_not_of("0123456789.", 1) == std::string_view::npos) {
        parts.erase(parts.begin());
    }
    if (parts.size() != 2 || parts[1] != "create") return CreateKind::None;
    if (parts[0] == "containers") return CreateKind::Container;
    if (parts[0] == "networks") return CreateKind::Network;
    if (parts[0] == "volumes") return CreateKind::Volume;
    return CreateKind::None;
}

std::string add_label(std::string_view body, std::string_view key, std::string_view value) {
    const std::string label = json_string(key) + ":" + json_string(value);
    if (skip_ws(body, 0) == body.size()) return "{\"Labels\":{" + label + "}}";

    Poco::JSON::Object::Ptr root;
    try {
        Poco::JSON::Parser parser;
        const auto parsed = parser.parse(std::string(body));
        if (parsed.type() != typeid(Poco::JSON::Object::Ptr)) {
            throw LabelRefused("the body is not a JSON object");
        }
        root = parsed.extract<Poco::JSON::Object::Ptr>();
    } catch (const Poco::Exception& e) {
        throw LabelRefused("the body is not valid JSON (" + e.displayText() + ")");
    }

    const auto members = top_level_members(body);
    std::vector<const Member*> labels;
    for (const auto& member : members)
        if (names_labels_field(member.key)) labels.push_back(&member);
    std::string out(body);
    if (labels.empty()) {
        const auto open = skip_ws(body, 0);
        const bool empty = skip_ws(body, open + 1) < body.size() && body[skip_ws(body, open + 1)] == '}';
        out.insert(open + 1, "\"Labels\":{" + label + "}" + (empty ? "" : ","));
        return out;
    }
    if (labels.size() > 1) {
        throw LabelRefused("the body has " + std::to_string(labels.size()) +
                           " Labels fields (names match case-insensitively); send one");
    }
    const Member& member = *labels.front();
    const auto text = body.substr(member.value_begin, member.value_end - member.value_begin);
    if (text == "null") {
        out.replace(member.value_begin, text.size(), "{" + label + "}");
        return out;
    }
    if (text.empty() || text.front() != '{') throw LabelRefused("Labels must be an object");
    const auto existing = root->getObject(member.key);
    if (existing && existing->has(std::string(key))) {
        const auto& current = existing->get(std::string(key));
        if (current.isString() && current.extract<std::string>() == value) return out;
        throw LabelRefused("label " + std::string(key) + "=" + current.toString() +
                           " is already set; this proxy labels everything with " + std::string(key) +
                           "=" + std::string(value) + " and never overwrites a label");
    }
    const auto inner = skip_ws(body, member.value_begin + 1);
    const bool empty = inner < body.size() && body[inner] == '}';
    out.insert(member.value_begin + 1, label + (empty ? "" : ","));
    return out;
}

namespace {

// A member of the object at text[begin, end) whose name Go's decoder takes for `name`
// (case-insensitively), positions absolute. nullopt when there is none; throws LabelRefused
// when there are several (which one the engine reads is not worth guessing).
std::optional<Member> member_named(std::string_view text, std::size_t begin, std::size_t end,
                                   std::string_view name) {
    std::optional<Member> found;
    for (auto member : top_level_members(text.substr(begin, end - begin))) {
        if (!iequals(member.key, name)) continue;
        if (found) throw LabelRefused(std::string(name) + " named twice");
        member.value_begin += begin;
        member.value_end += begin;
        found = std::move(member);
    }
    return found;
}

bool is_object(std::string_view text, const Member& member) { return text[member.value_begin] == '{'; }
bool is_null(std::string_view text, const Member& member) {
    return text.substr(member.value_begin, member.value_end - member.value_begin) == "null";
}

// Inserts `members` ("\"a\":1,...") first into the object whose '{' is at text[open].
void insert_members(std::string& text, std::size_t open, const std::string& members) {
    const auto inner = skip_ws(text, open + 1);
    const bool empty = inner < text.size() && text[inner] == '}';
    text.insert(open + 1, members + (empty ? "" : ","));
}

// Gives `name` the JSON `value` in the object whose '{' is at text[open]: in place of the null
// value of `member` when there is one, else as a new first member.
void put_member(std::string& text, std::size_t open, const std::optional<Member>& member, std::string_view name,
                const std::string& value) {
    if (member) {
        text.replace(member->value_begin, member->value_end - member->value_begin, value);
    } else {
        insert_members(text, open, json_string(name) + ":" + value);
    }
}

}  // namespace

std::optional<std::string> add_log_rotation(std::string_view body, std::string_view default_driver,
                                            std::uint64_t cap_bytes) {
    Poco::JSON::Object::Ptr root;
    try {
        Poco::JSON::Parser parser;
        root = parser.parse(std::string(body)).extract<Poco::JSON::Object::Ptr>();
    } catch (const Poco::Exception&) {
        return std::nullopt;
    }
    Labels labels;
    for (const auto& name : root->getNames()) {
        const auto object = names_labels_field(name) ? root->getObject(name) : nullptr;
        if (!object) continue;
        for (const auto& key : object->getNames())
            if (object->get(key).isString()) labels[key] = object->getValue<std::string>(key);
    }
    const auto options = rotation_options(log_cap_for(labels, cap_bytes));
    if (options.empty()) return std::nullopt;
    std::string config_members;
    for (const auto& [key, value] : options) {
        if (!config_members.empty()) config_members += ',';
        config_members += json_string(key) + ":" + json_string(value);
    }
    const std::string config = "{" + config_members + "}";

    std::string out(body);
    const auto root_open = skip_ws(body, 0);
    try {
        const auto host = member_named(body, root_open, body.size(), "HostConfig");
        const bool default_rotates = !default_driver.empty() && driver_rotates(default_driver);
        if (!host || is_null(body, *host)) {
            if (!default_rotates) return std::nullopt;
            put_member(out, root_open, host, "HostConfig", "{\"LogConfig\":{\"Config\":" + config + "}}");
            return out;
        }
        if (!is_object(body, *host)) return std::nullopt;
        const auto log = member_named(body, host->value_begin, host->value_end, "LogConfig");
        if (!log || is_null(body, *log)) {
            if (!default_rotates) return std::nullopt;
            put_member(out, host->value_begin, log, "LogConfig", "{\"Config\":" + config + "}");
            return out;
        }
        if (!is_object(body, *log)) return std::nullopt;
        std::string driver(default_driver);
        if (const auto type = member_named(body, log->value_begin, log->value_end, "Type"); type && !is_null(body, *type)) {
            Poco::JSON::Parser parser;
            const auto value = parser.parse("[" + std::string(body.substr(type->value_begin, type->value_end - type->value_begin)) + "]")
                                   .extract<Poco::JSON::Array::Ptr>()->get(0);
            if (!value.isString()) return std::nullopt;
            if (const auto given = value.extract<std::string>(); !given.empty()) driver = given;
        }
        if (!driver_rotates(driver)) return std::nullopt;
        const auto given = member_named(body, log->value_begin, log->value_end, "Config");
        if (!given || is_null(body, *given)) {
            put_member(out, log->value_begin, given, "Config", config);
            return out;
        }
        if (!is_object(body, *given)) return std::nullopt;
        Poco::JSON::Parser parser;
        const auto own = parser.parse(std::string(body.substr(given->value_begin, given->value_end - given->value_begin)))
                             .extract<Poco::JSON::Object::Ptr>();
        std::map<std::string, std::string> own_options;
        for (const auto& key : own->getNames()) own_options[key] = own->get(key).toString();
        if (sets_rotation(own_options)) return std::nullopt;
        insert_members(out, given->value_begin, config_members);
        return out;
    } catch (const LabelRefused&) {
        return std::nullopt;
    } catch (const Poco::Exception&) {
        return std::nullopt;
    }
}

// ---- the proxy ----------------------------------------------------------------------------

namespace {

struct Counters {
    std::atomic<std::uint64_t> containers{0};
    std::atomic<std::uint64_t> networks{0};
    std::atomic<std::uint64_t> volumes{0};
    std::atomic<std::uint64_t> rotated{0};
    std::atomic<std::uint64_t> refused{0};
    std::atomic<std::uint64_t> connections{0};
    std::atomic<std::uint64_t> open_connections{0};
};

UniqueFd connect_upstream(const EngineAddress& address) {
    if (address.kind == EngineAddress::Kind::Unix) {
        UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
        if (!fd) throw_errno("socket");
        sockaddr_un where{};
        where.sun_family = AF_UNIX;
        if (address.path.size() >= sizeof where.sun_path) {
            throw std::system_error(ENAMETOOLONG, std::generic_category(), address.path);
        }
        std::memcpy(where.sun_path, address.path.c_str(), address.path.size() + 1);
        if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&where), sizeof where) != 0) {
            throw_errno("connecting to " + address.to_string());
        }
        return fd;
    }
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const auto port = std::to_string(address.port);
    if (int rc = ::getaddrinfo(address.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
        throw std::runtime_error("resolving " + address.host + ": " + ::gai_strerror(rc));
    }
    std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> list(found, &::freeaddrinfo);
    int last_error = ECONNREFUSED;
    for (auto* ai = found; ai; ai = ai->ai_next) {
        UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
        if (!fd) continue;
        if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
            if (errno != EINPROGRESS) {
                last_error = errno;
                continue;
            }
            pollfd p{fd.get(), POLLOUT, 0};
            int error = 0;
            socklen_t length = sizeof error;
            if (::poll(&p, 1, upstream_connect_timeout_ms) <= 0) {
                last_error = ETIMEDOUT;
                continue;
            }
            ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &length);
            if (error != 0) {
                last_error = error;
                continue;
            }
        }
        ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
        // Heads and bodies go out as separate writes: without this, Nagle and delayed ACKs
        // would hold a small body for 40 ms.
        int one = 1;
        ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return fd;
    }
    throw std::system_error(last_error, std::generic_category(), "connecting to " + address.to_string());
}

// One GET of the proxy's own on a connection of its own, in HTTP/1.0 so that the answer is
// never chunked: the answer's head and body, which ends at its Content-Length or with the
// connection. Throws Broken or std::system_error.
std::pair<Head, std::string> engine_get(const EngineAddress& upstream, const std::string& path) {
    auto fd = connect_upstream(upstream);
    send_all(fd.get(), "GET " + path + " HTTP/1.0\r\nHost: docker\r\n\r\n");
    std::string answer;
    std::vector<char> buffer(io_chunk);
    const auto deadline = std::chrono::steady_clock::now() + engine_question_timeout;
    std::optional<Head> head;
    std::size_t body_at = 0;
    std::optional<std::uint64_t> length;
    while (!length || answer.size() - body_at < *length) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        pollfd p{fd.get(), POLLIN, 0};
        if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) == 0)
            throw Broken("no answer to GET " + path + " within " +
                         std::to_string(engine_question_timeout.count()) + " ms");
        const auto n = ::recv(fd.get(), buffer.data(), buffer.size(), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw Broken("read: " + errno_text(errno));
        if (n == 0) break;
        answer.append(buffer.data(), static_cast<std::size_t>(n));
        if (answer.size() > max_captured_answer * 16) throw Broken("the answer to GET " + path + " is too large");
        if (const auto end = answer.find("\r\n\r\n"); !head && end != std::string::npos) {
            try {
                head = parse_head(answer.substr(0, end + 4));
                if (head->has("Content-Length")) length = parse_content_length(*head);
            } catch (const HttpError& e) {
                throw Broken("the engine sent a malformed head: " + e.message);
            }
            body_at = end + 4;
        }
    }
    if (!head) throw Broken("no head in the answer to GET " + path);
    if (parse_status(head->first_line) != 200) throw Broken("GET " + path + ": " + head->first_line);
    return {std::move(*head), answer.substr(body_at, length.value_or(answer.size() - body_at))};
}

// What a container create's log rotation needs to know of the engine, asked once per proxy
// (at the first container create whose rotation depends on it) and kept: which engine it is
// and its default log driver. A failed question is asked again at the next create.
class EngineFacts {
public:
    struct Facts {
        bool podman = false;
        std::string default_driver;  // GET /info LoggingDriver; "" on Podman
    };

    explicit EngineFacts(const EngineAddress& upstream) : upstream_(upstream) {}

    // Throws what engine_get throws; several threads may call it, one asks.
    Facts get() {
        std::lock_guard lock(mutex_);
        if (facts_) return *facts_;
        Facts facts;
        // /_ping answers in ~10 ms on either engine; Podman's /info takes ~1.7 s (README,
        // Supported engines), and nothing in it is needed there.
        facts.podman = engine_get(upstream_, "/_ping").first.has("Libpod-Api-Version");
        if (!facts.podman) {
            const auto info = engine_get(upstream_, "/info").second;
            Poco::JSON::Parser parser;
            facts.default_driver =
                parser.parse(info).extract<Poco::JSON::Object::Ptr>()->optValue<std::string>("LoggingDriver", "");
        }
        facts_ = facts;
        return facts;
    }

private:
    const EngineAddress& upstream_;
    std::mutex mutex_;
    std::optional<Facts> facts_;
};

// What the answer side needs to know about a request sent on.
struct Sent {
    bool head_request = false;
    CreateKind kind = CreateKind::None;
    std::string what;  // "POST /v1.41/containers/create" for the log
    bool rotated = false;  // a container create given log rotation
};

class Connection {
public:
    Connection(UniqueFd client, const ProxyOptions& options, Counters& counters, EngineFacts& facts)
        : client_(std::move(client)), options_(options), counters_(counters), facts_(facts) {}
    ~Connection() {
        if (answers_.joinable()) answers_.join();
    }

    // The request side; returns when the connection is over, both threads done.
    void run() noexcept {
        try {
            pump_requests();
        } catch (const Broken& e) {
            log(LogLevel::Debug, std::string("connection ended: ") + e.what());
            abort();
        } catch (const std::exception& e) {
            log(LogLevel::Warning, std::string("connection failed: ") + e.what());
            abort();
        }
        if (answers_.joinable()) answers_.join();
        // Closed now, not when the proxy next reaps its finished connections.
        std::lock_guard lock(mutex_);
        client_.reset();
        upstream_.reset();
    }

    // Ends the connection from outside: both sockets shut down, so every blocked call returns.
    void abort() noexcept {
        std::lock_guard lock(mutex_);
        aborted_ = true;
        if (client_) ::shutdown(client_.get(), SHUT_RDWR);
        if (upstream_) ::shutdown(upstream_.get(), SHUT_RDWR);
        changed_.notify();
    }

private:
    enum class Answer { Http, Raw, Over };

    void log(LogLevel level, std::string message, std::string id = {}) const noexcept {
        try {
            if (options_.log) {
                options_.log(LogRecord{level, options_.session, std::move(id), std::move(message), nullptr});
            }
        } catch (...) {
            // A sink's failure is its own.
        }
    }

    void pump_requests() {
        Reader in(client_.get());
        for (;;) {
            std::optional<std::string> head_text;
            Head head;
            RequestLine line;
            Framing framing;
            try {
                head_text = in.read_head();
                if (!head_text) return end_of_requests();
                head = parse_head(*head_text);
                line = parse_request_line(head.first_line);
                framing = request_framing(head);
            } catch (const HttpError& e) {
                // The stream cannot be followed past a head it does not understand.
                refuse(e.status, e.message, true,
                       head.first_line.empty() ? "a request" : head.first_line.substr(0, 120));
                return;
            }
            const auto what = line.method + " " + line.target.substr(0, 200);
            if (!ensure_upstream(what)) return;
            const auto kind = create_kind(line.method, line.target);
            if (kind != CreateKind::None) {
                if (!forward_create(in, head, framing, kind, what)) return;
            } else {
                expect({line.method == "HEAD", kind, what});
                send_all(upstream_.get(), *head_text);
                relay_body(in, upstream_.get(), framing, nullptr);
            }
            switch (await_answer(in)) {
                case Answer::Http: continue;
                case Answer::Raw:
                    copy_raw(in, upstream_.get());
                    return end_of_requests(false);
                case Answer::Over: return;
            }
        }
    }

    // The create path: the body read whole, labelled, sent with a new Content-Length.
    // False when the connection cannot go on.
    bool forward_create(Reader& in, const Head& head, const Framing& framing, CreateKind kind,
                        const std::string& what) {
        const auto expectations = head.all("Expect");
        const bool expects_continue =
            expectations.size() == 1 && iequals(expectations.front(), "100-continue");
        const auto too_large = [&] {
            refuse(400,
                   "the " + std::string(to_string(kind)) + " create body is larger than " +
                       std::to_string(options_.max_body_bytes) + " bytes, which this proxy does not take",
                   true, what);
            return false;
        };
        if (framing.kind == Framing::Kind::Length && framing.length > options_.max_body_bytes) {
            return too_large();
        }
        // A client that waits for "100 Continue" before its body gets it from us: the engine
        // will see the body in one piece.
        if (expects_continue) answer_locally("HTTP/1.1 100 Continue\r\n\r\n");
        auto body = read_body(in, framing, options_.max_body_bytes);
        if (!body) return too_large();
        std::string labelled;
        try {
            labelled = add_label(*body, options_.label_key, options_.session);
        } catch (const LabelRefused& e) {
            refuse(400, e.what(), false, what);
            return true;
        }
        std::string out = head.first_line + "\r\n";
        for (const auto& [name, value] : head.fields) {
            if (iequals(name, "Content-Length") || iequals(name, "Transfer-Encoding") ||
                (expects_continue && iequals(name, "Expect")))
                continue;
            out += name + ": " + value + "\r\n";
        }
        // An empty body became JSON, which newer engines only take with its Content-Type.
        if (!head.has("Content-Type")) out += "Content-Type: application/json\r\n";
        bool rotated = false;
        if (kind == CreateKind::Container) {
            if (auto with_rotation = rotate_logs(labelled, what)) {
                labelled = std::move(*with_rotation);
                rotated = true;
            }
        }
        out += "Content-Length: " + std::to_string(labelled.size()) + "\r\n\r\n" + labelled;
        expect({false, kind, what, rotated});
        send_all(upstream_.get(), out);
        return true;
    }

    // A container create's body with Docker's own log rotation added, or nullopt to send it as
    // it is. Never refuses: a create the proxy cannot give rotation goes on without (a warning).
    std::optional<std::string> rotate_logs(const std::string& body, const std::string& what) {
        const std::uint64_t cap = options_.log_rotation_cap ? options_.log_rotation_cap() : 0;
        if (cap == 0) return std::nullopt;
        try {
            const auto facts = facts_.get();
            if (facts.podman) return std::nullopt;
            return add_log_rotation(body, facts.default_driver, cap);
        } catch (const std::exception& e) {
            log(LogLevel::Warning, "no log rotation for " + what + ": cannot ask the engine its default log driver: " +
                                       e.what());
            return std::nullopt;
        }
    }

    // Connects to the engine on the first request; false (after answering 502) when it cannot.
    bool ensure_upstream(const std::string& what) {
        if (upstream_) return true;
        UniqueFd fd;
        try {
            fd = connect_upstream(options_.upstream);
        } catch (const std::exception& e) {
            refuse(502, "the proxy of session " + options_.session + " cannot reach the engine: " + e.what(),
                   true, what);
            return false;
        }
        std::lock_guard lock(mutex_);
        if (aborted_) throw Broken("stopped");
        upstream_ = std::move(fd);
        answers_ = std::thread([this] { pump_answers(); });
        return true;
    }

    void expect(Sent sent) {
        std::lock_guard lock(mutex_);
        sent_.push_back(std::move(sent));
        ++requests_sent_;
    }

    // Writes bytes of the proxy's own to the tool, after every answer before them is relayed.
    void answer_locally(const std::string& bytes) {
        wait_until([this] { return answers_relayed_ == requests_sent_ || answers_done_; }, nullptr);
        send_all(client_.get(), bytes);
    }

    void refuse(int status, const std::string& message, bool close, const std::string& what) {
        ++counters_.refused;
        log(LogLevel::Warning, "refused " + what + ": " + message);
        answer_locally(error_answer(status, message, close));
        if (close) abort();
    }

    // Waits until `done` holds (checked under the lock). With `in`, the tool is watched
    // meanwhile: its bytes are buffered, and its end of input is passed on (returns false).
    bool wait_until(const std::function<bool()>& done, Reader* in) {
        for (;;) {
            {
                std::lock_guard lock(mutex_);
                if (done() || aborted_) return true;
            }
            // Bytes of a request not yet allowed to go are kept; then only the wake is polled.
            const bool watch = in && in->buffered().empty();
            pollfd fds[2] = {{watch ? client_.get() : -1, POLLIN, 0}, {changed_.fd(), POLLIN, 0}};
            if (::poll(fds, 2, -1) < 0 && errno != EINTR) throw_errno("poll");
            if (fds[1].revents & POLLIN) changed_.drain();
            if (watch && (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) && !in->fill()) return false;
        }
    }

    // Waits for the answer to the last request sent.
    Answer await_answer(Reader& in) {
        if (!wait_until([this] { return answers_headed_ == requests_sent_ || raw_ || answers_done_; }, &in)) {
            end_of_requests();
            return Answer::Over;
        }
        std::lock_guard lock(mutex_);
        if (aborted_) return Answer::Over;
        if (raw_) return Answer::Raw;
        return answers_headed_ == requests_sent_ ? Answer::Http : Answer::Over;
    }

    // The tool sent its last byte: the engine is told (it ends a long wait or a stream for a
    // client that left, as it would direct); then the answer side finishes, unless the tool
    // closed its socket outright, which ends the engine's side too.
    void end_of_requests(bool pass_on = true) {
        {
            std::lock_guard lock(mutex_);
            if (!upstream_) return;
            if (pass_on) ::shutdown(upstream_.get(), SHUT_WR);
        }
        for (;;) {
            {
                std::lock_guard lock(mutex_);
                if (answers_done_ || aborted_) return;
            }
            // POLLHUP on a unix socket: the peer closed both directions, not only its writing.
            pollfd fds[2] = {{client_.get(), 0, 0}, {changed_.fd(), POLLIN, 0}};
            if (::poll(fds, 2, -1) < 0 && errno != EINTR) throw_errno("poll");
            if (fds[1].revents & POLLIN) changed_.drain();
            if (fds[0].revents & (POLLHUP | POLLERR)) {
                abort();
                return;
            }
        }
    }

    void pump_answers() noexcept {
        try {
            relay_answers();
        } catch (const Broken& e) {
            log(LogLevel::Debug, std::string("engine side ended: ") + e.what());
            abort();
        } catch (const std::exception& e) {
            log(LogLevel::Warning, std::string("engine side failed: ") + e.what());
            abort();
        }
        std::lock_guard lock(mutex_);
        answers_done_ = true;
        changed_.notify();
    }

    void relay_answers() {
        Reader in(upstream_.get());
        for (;;) {
            std::optional<std::string> head_text;
            try {
                head_text = in.read_head();
            } catch (const HttpError& e) {
                throw Broken("the engine sent " + e.message);
            }
            if (!head_text) {
                // The engine closed its end: so does the proxy, towards the tool.
                ::shutdown(client_.get(), SHUT_WR);
                return;
            }
            Head head;
            try {
                head = parse_head(*head_text);
            } catch (const HttpError& e) {
                throw Broken("the engine sent a malformed head: " + e.message);
            }
            const int status = parse_status(head.first_line);
            if (status >= 100 && status < 200 && status != 101) {
                send_all(client_.get(), *head_text);  // 100 Continue: the request goes on
                continue;
            }
            Sent sent;
            {
                std::lock_guard lock(mutex_);
                if (sent_.empty()) throw Broken("the engine answered a request never sent");
                sent = std::move(sent_.front());
                sent_.pop_front();
            }
            Framing framing;
            try {
                framing = response_framing(head, status, sent.head_request);
            } catch (const HttpError& e) {
                throw Broken("the engine sent " + e.message);
            }
            if (status == 101 || framing.kind == Framing::Kind::UntilClose) {
                // Hijacked: from here on the connection is a byte stream both ways.
                {
                    std::lock_guard lock(mutex_);
                    raw_ = true;
                    changed_.notify();
                }
                send_all(client_.get(), *head_text);
                copy_raw(in, client_.get());
                return;
            }
            {
                std::lock_guard lock(mutex_);
                ++answers_headed_;
                changed_.notify();
            }
            send_all(client_.get(), *head_text);
            const bool created = sent.kind != CreateKind::None && status >= 200 && status < 300;
            std::string captured;
            relay_body(in, client_.get(), framing, created ? &captured : nullptr);
            if (created) count_created(sent, captured);
            std::lock_guard lock(mutex_);
            ++answers_relayed_;
            changed_.notify();
        }
    }

    void count_created(const Sent& sent, const std::string& answer) {
        switch (sent.kind) {
            case CreateKind::Container:
                ++counters_.containers;
                if (sent.rotated) ++counters_.rotated;
                break;
            case CreateKind::Network: ++counters_.networks; break;
            case CreateKind::Volume: ++counters_.volumes; break;
            case CreateKind::None: break;
        }
        if (options_.on_labelled) {
            try {
                options_.on_labelled();
            } catch (...) {
                // The hook's failure is its own; the create was labelled all the same.
            }
        }
        // {"Id":...} for containers and networks, {"Name":...} for volumes.
        std::string id;
        try {
            Poco::JSON::Parser parser;
            auto object = parser.parse(answer).extract<Poco::JSON::Object::Ptr>();
            id = object->optValue<std::string>(sent.kind == CreateKind::Volume ? "Name" : "Id", "");
        } catch (const std::exception&) {
            // Counted all the same (Poco's exceptions are std ones too); the line has no id.
        }
        log(LogLevel::Info,
            std::string("labelled ") + to_string(sent.kind) + " " + id + (sent.rotated ? " and set its log rotation" : "") +
                " (" + sent.what + ")",
            sent.kind == CreateKind::Container ? id : std::string());
    }

    UniqueFd client_;
    const ProxyOptions& options_;
    Counters& counters_;
    EngineFacts& facts_;

    std::mutex mutex_;
    Wakeup changed_;  // written whenever the state below changes, read by the request side
    UniqueFd upstream_;
    std::thread answers_;
    std::deque<Sent> sent_;
    std::uint64_t requests_sent_ = 0;
    std::uint64_t answers_headed_ = 0;
    std::uint64_t answers_relayed_ = 0;
    bool raw_ = false;
    bool answers_done_ = false;
    bool aborted_ = false;
};

}  // namespace

class EngineProxy::Impl {
public:
    explicit Impl(ProxyOptions options) : options(std::move(options)), facts(this->options.upstream) {}

    void start() {
        if (started) throw std::logic_error("EngineProxy::start called twice");
        started = true;
        // Non-blocking: a client that is gone between poll() and accept() must not block stop().
        listener = UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
        if (!listener) throw_errno("socket");
        sockaddr_un where{};
        where.sun_family = AF_UNIX;
        if (options.listen_path.size() >= sizeof where.sun_path) {
            throw std::system_error(ENAMETOOLONG, std::generic_category(), options.listen_path);
        }
        std::memcpy(where.sun_path, options.listen_path.c_str(), options.listen_path.size() + 1);
        // Linux creates the socket file with the socket's own mode (less the umask): set
        // before bind(), there is no moment in which the file is open to others.
        if (::fchmod(listener.get(), 0600) != 0) throw_errno("fchmod");
        if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&where), sizeof where) != 0) {
            throw_errno("binding " + options.listen_path);
        }
        bound = true;
        if (::listen(listener.get(), 64) != 0) throw_errno("listen");
        AllSignalsBlocked blocked;  // inherited by every thread the proxy starts
        acceptor = std::thread([this] { accept_loop(); });
    }

    void stop() noexcept {
        stopping.notify();
        if (acceptor.joinable()) acceptor.join();
        for (auto& slot : slots) slot->connection->abort();
        for (auto& slot : slots) slot->thread.join();
        slots.clear();
        listener.reset();
        if (bound) ::unlink(options.listen_path.c_str());
        bound = false;
    }

    ProxyOptions options;
    Counters counters;
    EngineFacts facts;

private:
    struct Slot {
        std::unique_ptr<Connection> connection;
        std::thread thread;
        std::atomic<bool> done{false};
    };

    void accept_loop() noexcept {
        for (;;) {
            pollfd fds[2] = {{listener.get(), POLLIN, 0}, {stopping.fd(), POLLIN, 0}};
            if (::poll(fds, 2, -1) < 0) continue;
            if (fds[1].revents) return;
            reap_finished();
            UniqueFd client(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
            if (!client && (errno == EAGAIN || errno == ECONNABORTED || errno == EINTR)) continue;
            if (!client) {
                // Out of descriptors, most likely: try again shortly rather than spin.
                log(LogLevel::Warning, "accept: " + errno_text(errno));
                pollfd wait{stopping.fd(), POLLIN, 0};
                ::poll(&wait, 1, 100);
                continue;
            }
            try {
                auto slot = std::make_unique<Slot>();
                slot->connection = std::make_unique<Connection>(std::move(client), options, counters, facts);
                auto* raw = slot.get();
                ++counters.connections;
                ++counters.open_connections;
                slot->thread = std::thread([this, raw] {
                    raw->connection->run();
                    --counters.open_connections;
                    raw->done = true;
                });
                slots.push_back(std::move(slot));
            } catch (const std::exception& e) {
                log(LogLevel::Warning, std::string("cannot serve a connection: ") + e.what());
            }
        }
    }

    void reap_finished() {
        for (auto it = slots.begin(); it != slots.end();) {
            if ((*it)->done) {
                (*it)->thread.join();
                it = slots.erase(it);
            } else {
                ++it;
            }
        }
    }

    void log(LogLevel level, std::string message) const noexcept {
        try {
            if (options.log) options.log(LogRecord{level, options.session, "", std::move(message), nullptr});
        } catch (...) {
            // A sink's failure is its own.
        }
    }

    bool started = false;
    bool bound = false;
    UniqueFd listener;
    Wakeup stopping;
    std::thread acceptor;
    std::list<std::unique_ptr<Slot>> slots;  // only the accepting thread touches it, then stop()
};

EngineProxy::EngineProxy(ProxyOptions options) {
    if (options.listen_path.empty()) throw std::invalid_argument("EngineProxy: empty listen path");
    if (options.label_key.empty()) throw std::invalid_argument("EngineProxy: empty label key");
    try {
        control::validate_session_id(options.session);
    } catch (const control::ProtocolViolation& e) {
        throw std::invalid_argument(std::string("EngineProxy: ") + e.what());
    }
    impl_ = std::make_unique<Impl>(std::move(options));
}

EngineProxy::~EngineProxy() { stop(); }

void EngineProxy::start() { impl_->start(); }

void EngineProxy::stop() noexcept { impl_->stop(); }

ProxyStats EngineProxy::stats() const {
    const auto& c = impl_->counters;
    ProxyStats stats;
    stats.containers = c.containers;
    stats.networks = c.networks;
    stats.volumes = c.volumes;
    stats.rotated = c.rotated;
    stats.refused = c.refused;
    stats.connections = c.connections;
    stats.open_connections = c.open_connections;
    return stats;
}

const ProxyOptions& EngineProxy::options() const noexcept { return impl_->options; }

}  // namespace reaper
