// Line streaming over zlib's gz* API (see line_reader.h).
#include "data/line_reader.h"

#include <cerrno>
#include <cstring>

#include "util/error.h"

namespace darkformer {
namespace {

constexpr size_t kInitialBuffer = 1 << 20;

}  // namespace

LineReader::LineReader(std::string path) : path_(std::move(path)), buffer_(kInitialBuffer) {
  file_ = gzopen(path_.c_str(), "rb");
  DF_CHECK(file_ != nullptr, path_ << ": cannot open: " << std::strerror(errno));
  // zlib's own input buffer; a larger one halves the read calls on big shards.
  gzbuffer(file_, 256 * 1024);
}

LineReader::~LineReader() {
  if (file_) gzclose(file_);
}

void LineReader::FailDamaged() const {
  Fail(path_ + ": corrupt or truncated gzip after line " + std::to_string(lines_) +
       " (the last complete line read): " + damage_);
}

bool LineReader::Refill() {
  if (!damage_.empty()) FailDamaged();  // the lines before the damage are all read
  if (at_eof_) return false;
  // Keep the unconsumed tail of the current line at the front; grow only for very long lines.
  if (begin_ > 0) {
    std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  if (end_ == buffer_.size()) buffer_.resize(buffer_.size() * 2);
  size_t room = buffer_.size() - end_;
  int got = gzread(file_, buffer_.data() + end_, static_cast<unsigned>(room));
  // A truncated gzip makes gzread return what it could decode (or 0, like a clean end) with
  // Z_BUF_ERROR set, so the error state is checked on every read, not only on a negative return.
  int errnum = Z_OK;
  const char* message = gzerror(file_, &errnum);
  if (got < 0 || (errnum != Z_OK && errnum != Z_STREAM_END)) {
    damage_ = std::string(message && *message ? message : "read error") +
              (errnum == Z_ERRNO ? std::string(" (") + std::strerror(errno) + ")" : std::string());
    if (got <= 0) FailDamaged();
    // The bytes decoded before the damage still hold complete lines: hand those out first.
  }
  if (got == 0) {
    at_eof_ = true;
    return false;
  }
  end_ += static_cast<size_t>(got);
  return true;
}

bool LineReader::Next(std::string_view* line) {
  size_t scanned = begin_;
  while (true) {
    const char* start = buffer_.data() + scanned;
    const void* newline = std::memchr(start, '\n', end_ - scanned);
    if (newline) {
      size_t at = static_cast<const char*>(newline) - buffer_.data();
      *line = std::string_view(buffer_.data() + begin_, at - begin_);
      begin_ = at + 1;
      ++lines_;
      return true;
    }
    size_t scanned_len = end_ - begin_;
    if (!Refill()) {
      if (begin_ == end_) return false;
      // The last line without a trailing newline.
      *line = std::string_view(buffer_.data() + begin_, end_ - begin_);
      begin_ = end_;
      ++lines_;
      return true;
    }
    scanned = begin_ + scanned_len;  // Refill moved the tail to the front
  }
}

}  // namespace darkformer
