// Streams the documents of one C4 JSON-lines file, gzip-compressed or plain, one line at a time;
// skips and counts bad lines, and turns a truncated or corrupt gzip into an error naming file:line.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/line_reader.h"

namespace darkformer {

// What reading one source file saw. Every line is exactly one of documents, blank, malformed or
// no_text.
struct C4ReadCounts {
  int64_t lines = 0;
  int64_t documents = 0;   // records with a string "text"
  int64_t blank = 0;       // empty lines (not records; not counted as skipped)
  int64_t malformed = 0;   // not one well-formed JSON object
  int64_t no_text = 0;     // well-formed, but without a string "text"
  int64_t text_bytes = 0;  // UTF-8 bytes of the decoded texts

  int64_t skipped() const { return malformed + no_text; }
  C4ReadCounts& operator+=(const C4ReadCounts& other);
};

// The next line of `lines` that is not blank (IsBlankLine), into `line`; false at the end. Counts in
// `counts` the lines read and the blank ones passed over.
bool NextNonBlankLine(LineReader& lines, std::string_view* line, C4ReadCounts* counts);

class C4Reader {
 public:
  // Opens `path`; zlib reads gzip and plain files alike. Throws darkformer::Error if it cannot.
  explicit C4Reader(std::string path);
  C4Reader(const C4Reader&) = delete;
  C4Reader& operator=(const C4Reader&) = delete;

  // Decodes the next document's text into `text`; false at the end of the file. Throws
  // darkformer::Error naming the file and the last complete line on a truncated or corrupt gzip.
  bool Next(std::string* text);

  const C4ReadCounts& counts() const { return counts_; }
  const std::string& path() const { return lines_.path(); }
  // The first few malformed lines' errors ("path:line: what"), for the log.
  const std::vector<std::string>& first_errors() const { return first_errors_; }

 private:
  LineReader lines_;
  C4ReadCounts counts_;
  std::vector<std::string> first_errors_;
};

}  // namespace darkformer
