// oam_line_framer.cpp
#include "oam_line_framer.h"

namespace oam {

void LineFramer::feed(std::string_view data, const LineHandler& onLine) {
    while (!data.empty()) {
        const std::size_t nl = data.find('\n');
        const std::string_view chunk = data.substr(0, nl);  // all of it when no newline
        if (!discarding_) {
            if (max_ != 0 && buf_.size() + chunk.size() > max_) {
                discarding_ = true;
                buf_.clear();
                buf_.shrink_to_fit();
                ++dropped_;
            } else {
                buf_.append(chunk.data(), chunk.size());
            }
        }
        if (nl == std::string_view::npos) return;
        data.remove_prefix(nl + 1);
        if (discarding_) {
            discarding_ = false;  // resynchronised at this newline
            continue;
        }
        emit(onLine);
    }
}

void LineFramer::finish(const LineHandler& onLine) {
    if (discarding_) {
        discarding_ = false;
        buf_.clear();
        return;
    }
    emit(onLine);
}

void LineFramer::emit(const LineHandler& onLine) {
    if (!buf_.empty() && buf_.back() == '\r') buf_.pop_back();
    if (buf_.empty()) return;
    std::string line;
    line.swap(buf_);
    onLine(std::move(line));
}

}  // namespace oam
