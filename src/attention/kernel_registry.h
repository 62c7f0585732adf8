// Kernels are chosen by name from the config. Each registers itself at the end of its own .cpp
// (RegisterKernel: its name, written nowhere else, its row in the tables and its one line), so
// adding one is its own files and its port in the HF plug-in (python/darkformer_hf/ports;
// test_plugin_ports.py fails without it); src/CMakeLists.txt links the attention library whole,
// so no registration is dropped by the linker. A test registers its own the same way (the toy
// kernel, tests/train/toy_kernel_test.cpp). What each kernel is (family, options, what it
// learns) is asked of it: kernel_traits.h.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "attention/attention_kernel.h"
#include "util/config_reader.h"

namespace darkformer {

// `options` is the kernel's own YAML section (e.g. attention.performer); the factory reads its
// keys and calls options.RejectUnknown(), so a bad option names its key path.
using KernelFactory = std::function<AttentionKernel(const KernelShape&, const ConfigReader& options)>;
// Reads a kernel's section by its declarations alone (every key's rule, unknown keys refused)
// without building the kernel: the kernel's Options::Read, which its factory reads through too.
using KernelOptionsCheck = std::function<void(const ConfigReader& options)>;

// The registry entry of a kernel module whose Impl has `struct Options { static Options
// Read(const ConfigReader&); }` and a constructor (shape, options): both functions read through it.
template <typename KernelModule>
KernelFactory FactoryOf() {
  return [](const KernelShape& shape, const ConfigReader& options) {
    // Upcast first: ModuleHolder's forwarding constructor would otherwise try to build the base.
    std::shared_ptr<AttentionKernelImpl> kernel =
        KernelModule(shape, KernelModule::ContainedType::Options::Read(options)).ptr();
    return AttentionKernel(kernel);
  };
}
template <typename KernelModule>
KernelOptionsCheck OptionsCheckOf() {
  return [](const ConfigReader& options) { KernelModule::ContainedType::Options::Read(options); };
}

// Throws listing the valid names when `name` is unknown.
AttentionKernel MakeAttentionKernel(const std::string& name, const KernelShape& shape,
                                    const ConfigReader& options);
// Alphabetical (configs, errors and test names list them so).
std::vector<std::string> KernelNames();
// The registry's own order, the one tables and legends use (`inspect --kernels`, read by
// tools/kernel_registry.py): exact, the paper's kernels, the seeds' kernels, the baselines.
std::vector<std::string> KernelNamesInTableOrder();
// Rows of the tables' order (KernelNamesInTableOrder): exact, the paper's kernels, the seeds'
// kernels, the baselines; a kernel registered without a row follows them.
inline constexpr int kTableRowAfterBuiltIns = 1000;
// Adds `name` to the table, before the kernels are first asked for (traits are memoised); refused
// when the name is taken or not a plain lowercase identifier (it becomes a config section).
void RegisterAttentionKernel(const std::string& name, KernelFactory factory, KernelOptionsCheck check_options,
                             const std::string& description, int table_row = kTableRowAfterBuiltIns);
// A kernel's registration, once, at the end of its .cpp:
//   [[maybe_unused]] const bool kRegistered = RegisterKernel<PerformerKernel>("performer", 20, "FAVOR+: ...");
// `description` is the doc of its config section.
template <typename KernelModule>
bool RegisterKernel(const std::string& name, int table_row, const std::string& description) {
  RegisterAttentionKernel(name, FactoryOf<KernelModule>(), OptionsCheckOf<KernelModule>(), description, table_row);
  return true;
}
// Reads `name`'s option section by the declarations (KernelOptionsCheck); throws as the factory
// would on a bad option, and for an unknown name.
void CheckKernelOptions(const std::string& name, const ConfigReader& options);
// The registry's one line on what `name` computes ("" for an unknown name): the doc of its
// config section.
std::string KernelDescription(const std::string& name);

}  // namespace darkformer
