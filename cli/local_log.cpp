#include "local_log.hpp"

#include <algorithm>
#include <deque>
#include <iterator>
#include <string>
#include <utility>

namespace reaperctl {

namespace {

constexpr std::uint64_t size_bytes = 4;               // each of a frame's two sizes
constexpr std::uint64_t max_entry_bytes = 1'000'000;  // moby's maxMsgLen
// Read ahead at once: ~15,000 frames of short lines (a `yes` frame is ~40 bytes).
constexpr std::uint64_t block = 1024 * 1024;

std::uint64_t big_endian(std::string_view four) {
    std::uint64_t value = 0;
    for (std::size_t i = 0; i < size_bytes; ++i) value = value << 8 | static_cast<unsigned char>(four[i]);
    return value;
}

// The protobuf wire format, as far as a LogEntry needs it: each call consumes one value from
// the front of `data`, false when it does not fit.
struct Wire {
    std::string_view data;

    bool varint(std::uint64_t& value) {
        value = 0;
        for (unsigned shift = 0; shift < 64 && !data.empty(); shift += 7) {
            const auto byte = static_cast<unsigned char>(data.front());
            data.remove_prefix(1);
            value |= std::uint64_t{byte & 0x7fu} << shift;
            if ((byte & 0x80u) == 0) return true;
        }
        return false;
    }
    bool bytes(std::string_view& value) {
        std::uint64_t length = 0;
        if (!varint(length) || length > data.size()) return false;
        value = data.substr(0, length);
        data.remove_prefix(length);
        return true;
    }
    bool fixed(std::size_t width) {
        if (data.size() < width) return false;
        data.remove_prefix(width);
        return true;
    }
    // A field of a number this reader does not use; false for the wire types a LogEntry
    // cannot hold (groups, and 6 and 7, which do not exist).
    bool skip(unsigned wire_type) {
        std::uint64_t number = 0;
        std::string_view view;
        switch (wire_type) {
            case 0: return varint(number);
            case 1: return fixed(8);
            case 2: return bytes(view);
            case 5: return fixed(4);
            default: return false;
        }
    }
};

// PartialLogEntryMetadata's `last` (field 1).
std::optional<bool> decode_last(std::string_view metadata) {
    Wire wire{metadata};
    bool last = false;
    while (!wire.data.empty()) {
        std::uint64_t key = 0, value = 0;
        if (!wire.varint(key)) return std::nullopt;
        if (key == (1 << 3 | 0)) {
            if (!wire.varint(value)) return std::nullopt;
            last = value != 0;
        } else if ((key >> 3) == 0 || !wire.skip(key & 7)) {
            return std::nullopt;
        }
    }
    return last;
}

// A window over one data region of the file, read ahead in blocks, for a reader that moves
// forward through it.
class RegionReader {
public:
    RegionReader(int fd, DataRegion region) : fd_(fd), region_(region), base_(region.begin) {}

    // The bytes [at, at + n): empty when they pass the region's end (or the file's, cut under
    // us). Valid until the next call.
    std::string_view view(std::uint64_t at, std::uint64_t n) {
        if (at < base_ || n > region_.end - std::min(region_.end, at)) return {};
        if (at + n > base_ + buffer_.size()) {
            if (at - base_ > block) {  // what is behind is not read again
                buffer_.erase(0, at - base_);
                base_ = at;
            }
            const auto upto = std::min(region_.end, std::max(at + n, base_ + buffer_.size() + block));
            buffer_ += read_at(fd_, base_ + buffer_.size(), upto);
            if (at + n > base_ + buffer_.size()) return {};
        }
        return std::string_view(buffer_).substr(at - base_, n);
    }
    const DataRegion& region() const { return region_; }

private:
    int fd_;
    DataRegion region_;
    std::uint64_t base_;  // the file offset of buffer_[0]
    std::string buffer_;
};

// What is at `at` in the region: a whole frame (its entry and length), the start of a frame
// the region ends before (one being written, or torn by a hole after it), or no frame.
struct Frame {
    enum class Kind { whole, unfinished, none } kind = Kind::none;
    LogEntry entry;
    std::uint64_t length = 0;
};
Frame frame_at(RegionReader& reader, std::uint64_t at) {
    const auto head = reader.view(at, size_bytes);
    if (head.empty()) return {Frame::Kind::unfinished};
    const auto size = big_endian(head);
    if (size > max_entry_bytes) return {};
    const auto length = 2 * size_bytes + size;
    const auto frame = reader.view(at, length);
    if (frame.empty()) return {length > reader.region().end - at ? Frame::Kind::unfinished : Frame::Kind::none};
    if (big_endian(frame.substr(size_bytes + size)) != size) return {};
    auto entry = decode_local_entry(frame.substr(size_bytes, size));
    if (!entry) return {};
    return {Frame::Kind::whole, std::move(*entry), length};
}

// The frame that ends at `end`, found by its trailing size: whole, torn (it would begin
// before `region_begin`, in the hole before the region), or none (no frame ends there).
struct FrameBefore {
    enum class Kind { whole, torn, none } kind = Kind::none;
    LogEntry entry;
    std::uint64_t begin = 0;
};
FrameBefore frame_ending_at(int fd, std::uint64_t region_begin, std::uint64_t end) {
    if (end - region_begin < 2 * size_bytes) return {FrameBefore::Kind::torn};
    const auto tail = read_at(fd, end - size_bytes, end);
    if (tail.size() < size_bytes) return {};
    const auto size = big_endian(tail);
    if (size > max_entry_bytes) return {};
    if (end - region_begin < 2 * size_bytes + size) return {FrameBefore::Kind::torn};
    const auto begin = end - 2 * size_bytes - size;
    const auto frame = read_at(fd, begin, end);
    if (frame.size() != end - begin || big_endian(frame) != size) return {};
    auto entry = decode_local_entry(std::string_view(frame).substr(size_bytes, size));
    if (!entry) return {};
    return {FrameBefore::Kind::whole, std::move(*entry), begin};
}

}  // namespace

const LogFormat local_format{read_local_entries, tail_local_entries, local_cut_before};

std::optional<LogEntry> decode_local_entry(std::string_view entry) {
    Wire wire{entry};
    std::string_view source, line;
    bool partial = false, last = false;
    while (!wire.data.empty()) {
        std::uint64_t key = 0, value = 0;
        if (!wire.varint(key)) return std::nullopt;
        if (key == (1 << 3 | 2)) {
            if (!wire.bytes(source)) return std::nullopt;
        } else if (key == (3 << 3 | 2)) {
            if (!wire.bytes(line)) return std::nullopt;
        } else if (key == (4 << 3 | 0)) {
            if (!wire.varint(value)) return std::nullopt;
            partial = value != 0;
        } else if (key == (5 << 3 | 2)) {
            std::string_view metadata;
            if (!wire.bytes(metadata)) return std::nullopt;
            const auto metadata_last = decode_last(metadata);
            if (!metadata_last) return std::nullopt;
            last = *metadata_last;
        } else if ((key >> 3) == 0 || !wire.skip(key & 7)) {  // field 0: zeros of a hole
            return std::nullopt;
        }
    }
    if (source != "stdout" && source != "stderr") return std::nullopt;
    LogEntry out{std::string(line), source == "stderr"};
    if (!partial || last) out.text += '\n';
    return out;
}

std::uint64_t read_local_entries(int fd, std::uint64_t offset, const EntrySink& sink) {
    std::uint64_t next = offset;
    for (const auto& region : data_regions(fd, offset, file_size(fd))) {
        RegionReader reader(fd, region);
        // `offset` is where a frame ended; a region that begins past a hole begins inside one.
        bool in_step = region.begin == offset;
        for (auto at = region.begin; at < region.end;) {
            auto frame = frame_at(reader, at);
            if (frame.kind == Frame::Kind::whole) {
                sink(frame.entry);
                at += frame.length;
                next = at;
                in_step = true;
                continue;
            }
            if (in_step && frame.kind == Frame::Kind::unfinished) break;  // for a later call
            // No frame starts here (the one a hole tore, bytes that do not frame): one byte on.
            in_step = false;
            ++at;
        }
    }
    return next;
}

std::vector<LogEntry> tail_local_entries(int fd, std::size_t n, std::uint64_t* follow_from) {
    const auto regions = data_regions(fd, 0, file_size(fd));
    if (regions.empty()) {
        if (follow_from) *follow_from = 0;
        return {};
    }
    std::deque<LogEntry> kept;
    bool framed = true;  // every step back found a whole frame or the torn one past a hole
    for (auto region = regions.rbegin(); region != regions.rend() && framed; ++region) {
        // Backward from the region's end, each frame found by its trailing size. The last
        // region's end must end a frame (it is where following starts) even for n = 0.
        for (auto end = region->end;
             end > region->begin && (kept.size() < n || (region == regions.rbegin() && end == region->end));) {
            // A frame torn by a hole begins in it: at the region's end, or with no hole before
            // the region (it starts the file), what looks torn is not a frame's end.
            auto frame = frame_ending_at(fd, region->begin, end);
            if (frame.kind == FrameBefore::Kind::none ||
                (frame.kind == FrameBefore::Kind::torn && (end == region->end || region->begin == 0)))
                framed = false;
            if (frame.kind != FrameBefore::Kind::whole) break;
            if (kept.size() < n) kept.push_front(std::move(frame.entry));
            end = frame.begin;
        }
        if (kept.size() >= n) break;
    }
    if (framed) {
        if (follow_from) *follow_from = regions.back().end;
        return {std::make_move_iterator(kept.begin()), std::make_move_iterator(kept.end())};
    }
    // An end that is not a frame's (one being written as we read, or bytes that do not frame):
    // the file is read forward, its last n entries kept.
    kept.clear();
    const auto after = read_local_entries(fd, 0, [&](const LogEntry& entry) {
        kept.push_back(entry);
        if (kept.size() > n) kept.pop_front();
    });
    if (follow_from) *follow_from = after;
    return {std::make_move_iterator(kept.begin()), std::make_move_iterator(kept.end())};
}

bool local_cut_before(int fd, std::uint64_t offset) {
    if (offset < 2 * size_bytes || file_size(fd) < offset) return true;
    const auto tail = read_at(fd, offset - size_bytes, offset);
    const std::string zeros(size_bytes, '\0');
    if (tail.size() < size_bytes) return true;
    if (tail == zeros) return false;  // punched: no frame has size 0
    const auto size = big_endian(tail);
    if (size > max_entry_bytes || offset < 2 * size_bytes + size) return true;
    const auto head_at = offset - 2 * size_bytes - size;
    const auto head = read_at(fd, head_at, head_at + size_bytes);
    return head != zeros && (head.size() < size_bytes || big_endian(head) != size);
}

}  // namespace reaperctl
