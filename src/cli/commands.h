// One function per subcommand; each lives in its own <name>_command.cpp and registers its
// options and callback on the application. main.cpp only dispatches.
#pragma once

#include <CLI/CLI.hpp>

namespace darkformer {

void AddConfigCommand(CLI::App& app);
void AddInspectCommand(CLI::App& app);
void AddKernelCheckCommand(CLI::App& app);
void AddTrainCommand(CLI::App& app);
void AddEvalCommand(CLI::App& app);
void AddPrepareCommand(CLI::App& app);
void AddSweepCommand(CLI::App& app);
void AddGenerateCommand(CLI::App& app);
void AddDecodeBenchCommand(CLI::App& app);

}  // namespace darkformer
