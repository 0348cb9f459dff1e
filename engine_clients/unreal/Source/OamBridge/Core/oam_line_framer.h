// oam_line_framer.h - splits a byte stream into lines (engine-agnostic, C++17).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace oam {

// Accumulates bytes from reads of any size and hands out complete lines, without the "\n"
// and without a trailing "\r". Blank lines are skipped. A line longer than maxLineBytes
// (0 = no limit) is dropped up to its newline and counted in droppedLines().
class LineFramer {
public:
    using LineHandler = std::function<void(std::string&&)>;

    explicit LineFramer(std::size_t maxLineBytes = 0) : max_(maxLineBytes) {}

    void feed(std::string_view data, const LineHandler& onLine);
    // At end of stream: hands out an unterminated last line, if there is one.
    void finish(const LineHandler& onLine);

    std::size_t buffered() const { return buf_.size(); }
    std::size_t droppedLines() const { return dropped_; }

private:
    void emit(const LineHandler& onLine);

    std::string buf_;
    std::size_t max_;
    std::size_t dropped_ = 0;
    bool discarding_ = false;
};

}  // namespace oam
