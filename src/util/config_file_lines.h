// Where each key of a config read from files was last written, for error messages. Merging a
// `base:` file or a --set copies nodes without their marks, so RunConfig::Load records every key's
// file and line as it loads and declares them for as long as it reads (a ScopedFileOrigins on its
// stack, this thread only); ValueOrigin (util/config_reader.h) then names the line, and the file
// where it is not the one the user named.
#pragma once

#include <map>
#include <string>

namespace darkformer {

struct KeyLine {
  std::string file;
  int line = 0;  // 1-based
};

class ScopedFileOrigins {
 public:
  ScopedFileOrigins(std::string top_file, std::map<std::string, KeyLine> lines);
  ~ScopedFileOrigins();
  ScopedFileOrigins(const ScopedFileOrigins&) = delete;
  ScopedFileOrigins& operator=(const ScopedFileOrigins&) = delete;

  // " (line N)", or " (line N of FILE)" where a base file gave `key_path`; "" where no file did.
  std::string Origin(const std::string& key_path) const;

 private:
  std::string top_file_;
  std::map<std::string, KeyLine> lines_;
  const ScopedFileOrigins* previous_;
};

}  // namespace darkformer
