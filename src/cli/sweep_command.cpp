// `darkformer sweep --config sweep.yaml [--set key=value ...] [--parallel N] [--dry-run | --status]`:
// runs a grid of training runs over a base run config, one child process per run; resumable.
#include <spdlog/spdlog.h>

#include <filesystem>

#include "cli/commands.h"
#include "sweep/sweep_runner.h"
#include "util/error.h"

namespace darkformer {

void AddSweepCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("sweep", "Run a grid of training runs (kernel x lr x seed ...) over a base run config");
  static std::string config_path;
  static std::vector<std::string> overrides;
  static SweepOptions options;
  static bool status_only = false;
  cmd->add_option("--config", config_path, "sweep YAML (base, output, grid, fixed, parallel)")->required();
  cmd->add_option("--set", overrides, "override a key of the sweep file: output=runs/x, fixed.train.steps=5 (repeatable)");
  cmd->add_option("--parallel", options.parallel, "runs at a time (default: the sweep file's `parallel`)");
  cmd->add_flag("--dry-run", options.dry_run, "list the runs and the commands that would run, launch nothing");
  cmd->add_flag("--status", status_only, "write the summary tables from the run directories, launch nothing");
  cmd->callback([cmd] {
    // 0 inside SweepOptions means "the file's value"; given on the command line it must be a count.
    DF_CHECK(cmd->count("--parallel") == 0 || options.parallel >= 1,
             "--parallel must be >= 1, got " << options.parallel);
    const auto spec = SweepSpec::Load(config_path, overrides);
    options.program = std::filesystem::read_symlink("/proc/self/exe").string();  // shown in logs, exec'd per run
    if (status_only) {
      const auto records = InspectSweep(spec);
      WriteSweepSummaries(spec, records);
      for (const auto& r : records) spdlog::info("{:<40} {}", r.point.name, RunStatusName(r.status));
      spdlog::info("tables: {}/summary.csv, {}/summary.md", spec.output, spec.output);
      return;
    }
    const int code = RunSweep(spec, options);
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace darkformer
