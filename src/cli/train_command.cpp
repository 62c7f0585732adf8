// `darkformer train --config run.yaml [--set key=value ...]`: pretrain or finetune; resumes from
// the run directory's latest checkpoint when there is one.
#include "cli/commands.h"
#include "train/trainer.h"

namespace darkformer {

void AddTrainCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train or finetune a model from a run config");
  static std::string config_path;
  static std::vector<std::string> overrides;
  cmd->add_option("--config", config_path, "run config YAML")->required();
  cmd->add_option("--set", overrides, "override a key: a.b.c=value (repeatable)");
  cmd->callback([] {
    auto config = RunConfig::Load(config_path, overrides);
    InstallStopSignalHandlers();
    Trainer trainer(std::move(config));
    const int code = trainer.Run();
    if (code != kExitOk) throw CLI::RuntimeError(code);
  });
}

}  // namespace darkformer
