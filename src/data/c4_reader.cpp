// Line-streaming C4 reader over zlib's gz* API (see c4_reader.h).
#include "data/c4_reader.h"

#include <cerrno>
#include <cstring>

#include "data/json_record.h"
#include "util/error.h"

namespace darkformer {
namespace {

constexpr size_t kInitialBuffer = 1 << 20;
constexpr size_t kMaxRememberedErrors = 5;

}  // namespace

C4ReadCounts& C4ReadCounts::operator+=(const C4ReadCounts& other) {
  lines += other.lines;
  documents += other.documents;
  blank += other.blank;
  malformed += other.malformed;
  no_text += other.no_text;
  text_bytes += other.text_bytes;
  return *this;
}

C4Reader::C4Reader(std::string path) : path_(std::move(path)), buffer_(kInitialBuffer) {
  file_ = gzopen(path_.c_str(), "rb");
  DF_CHECK(file_ != nullptr, path_ << ": cannot open: " << std::strerror(errno));
  // zlib's own input buffer; a larger one halves the read calls on big shards.
  gzbuffer(file_, 256 * 1024);
}

C4Reader::~C4Reader() {
  if (file_) gzclose(file_);
}

void C4Reader::FailDamaged() const {
  Fail(path_ + ": corrupt or truncated gzip after line " + std::to_string(counts_.lines) +
       " (the last complete line read): " + damage_);
}

bool C4Reader::Refill() {
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

bool C4Reader::ReadLine(std::string_view* line) {
  size_t scanned = begin_;
  while (true) {
    const char* start = buffer_.data() + scanned;
    const void* newline = std::memchr(start, '\n', end_ - scanned);
    if (newline) {
      size_t at = static_cast<const char*>(newline) - buffer_.data();
      *line = std::string_view(buffer_.data() + begin_, at - begin_);
      begin_ = at + 1;
      return true;
    }
    size_t scanned_len = end_ - begin_;
    if (!Refill()) {
      if (begin_ == end_) return false;
      // The last line without a trailing newline.
      *line = std::string_view(buffer_.data() + begin_, end_ - begin_);
      begin_ = end_;
      return true;
    }
    scanned = begin_ + scanned_len;  // Refill moved the tail to the front
  }
}

bool C4Reader::Next(std::string* text) {
  std::string_view line;
  std::string error;
  while (ReadLine(&line)) {
    ++counts_.lines;
    std::string* error_out = first_errors_.size() < kMaxRememberedErrors ? &error : nullptr;
    switch (ParseC4Record(line, text, error_out)) {
      case JsonRecordStatus::kOk:
        ++counts_.documents;
        counts_.text_bytes += static_cast<int64_t>(text->size());
        return true;
      case JsonRecordStatus::kBlank:
        ++counts_.blank;
        break;
      case JsonRecordStatus::kMalformed:
        ++counts_.malformed;
        if (error_out) first_errors_.push_back(path_ + ":" + std::to_string(counts_.lines) + ": " + error);
        break;
      case JsonRecordStatus::kNoText:
        ++counts_.no_text;
        if (error_out) {
          first_errors_.push_back(path_ + ":" + std::to_string(counts_.lines) + ": no string \"text\" field");
        }
        break;
    }
  }
  return false;
}

}  // namespace darkformer
