// A JSON-lines file written row by row (see json_lines.h).
#include "util/json_lines.h"

#include <utility>

#include "util/error.h"

namespace darkformer {

JsonLinesFile::JsonLinesFile(std::string path, const std::string& flag) : path_(std::move(path)), flag_(flag) {
  if (path_.empty()) return;
  out_.open(path_, std::ios::out | std::ios::trunc);
  DF_CHECK(out_.good(), flag_ << ": cannot write '" << path_ << "'");
}

void JsonLinesFile::Write(const Json& line) {
  if (path_.empty()) return;
  out_ << ToJsonLine(line) << '\n';
  out_.flush();
  DF_CHECK(out_.good(), flag_ << ": writing '" << path_ << "' failed after " << lines_ << " lines (disk full?)");
  ++lines_;
}

}  // namespace darkformer
