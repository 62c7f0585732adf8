// The table of attention kernels by name: one line per kernel.
#include "attention/kernel_registry.h"

#include <algorithm>
#include <cctype>
#include <utility>
#include <vector>

#include "util/error.h"

namespace darkformer {

namespace {

struct Registered {
  KernelFactory factory;
  KernelOptionsCheck check_options;
  std::string description;  // one line: what it computes, citing its seed paper
  int table_row = kTableRowAfterBuiltIns;
};

// Kept in the tables' order (table_row, then registration); filled by the kernels' own
// registrations during static initialisation, hence a function-local static.
std::vector<std::pair<std::string, Registered>>& Registry() {
  static std::vector<std::pair<std::string, Registered>> registry;
  return registry;
}

const Registered* Lookup(const std::string& name) {
  for (const auto& [n, r] : Registry()) {
    if (n == name) return &r;
  }
  return nullptr;
}

const Registered& Find(const std::string& name) {
  const auto* found = Lookup(name);
  if (found == nullptr) {
    std::string valid;
    for (const auto& n : KernelNames()) valid += (valid.empty() ? "" : ", ") + n;
    Fail("unknown attention kernel '" + name + "'" + DidYouMean(name, KernelNames()) + "; valid kernels: " + valid);
  }
  return *found;
}

}  // namespace

AttentionKernel MakeAttentionKernel(const std::string& name, const KernelShape& shape, const ConfigReader& options) {
  auto kernel = Find(name).factory(shape, options);
  kernel->set_kernel_name(name);
  return kernel;
}

void CheckKernelOptions(const std::string& name, const ConfigReader& options) { Find(name).check_options(options); }

std::string KernelDescription(const std::string& name) {
  const auto* found = Lookup(name);
  return found == nullptr ? std::string() : found->description;
}

void RegisterAttentionKernel(const std::string& name, KernelFactory factory, KernelOptionsCheck check_options,
                             const std::string& description, int table_row) {
  const bool identifier = !name.empty() && std::islower(static_cast<unsigned char>(name[0])) &&
                          std::all_of(name.begin(), name.end(), [](unsigned char c) {
                            return std::islower(c) || std::isdigit(c) || c == '_';
                          });
  DF_CHECK(identifier, "attention kernel name '" << name << "' must be lowercase letters, digits and '_'");
  DF_CHECK(Lookup(name) == nullptr, "attention kernel '" << name << "' is already registered");
  DF_CHECK(factory && check_options, "attention kernel '" << name << "' registered without a factory or an options check");
  auto& registry = Registry();
  const auto after = std::find_if(registry.begin(), registry.end(),
                                  [&](const auto& entry) { return entry.second.table_row > table_row; });
  registry.insert(after, {name, Registered{std::move(factory), std::move(check_options), description, table_row}});
}

std::vector<std::string> KernelNamesInTableOrder() {
  std::vector<std::string> names;
  for (const auto& [name, registered] : Registry()) names.push_back(name);
  return names;
}

std::vector<std::string> KernelNames() {
  auto names = KernelNamesInTableOrder();
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace darkformer
