// `darkformer config`: what the run config's key declarations generate. `--reference` prints the
// reference config (configs/reference.yaml), `--markdown` the key table (docs/config_keys.md),
// `--resumable` the keys a resume may change.
#include <iostream>

#include "cli/commands.h"
#include "train/config_reference.h"
#include "util/error.h"

namespace darkformer {

void AddConfigCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("config", "Print every run-config key as declared: the reference config or its docs");
  struct Options {
    bool reference = false, markdown = false, resumable = false;
  };
  auto options = std::make_shared<Options>();
  cmd->add_flag("--reference", options->reference, "the reference config: every key, its default and doc line (YAML)");
  cmd->add_flag("--markdown", options->markdown, "with --reference: the key table (Markdown) with accepted values and resume rules");
  cmd->add_flag("--resumable", options->resumable, "the keys (or sections) a resume may change, one per line");
  cmd->callback([options] {
    DF_CHECK(options->reference != options->resumable,
             "config: give one of --reference or --resumable (see config --help)");
    DF_CHECK(!options->markdown || options->reference, "config: --markdown goes with --reference");
    const auto keys = DeclaredRunConfigKeys();
    if (options->resumable) {
      for (const auto& key : ResumableKeys(keys)) std::cout << key << "\n";
    } else {
      std::cout << (options->markdown ? KeyTableMarkdown(keys) : ReferenceYaml(keys));
    }
  });
}

}  // namespace darkformer
