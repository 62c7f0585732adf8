// Lines of a gzip-compressed or plain text file, streamed through zlib's gz* API. A truncated or
// corrupt gzip is an error naming the file and the last complete line read (the lines before the
// damage are all handed out first); a line torn by the damage is never returned.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace darkformer {

class LineReader {
 public:
  // Opens `path`; throws darkformer::Error naming it if it cannot.
  explicit LineReader(std::string path);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // Sets `line` to the next line (without '\n'; valid until the next call); false at the end.
  bool Next(std::string_view* line);
  // Lines handed out so far (the 1-based number of the last one).
  int64_t lines() const { return lines_; }
  const std::string& path() const { return path_; }

 private:
  bool Refill();
  [[noreturn]] void FailDamaged() const;

  std::string path_;
  gzFile file_ = nullptr;
  std::vector<char> buffer_;
  size_t begin_ = 0;  // first unconsumed byte of buffer_
  size_t end_ = 0;    // one past the last valid byte of buffer_
  bool at_eof_ = false;
  std::string damage_;  // zlib's error, once seen; the lines decoded before it are still read
  int64_t lines_ = 0;
};

}  // namespace darkformer
