// darkformer: the command-line entry point. It only registers subcommands and dispatches.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"darkformer: train and finetune Gemma models with random-feature attention kernels"};
  app.require_subcommand(1);
  darkformer::AddInspectCommand(app);
  darkformer::AddKernelCheckCommand(app);
  darkformer::AddTrainCommand(app);
  darkformer::AddEvalCommand(app);
  darkformer::AddPrepareCommand(app);
  darkformer::AddSweepCommand(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {  // a command's own non-zero exit (interrupted, diverged)
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const darkformer::Error& e) {
    spdlog::error("{}", e.what());
    return 2;
  } catch (const c10::Error& e) {
    spdlog::error("{}", e.what_without_backtrace());
    return 2;
  }
  return 0;
}
