// darkformer: the command-line entry point. It only registers subcommands and dispatches, and
// turns every exception into one error line and exit code 2 (bad input; 4 when a data-parallel peer
// rank failed), never a crash.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <torch/version.h>
#include <yaml-cpp/exceptions.h>

#include <CLI/CLI.hpp>
#include <cstring>
#include <filesystem>
#include <string>

#include "attention/ops/cuda_op_device.h"
#include "cli/commands.h"
#include "distributed/data_parallel.h"
#include "util/build_version.h"
#include "util/error.h"
#include "util/heap_retention.h"
#include "util/vector_math_kernels.h"

namespace {

constexpr int kExitBadInput = 2;
constexpr int kExitPeerFailed = 4;  // a data-parallel rank died, hung or could not be reached

// One line per error: LibTorch's messages (c10::Error, gloo) carry C++ stack frames ("Exception
// raised from ...", "frame #0 ...") after the first line; they are debug output, not the error.
std::string FirstLineLoggingTheRest(const std::string& message) {
  const auto end = message.find_first_of("\r\n");
  if (end == std::string::npos) return message;
  spdlog::debug("the error's further lines:\n{}", message.substr(end + 1));
  return message.substr(0, end);
}

int Report(const std::string& message, int exit_code = kExitBadInput) {
  spdlog::error("{}", FirstLineLoggingTheRest(message));
  return exit_code;
}

// A command-line parse error (unknown flag or subcommand, a flag without its value, a value that is
// not a number) is bad input like any other: one error line, exit 2, not CLI11's codes 104-114.
// --help (and --version) still print their text and exit 0 through CLI11.
// CLI11 checks required options and subcommands before it reports arguments it did not
// recognise, so a mistyped command or flag would be reported as what is missing: name it first.
int ReportParseError(const CLI::App& app, const CLI::ParseError& e) {
  if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
  const auto unrecognised = app.remaining(/*recurse=*/true);
  if (!unrecognised.empty() && e.get_name() != "ExtrasError") {
    const auto chosen = app.get_subcommands();
    std::string commands;
    for (const auto* command : app.get_subcommands({})) commands += (commands.empty() ? "" : ", ") + command->get_name();
    if (chosen.empty()) {
      const bool flag = unrecognised.front().rfind('-', 0) == 0;
      return Report(std::string("command line: unknown ") + (flag ? "option '" : "command '") + unrecognised.front() +
                    "' (commands: " + commands + "; see --help)");
    }
    return Report("command line: unknown argument '" + unrecognised.front() + "' for '" + chosen.front()->get_name() +
                  "' (see " + chosen.front()->get_name() + " --help)");
  }
  return Report(std::string("command line: ") + e.what() + " (see --help)");
}

// --version: the source's version, LibTorch's, and whether this build has the CUDA operator, for
// which GPUs.
std::string VersionText() {
  std::string op = "; no CUDA operator: built without nvcc)";
  if (const auto architectures = darkformer::CudaOpArchitectures(); !architectures.empty()) {
    op = "; the CUDA operator compiled in for sm_" + std::to_string(architectures.front());
    for (size_t i = 1; i < architectures.size(); ++i) op += ", sm_" + std::to_string(architectures[i]);
    op += " and later GPUs)";
  }
  return std::string("darkformer ") + darkformer::BuildVersion() + " (LibTorch " + std::to_string(TORCH_VERSION_MAJOR) +
         "." + std::to_string(TORCH_VERSION_MINOR) + "." + std::to_string(TORCH_VERSION_PATCH) + op;
}

}  // namespace

int main(int argc, char** argv) {
  const bool retained = darkformer::RetainFreedHeapMemory();  // before the first large allocation
  darkformer::ChooseVectorMathKernels();                       // before any parallel work
  // Logs go to stderr, so a command's result on stdout (eval's JSON line) can be parsed.
  spdlog::set_default_logger(spdlog::stderr_color_mt("darkformer"));
  spdlog::debug("freed memory is {} (util/heap_retention.h)", retained ? "kept in the heap" : "malloc's default");
  CLI::App app{"darkformer: train and finetune Gemma models with random-feature attention kernels"};
  app.require_subcommand(1);
  app.set_version_flag("--version", VersionText());
  darkformer::AddConfigCommand(app);
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
    return ReportParseError(app, e);
  } catch (const darkformer::DistributedError& e) {
    return Report(e.what(), kExitPeerFailed);
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
