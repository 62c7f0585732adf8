// A sweep's memory across invocations: per-run exit codes, statuses and attempts, kept in
// <output>/sweep_state.yaml.
#pragma once

#include <map>
#include <string>

namespace darkformer {

// Per-run exit codes and statuses, kept in <output>/sweep_state.yaml across sweep invocations.
struct SweepState {
  struct Entry {
    std::string status;
    int exit_code = -1;
    int attempts = 0;
  };
  std::map<std::string, Entry> runs;
  static SweepState Load(const std::string& path);  // empty when absent
  void Save(const std::string& path) const;         // written via a temp file and rename
};

}  // namespace darkformer
