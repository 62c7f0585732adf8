// Launching a sweep's runs as child processes and keeping its state and tables (see sweep_runner.h).
#include "sweep/sweep_runner.h"

#include <torch/cuda.h>

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <map>
#include <thread>

#include "train/run_config.h"
#include "train/trainer.h"
#include "util/error.h"

namespace darkformer {

namespace fs = std::filesystem;

namespace {

std::string StatePath(const SweepSpec& spec) { return (fs::path(spec.output) / "sweep_state.yaml").string(); }

std::vector<std::string> GridKeys(const SweepSpec& spec) {
  std::vector<std::string> keys;
  for (const auto& axis : spec.grid) keys.push_back(axis.key);
  return keys;
}

// fork + exec with stdout/stderr appended to <run dir>/train.log. Returns the child's pid.
// `cuda_visible` non-empty: the child's CUDA_VISIBLE_DEVICES.
pid_t Launch(const std::vector<std::string>& argv, const std::string& run_dir, const std::string& cuda_visible) {
  fs::create_directories(run_dir);
  const auto log_path = (fs::path(run_dir) / "train.log").string();
  const pid_t pid = fork();
  DF_CHECK(pid >= 0, "fork failed for run " << run_dir);
  if (pid == 0) {
    const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
    if (!cuda_visible.empty()) setenv("CUDA_VISIBLE_DEVICES", cuda_visible.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());  // a bare launcher name (torchrun) is looked up on PATH
    _exit(127);  // exec failed
  }
  return pid;
}

int ExitCodeOf(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

// Logs every run's status and returns the indices of those that still need running.
std::vector<size_t> ListPendingRuns(const std::vector<SweepRecord>& records) {
  std::vector<size_t> todo;
  for (size_t i = 0; i < records.size(); ++i) {
    const auto& r = records[i];
    spdlog::info("sweep run {:>2}/{}: {:<40} {}", i + 1, records.size(), r.point.name, RunStatusName(r.status));
    if (NeedsRun(r.status)) todo.push_back(i);
  }
  return todo;
}

// --dry-run: the command of every pending run, quoted, and nothing launched.
void LogDryRun(const SweepSpec& spec, const SweepOptions& options, const std::vector<SweepRecord>& records,
               const std::vector<size_t>& todo) {
  for (const auto i : todo) {
    std::string line;
    for (const auto& a : RunCommand(spec, records[i].point, options.program)) line += "'" + a + "' ";
    spdlog::info("would run: {}", line);
  }
}

// A sweep being run: the runs still to start, the children running and the state file's contents.
struct ActiveSweep {
  ActiveSweep(const SweepSpec& spec, const SweepOptions& options, int64_t parallel, std::vector<SweepRecord>* records,
              SweepState state, std::vector<size_t> todo)
      : spec(spec), options(options), parallel(parallel), records(*records), state(std::move(state)),
        todo(std::move(todo)) {}

  const SweepSpec& spec;
  const SweepOptions& options;
  const int64_t parallel;
  std::vector<SweepRecord>& records;
  SweepState state;
  const std::vector<size_t> todo;   // indices into records, in launch order
  size_t next = 0;                  // the next entry of todo to launch
  std::map<pid_t, size_t> running;  // child pid -> index into records
  bool forwarded = false;           // whether a stop request was passed on to the children
  // Device slots (CUDA_VISIBLE_DEVICES values, disjoint), the free ones, and each child's slot.
  std::vector<std::string> slots;
  std::vector<bool> slot_busy;
  std::map<pid_t, size_t> slot_of;
};

// The device sets of a sweep's runs: `devices` (or every CUDA device for `auto`) cut into groups of
// one run's ranks. None without devices, or on a machine without CUDA for `auto`.
std::vector<std::string> DeviceSlots(const SweepSpec& spec) {
  std::vector<int64_t> devices = spec.devices;
  if (spec.devices_auto) {
    for (int64_t d = 0; d < static_cast<int64_t>(torch::cuda::device_count()); ++d) devices.push_back(d);
  }
  const size_t group = static_cast<size_t>(std::max<int64_t>(1, spec.launcher.nproc_per_node));
  DF_CHECK(devices.empty() || devices.size() >= group, "config key 'devices' lists " << devices.size()
                                                            << " devices, fewer than one run's " << group << " ranks");
  std::vector<std::string> slots;
  for (size_t first = 0; first + group <= devices.size(); first += group) {
    std::string set;
    for (size_t i = first; i < first + group; ++i) set += (set.empty() ? "" : ",") + std::to_string(devices[i]);
    slots.push_back(set);
  }
  return slots;
}

// Starts the next pending run and records it as running in the state file.
void LaunchNext(ActiveSweep* sweep) {
  const size_t index = sweep->todo[sweep->next++];
  auto& r = sweep->records[index];
  const auto argv = RunCommand(sweep->spec, r.point, sweep->options.program);
  std::string devices;
  size_t slot = 0;
  if (!sweep->slots.empty()) {  // the first free slot: round-robin as runs finish
    while (sweep->slot_busy[slot]) ++slot;
    devices = sweep->slots[slot];
  }
  const pid_t pid = Launch(argv, r.dir, devices);
  sweep->running[pid] = index;
  if (!sweep->slots.empty()) {
    sweep->slot_busy[slot] = true;
    sweep->slot_of[pid] = slot;
  }
  auto& entry = sweep->state.runs[r.point.name];
  entry.status = "running";
  ++entry.attempts;
  sweep->state.Save(StatePath(sweep->spec));
  spdlog::info("sweep: started {} (pid {}, log {}/train.log{})", r.point.name, pid, r.dir,
               devices.empty() ? "" : ", CUDA_VISIBLE_DEVICES=" + devices);
}

// Starts pending runs until `parallel` are running or none is left.
void LaunchWhileRoom(ActiveSweep* sweep) {
  while (sweep->next < sweep->todo.size() && static_cast<int64_t>(sweep->running.size()) < sweep->parallel) {
    LaunchNext(sweep);
  }
}

// Asks every running child, once, to checkpoint and stop: a terminal's Ctrl-C reaches the
// children too, but kill/SIGTERM sent to the sweep may not.
void ForwardStop(ActiveSweep* sweep) {
  if (sweep->forwarded) return;
  for (const auto& [pid, index] : sweep->running) kill(pid, SIGINT);
  sweep->forwarded = true;
}

// One line on how a run ended, with its summary when it wrote one.
void LogRunResult(const SweepRecord& r) {
  if (r.summary) {
    spdlog::info("sweep: {} {} (exit {}): {} steps, final loss {:.4f}, best accuracy {:.4f}, {} spikes, {:.0f} s",
                 r.point.name, RunStatusName(r.status), r.exit_code, r.summary->steps, r.summary->final_loss,
                 r.summary->best_eval_accuracy, r.summary->spikes, r.summary->wall_seconds);
  } else {
    spdlog::warn("sweep: {} {} (exit {}); see {}/train.log", r.point.name, RunStatusName(r.status), r.exit_code,
                 r.dir);
  }
}

// Classifies a run whose child exited, then saves the state file and tables so a kill of the
// sweep loses nothing.
void FinishRun(ActiveSweep* sweep, size_t index, int wait_status) {
  auto& r = sweep->records[index];
  r.exit_code = ExitCodeOf(wait_status);
  r.summary = ReadRunSummary(r.dir);
  r.status = ClassifyRun(r.dir, r.summary, r.target_steps, r.exit_code);
  auto& entry = sweep->state.runs[r.point.name];
  entry.exit_code = r.exit_code;
  entry.status = RunStatusName(r.status);
  sweep->state.Save(StatePath(sweep->spec));
  WriteSweepSummaries(sweep->spec, sweep->records);
  LogRunResult(r);
}

// Reaps one exited child if there is one; otherwise waits a moment before the next poll.
void ReapOne(ActiveSweep* sweep) {
  int wait_status = 0;
  const pid_t done = waitpid(-1, &wait_status, WNOHANG);
  if (done <= 0 || !sweep->running.count(done)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return;
  }
  const size_t index = sweep->running[done];
  sweep->running.erase(done);
  if (const auto it = sweep->slot_of.find(done); it != sweep->slot_of.end()) {
    sweep->slot_busy[it->second] = false;
    sweep->slot_of.erase(it);
  }
  FinishRun(sweep, index, wait_status);
}

// Launches and reaps children until every run is done or, after a stop request, until the
// running ones have exited.
void RunChildren(ActiveSweep* sweep) {
  while (sweep->next < sweep->todo.size() || !sweep->running.empty()) {
    const bool stopping = g_stop_requested.load();
    if (!stopping) LaunchWhileRoom(sweep);
    if (stopping && sweep->running.empty()) break;  // the rest stays pending for the next invocation
    if (stopping) ForwardStop(sweep);
    ReapOne(sweep);
  }
}

// Logs how many runs ended which way; returns the number that failed.
int LogTally(const SweepSpec& spec, const std::vector<SweepRecord>& records) {
  int finished = 0, diverged = 0, failed = 0;
  for (const auto& r : records) {
    finished += r.status == RunStatus::kFinished;
    diverged += r.status == RunStatus::kDiverged;
    failed += r.status == RunStatus::kFailed;
  }
  spdlog::info("sweep: {} finished, {} diverged, {} failed, {} not done; tables in {}/summary.{{csv,md}}", finished,
               diverged, failed, records.size() - finished - diverged - failed, spec.output);
  return failed;
}

}  // namespace

std::vector<std::string> RunCommand(const SweepSpec& spec, const SweepPoint& point, const std::string& program) {
  std::vector<std::string> argv;
  if (spec.launcher.nproc_per_node > 0) {
    // torchrun starts the ranks and forwards the sweep's stop request (SIGTERM) to them.
    argv = {spec.launcher.torchrun};
    if (spec.launcher.args.empty()) argv.push_back("--standalone");
    argv.insert(argv.end(), spec.launcher.args.begin(), spec.launcher.args.end());
    argv.insert(argv.end(), {"--nproc-per-node", std::to_string(spec.launcher.nproc_per_node), "--no-python"});
  }
  argv.insert(argv.end(), {program, "train", "--config", spec.base});
  for (const auto& o : RunOverrides(spec, point)) {
    argv.push_back("--set");
    argv.push_back(o);
  }
  return argv;
}

std::vector<SweepRecord> InspectSweep(const SweepSpec& spec, bool look_only) {
  const auto points = ExpandGrid(spec.grid);
  std::vector<std::pair<std::string, std::string>> renames;
  for (const auto& point : points) renames.emplace_back(point.legacy_name, point.name);
  if (!look_only) MigrateLegacyRunDirs(spec.output, renames);  // before the state is read: it renames entries too
  const auto state = SweepState::Load(StatePath(spec));
  std::vector<SweepRecord> records;
  for (const auto& point : points) {
    SweepRecord r;
    r.point = point;
    r.dir = RunDir(spec, point);
    const auto legacy = (fs::path(spec.output) / point.legacy_name).string();
    const bool long_named = look_only && !fs::exists(r.dir) && fs::is_directory(legacy);
    if (long_named) r.dir = legacy;  // a dry run changes nothing: it reports the run where it is
    try {
      r.target_steps = RunConfig::Load(spec.base, RunOverrides(spec, point)).train.steps;
    } catch (const Error& e) {
      Fail("sweep run '" + point.name + "': " + e.what());
    }
    const auto it = state.runs.find(long_named ? point.legacy_name : point.name);
    r.exit_code = it == state.runs.end() ? -1 : it->second.exit_code;
    r.summary = ReadRunSummary(r.dir);
    r.status = ClassifyRun(r.dir, r.summary, r.target_steps, r.exit_code);
    records.push_back(std::move(r));
  }
  return records;
}

void WriteSweepSummaries(const SweepSpec& spec, const std::vector<SweepRecord>& records) {
  fs::create_directories(spec.output);
  const auto keys = GridKeys(spec);
  WriteSummaryCsv(records, keys, (fs::path(spec.output) / "summary.csv").string());
  const auto title = "Sweep " + (spec.path.empty() ? spec.output : spec.path) + " (base " + spec.base + ")";
  WriteSummaryMarkdown(records, keys, (fs::path(spec.output) / "summary.md").string(), title);
}

int RunSweep(const SweepSpec& spec, const SweepOptions& options) {
  auto records = InspectSweep(spec, /*look_only=*/options.dry_run);
  int64_t parallel = options.parallel > 0 ? options.parallel : spec.parallel;
  const auto slots = DeviceSlots(spec);
  if (!slots.empty() && parallel > static_cast<int64_t>(slots.size())) {
    spdlog::warn("sweep: parallel {} > {} device set(s): {} at a time", parallel, slots.size(), slots.size());
    parallel = static_cast<int64_t>(slots.size());
  }
  std::vector<size_t> todo = ListPendingRuns(records);
  spdlog::info("sweep: {} runs, {} to run ({} at a time), output {}", records.size(), todo.size(), parallel,
               spec.output);
  if (options.dry_run) {
    LogDryRun(spec, options, records, todo);
    return 0;
  }
  fs::create_directories(spec.output);
  ActiveSweep sweep(spec, options, parallel, &records, SweepState::Load(StatePath(spec)), std::move(todo));
  sweep.slots = slots;
  sweep.slot_busy.assign(slots.size(), false);
  WriteSweepSummaries(spec, records);

  InstallStopSignalHandlers();
  RunChildren(&sweep);
  WriteSweepSummaries(spec, records);
  const int failed = LogTally(spec, records);
  if (g_stop_requested.load()) return kExitInterrupted;
  return failed > 0 ? 1 : 0;
}

}  // namespace darkformer
