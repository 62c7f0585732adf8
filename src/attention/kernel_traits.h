// What each registered kernel is, asked of the kernel itself rather than listed by hand: its
// family, whether it has the log-form causal operator, what it learns, its options and their
// defaults. Tests instantiate over KernelNames(family); the Python tools and the HF plug-in's
// test read the same facts from `darkformer inspect --kernels --json`.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "util/json.h"

namespace darkformer {

// exact: softmax attention; positive: positive random features in log form (the fused causal
// operator, stabilised); signed: features that may be negative (composite path only); baseline:
// the paper's uniform-random and constant attention.
enum class KernelFamily { kExact, kPositive, kSigned, kBaseline };
const char* KernelFamilyName(KernelFamily family);

struct KernelTraits {
  std::string name;
  KernelFamily family = KernelFamily::kExact;
  bool log_form = false;                 // has the causal operator's forms (op: naive | chunk_loop | ...)
  bool supports_softcap = false, supports_sliding_window = false, wants_calibration = false;
  // Whether its output depends on the queries and keys (asked of autograd): the baselines'
  // attention weights do not, so a layer with one gives its q/k projections no gradient.
  bool reads_queries_and_keys = true;
  std::vector<std::string> learns;       // trainable parameters at default options (e.g. M, W)
  std::vector<std::string> buffers;      // non-trainable state it saves (draws, seeds)
  std::map<std::string, std::string> option_defaults;  // option -> default, as YAML text
};

// Built once per name at default options (4 heads of 16 dims) and memoised.
const KernelTraits& TraitsOf(const std::string& name);
// In the registry's table order (KernelNamesInTableOrder).
std::vector<KernelTraits> AllKernelTraits();
std::vector<std::string> KernelNames(KernelFamily family);

Json ToJson(const KernelTraits& traits);

}  // namespace darkformer
