// The run directory's files (see run_log.h).
#include "train/run_log.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "util/atomic_file.h"
#include "util/error.h"

namespace darkformer {

namespace fs = std::filesystem;

namespace {

int OpenForAppend(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  DF_CHECK(fd >= 0, path << ": cannot open for writing: " << std::strerror(errno));
  return fd;
}

// Keeps the lines of a JSONL file whose `key` ("step", "rewind") is at most `last`; lines without
// it are kept, lines that do not parse (torn by a kill) are dropped.
void TruncateJsonlAfter(const std::string& path, const char* key, int64_t last) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  bool dropped = false;
  while (std::getline(in, line)) {
    const auto record = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool torn = record.is_discarded() || !record.is_object();
    if (torn || JsonGet<int64_t>(record, key, 0) > last) {
      dropped = true;
      continue;
    }
    kept += line + "\n";
  }
  in.close();
  if (dropped) WriteFileAtomically(path, kept);
}

}  // namespace

RunLog::RunLog(std::string dir) : dir_(std::move(dir)) {
  DF_CHECK(!fs::exists(dir_) || fs::is_directory(dir_),
           "config key 'log.dir': " << dir_ << " exists and is not a directory");
  std::error_code error;
  fs::create_directories(dir_, error);
  DF_CHECK(!error, "config key 'log.dir': cannot create run directory " << dir_ << ": " << error.message());
  const auto lock_path = Path(".lock");
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  DF_CHECK(lock_fd_ >= 0, lock_path << ": cannot create the run lock: " << std::strerror(errno));
  // flock is released by the kernel when the process dies, so a killed run never leaves a stale lock.
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int saved = errno;
    std::string holder;
    std::ifstream(lock_path) >> holder;
    ::close(lock_fd_);
    lock_fd_ = -1;
    DF_CHECK(saved != EWOULDBLOCK, "run directory " << dir_ << " is locked by another darkformer process (pid "
                                                    << (holder.empty() ? "unknown" : holder) << ", lock file "
                                                    << lock_path << "); wait for it or use another log.dir");
    Fail(lock_path + ": cannot lock: " + std::strerror(saved));
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(lock_fd_, 0) != 0 || ::write(lock_fd_, pid.data(), pid.size()) < 0) {
    // The pid is only informational; the lock itself is held.
  }
}

RunLog::~RunLog() {
  for (const int fd : {metrics_fd_, spikes_fd_, rewinds_fd_, lock_fd_}) {
    if (fd >= 0) ::close(fd);
  }
}

std::string RunLog::Path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

void RunLog::WriteConfig(const YAML::Node& resolved) {
  YAML::Emitter out;
  out << resolved;
  WriteFileAtomically(Path("config.yaml"), std::string(out.c_str()) + "\n");
}

void RunLog::OpenAfterStep(int64_t step, int64_t rewinds) {
  for (int* fd : {&metrics_fd_, &spikes_fd_, &rewinds_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
  for (const char* name : {"metrics.jsonl", "spikes.jsonl", "rewinds.jsonl"}) {
    const auto path = Path(name);
    DF_CHECK(!fs::is_directory(path), path << ": is a directory; the run cannot write its log there");
  }
  TruncateJsonlAfter(Path("metrics.jsonl"), "step", step);
  TruncateJsonlAfter(Path("spikes.jsonl"), "step", step);
  TruncateJsonlAfter(Path("rewinds.jsonl"), "rewind", rewinds);
  metrics_fd_ = OpenForAppend(Path("metrics.jsonl"));
  spikes_fd_ = OpenForAppend(Path("spikes.jsonl"));
  if (rewinds > 0 || fs::exists(Path("rewinds.jsonl"))) rewinds_fd_ = OpenForAppend(Path("rewinds.jsonl"));
}

void RunLog::Append(int fd, const std::string& name, const Json& record) {
  DF_CHECK(fd >= 0, "RunLog: " << name << " written before OpenAfterStep");
  const std::string line = ToJsonLine(record) + "\n";
  size_t written = 0;
  while (written < line.size()) {
    const ssize_t n = ::write(fd, line.data() + written, line.size() - written);
    if (n < 0 && errno == EINTR) continue;
    DF_CHECK(n > 0, Path(name) << ": write failed: " << std::strerror(n < 0 ? errno : EIO));
    written += static_cast<size_t>(n);
  }
}

void RunLog::Metrics(const Json& record) { Append(metrics_fd_, "metrics.jsonl", record); }
void RunLog::Spike(const Json& event) { Append(spikes_fd_, "spikes.jsonl", event); }

void RunLog::Rewind(const Json& record) {
  if (rewinds_fd_ < 0) rewinds_fd_ = OpenForAppend(Path("rewinds.jsonl"));  // made by the first rewind
  Append(rewinds_fd_, "rewinds.jsonl", record);
}

std::vector<Json> RunLog::SpikesBetween(int64_t first, int64_t last) const {
  std::vector<Json> events;
  std::ifstream in(Path("spikes.jsonl"));
  std::string line;
  while (std::getline(in, line)) {
    const auto event = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!event.is_object()) continue;
    const auto step = JsonGet<int64_t>(event, "step", 0);
    if (step >= first && step <= last) events.push_back(event);
  }
  return events;
}

void RunLog::Nonfinite(const Json& record) { WriteFileAtomically(Path("nonfinite.json"), ToJsonLine(record) + "\n"); }

void RunLog::Summary(const RunSummary& summary) {
  WriteFileAtomically(Path("summary.json"), ToJsonLine(summary.ToJson()) + "\n");
}

}  // namespace darkformer
