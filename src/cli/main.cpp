// darkformer: the command-line entry point. It only registers subcommands and dispatches, and
// turns every exception into one error line and exit code 2 (bad input; 4 when a data-parallel peer
// rank failed), never a crash.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <yaml-cpp/exceptions.h>

#include <CLI/CLI.hpp>
#include <cstring>
#include <filesystem>

#include "cli/commands.h"
#include "distributed/data_parallel.h"
#include "util/error.h"

namespace {

constexpr int kExitBadInput = 2;
constexpr int kExitPeerFailed = 4;  // a data-parallel rank died, hung or could not be reached

int Report(const std::string& message) {
  spdlog::error("{}", message);
  return kExitBadInput;
}

}  // namespace

int main(int argc, char** argv) {
  // Logs go to stderr, so a command's result on stdout (eval's JSON line) can be parsed.
  spdlog::set_default_logger(spdlog::stderr_color_mt("darkformer"));
  CLI::App app{"darkformer: train and finetune Gemma models with random-feature attention kernels"};
  app.require_subcommand(1);
  darkformer::AddInspectCommand(app);
  darkformer::AddKernelCheckCommand(app);
  darkformer::AddTrainCommand(app);
  darkformer::AddEvalCommand(app);
  darkformer::AddPrepareCommand(app);
  darkformer::AddSweepCommand(app);
  darkformer::AddGenerateCommand(app);
  darkformer::AddDecodeBenchCommand(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {  // a command's own non-zero exit (interrupted, diverged)
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const darkformer::DistributedError& e) {
    spdlog::error("{}", e.what());
    return kExitPeerFailed;
  } catch (const darkformer::Error& e) {
    return Report(e.what());
  } catch (const c10::Error& e) {
    return Report(e.what_without_backtrace());
  } catch (const std::filesystem::filesystem_error& e) {
    // e.what() already names the operation, the path(s) and the system's reason.
    return Report(e.what());
  } catch (const YAML::Exception& e) {
    return Report(std::string("YAML: ") + e.what());
  } catch (const std::exception& e) {
    return Report(std::string("unexpected error: ") + e.what());
  }
  return 0;
}
