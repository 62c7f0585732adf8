// A JSON-lines file that a benchmark or check fills row by row (--json): opened before any work, so
// a path that cannot be written is refused before anything is timed, and each line flushed as it is
// written, so a run cut short (a GPU lease's stage limit, a kill) keeps every row it finished.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

#include "util/json.h"

namespace darkformer {

class JsonLinesFile {
 public:
  // Truncates `path`; an empty path writes nothing. Throws Error naming `flag` and the path where
  // the file cannot be opened for writing.
  explicit JsonLinesFile(std::string path, const std::string& flag = "--json");

  // One line, on disk when this returns (an empty path: nothing).
  void Write(const Json& line);

  const std::string& path() const { return path_; }
  int64_t lines() const { return lines_; }

 private:
  std::string path_, flag_;
  std::ofstream out_;
  int64_t lines_ = 0;
};

}  // namespace darkformer
