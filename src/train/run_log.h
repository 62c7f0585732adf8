// The run directory as the trainer writes it: a lock held for the run's lifetime (one trainer per
// directory), config.yaml, metrics.jsonl and spikes.jsonl (appended, one JSON object a line),
// nonfinite.json and summary.json (written atomically). Every write is checked: a file that cannot
// be written, or a full disk, is an error naming the file, never a run that silently logs nothing.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <optional>
#include <string>

#include "train/run_summary.h"
#include "util/json.h"

namespace darkformer {

class RunLog {
 public:
  // Creates `dir` if needed and locks it; throws naming the directory when it cannot be created
  // or another process holds the lock.
  explicit RunLog(std::string dir);
  ~RunLog();
  RunLog(const RunLog&) = delete;
  RunLog& operator=(const RunLog&) = delete;

  const std::string& dir() const { return dir_; }
  std::string Path(const std::string& name) const;

  void WriteConfig(const YAML::Node& resolved);
  // Drops the metrics and spike lines of steps after `step` (they run again after a resume or a
  // rewind), the rewinds.jsonl lines after rewind `rewinds`, and lines torn by a kill, then opens
  // the three for appending (again, after a rewind).
  void OpenAfterStep(int64_t step, int64_t rewinds = 0);
  void Metrics(const Json& record);
  void Spike(const Json& event);
  void Rewind(const Json& record);
  // spikes.jsonl's events of steps first..last.
  std::vector<Json> SpikesBetween(int64_t first, int64_t last) const;
  void Nonfinite(const Json& record);
  void Summary(const RunSummary& summary);
  std::optional<RunSummary> ReadSummary() const { return ReadRunSummary(dir_); }

 private:
  void Append(int fd, const std::string& name, const Json& record);

  std::string dir_;
  int lock_fd_ = -1;
  int metrics_fd_ = -1;
  int spikes_fd_ = -1;
  int rewinds_fd_ = -1;
};

}  // namespace darkformer
