// `darkformer eval --config run.yaml [--checkpoint path|run_dir]`: loss, perplexity and
// next-token accuracy of a checkpoint on the validation split (labelled shards: on exactly their
// labelled positions), as one JSON line on stdout.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <iostream>

#include "cli/commands.h"
#include "model/weights_io.h"
#include "train/fit_check.h"
#include "train/model_loading.h"
#include "train/trainer.h"
#include "util/json.h"

namespace darkformer {

void AddEvalCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("eval", "Evaluate a checkpoint on the validation split");
  static std::string config_path, checkpoint;
  static std::vector<std::string> overrides;
  static int64_t batches = 0;
  static std::string split = "val";
  cmd->add_option("--config", config_path, "run config YAML")->required();
  cmd->add_option("--checkpoint", checkpoint, "weights .h5 or a run directory (default: the config's log.dir)");
  cmd->add_option("--set", overrides, "override a key: a.b.c=value (repeatable)");
  cmd->add_option("--batches", batches,
                  "validation batches (default: eval.batches; labelled records: all of them, once)");
  cmd->add_option("--split", split, "train or val");
  cmd->callback([] {
    auto config = RunConfig::Load(config_path, overrides);
    config.train.init_from = checkpoint.empty() ? config.log.dir : checkpoint;
    // Sizes first (as every command), then the checkpoint, naming what the user gave (or left
    // out), not train.init_from, which eval only borrows.
    CheckRunFits(config, Workload::kForward, ResolveDevice(config));
    ResolveWeightsPath(config.train.init_from, checkpoint.empty()
                                                   ? "config key 'log.dir' (eval's checkpoint when --checkpoint is not given)"
                                                   : std::string("--checkpoint"));
    Trainer trainer(config);
    const auto loader = OpenEvalSource(config.data, split);
    DF_CHECK(loader, "--split " << split << ": the data has no such split");
    // A benchmark's labelled records are scored whole (every record once) unless --batches says otherwise.
    const int64_t default_batches = loader->EvaluatedWhole() ? loader->batches_per_epoch() : config.eval.batches;
    DF_CHECK(batches >= 0, "--batches must be >= 1 (or left out), got " << batches);
    int64_t requested = batches > 0 ? batches : default_batches;
    // As lm-eval's --limit and torchtitan's validation steps: more than the split holds is one pass.
    if (requested > loader->batches_per_epoch()) {
      spdlog::info("{} asks for {} batches; the {} split holds {}: evaluating one pass over it",
                   batches > 0 ? "--batches" : "eval.batches", requested, split, loader->batches_per_epoch());
      requested = loader->batches_per_epoch();
    }
    const auto r = trainer.EvaluateFrom(*loader, requested);
    // The result alone on stdout (logs go to stderr), so scripts can parse it.
    std::cout << ToJsonLine({{"checkpoint", config.train.init_from}, {"split", split}, {"loss", r.loss},
                             {"perplexity", r.perplexity}, {"accuracy", r.accuracy}, {"tokens", r.tokens}})
              << std::endl;
  });
}

}  // namespace darkformer
