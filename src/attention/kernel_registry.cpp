// The table of attention kernels by name: one line per kernel.
#include "attention/kernel_registry.h"

#include <algorithm>
#include <cctype>
#include <utility>
#include <vector>

#include "attention/baseline_kernels.h"
#include "attention/darkformer_kernel.h"
#include "attention/derf_kernel.h"
#include "attention/exact_kernel.h"
#include "attention/flexformer_kernel.h"
#include "attention/gerf_kernel.h"
#include "attention/lfk_kernel.h"
#include "attention/performer_kernel.h"
#include "attention/saderf_kernel.h"
#include "attention/slay_kernel.h"
#include "attention/trig_kernel.h"
#include "util/error.h"

namespace darkformer {

namespace {

struct Registered {
  KernelFactory factory;
  KernelOptionsCheck check_options;
  std::string description;  // one line: what it computes, citing its seed paper
};

template <typename KernelModule>
Registered Entry(std::string description) {
  return {FactoryOf<KernelModule>(), OptionsCheckOf<KernelModule>(), std::move(description)};
}

// In the order tables and legends list them (KernelNamesInTableOrder): exact, the paper's kernels,
// the seeds' kernels, the baselines; kernels registered at run time follow.
std::vector<std::pair<std::string, Registered>>& Registry() {
  static std::vector<std::pair<std::string, Registered>> registry = {
      {"exact", Entry<ExactKernel>("softmax attention (SDPA, or the fp32 masked softmax)")},
      {"darkformer", Entry<DarkformerKernel>("phi(x) = exp(W(Mx) - |Mx|^2/2)/sqrt(m): unbiased for exp(x^T M^T M y)")},
      {"performer", Entry<PerformerKernel>("FAVOR+: phi(x) = exp(Wx - |x|^2/2)/sqrt(m), W rows ~ N(0, I)")},
      {"lfk", Entry<LfkKernel>("Performer features with a trainable W (initialised by a draw)")},
      {"gerf", Entry<GerfKernel>("FAVOR++ (002 eq. 10): phi(x) = D exp(A|w|^2 + B w^T x - |x|^2/2)/sqrt(m), B = sqrt(1-4A), D = (1-4A)^(d/4)")},
      {"saderf", Entry<SaderfKernel>("FAVOR# (002 eq. 18-20): gerf on diag(psi) x and diag(psi)^-1 y, psi and A* from a calibration batch")},
      {"aderf", Entry<AderfKernel>("FAVOR# ADERF (002 Thm 4.2): gerf with A* on P x and P^-T y, P from an SVD of a calibration batch's second moments")},
      {"sderf", Entry<SderfKernel>("FAVOR# SDERF (002 Thm 4.3): x and y rotated by Q^T (eigenvectors of mean (x+y)(x+y)^T), a per-coordinate A*")},
      {"trig", Entry<TrigKernel>("RFA (001): phi(x) = exp(|x|^2/2)/sqrt(m) [sin Wx, cos Wx]; signed features, composite path")},
      {"slay", Entry<SlayKernel>("SLAY (003): spherical Yat kernel t^2/(C - 2t) of unit-norm q, k by Gauss-Laguerre quadrature")},
      {"flexformer", Entry<FlexformerKernel>("Flexformer (004): trainable Fourier frequencies for the Gaussian factor, learnable exp(tau)")},
      {"random", Entry<RandomKernel>("uniform random weights over allowed positions, normalised")},
      {"constant", Entry<ConstantKernel>("equal weights over allowed positions (running mean of v)")},
  };
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
                             const std::string& description) {
  const bool identifier = !name.empty() && std::islower(static_cast<unsigned char>(name[0])) &&
                          std::all_of(name.begin(), name.end(), [](unsigned char c) {
                            return std::islower(c) || std::isdigit(c) || c == '_';
                          });
  DF_CHECK(identifier, "attention kernel name '" << name << "' must be lowercase letters, digits and '_'");
  DF_CHECK(Lookup(name) == nullptr, "attention kernel '" << name << "' is already registered");
  DF_CHECK(factory && check_options, "attention kernel '" << name << "' registered without a factory or an options check");
  Registry().emplace_back(name, Registered{std::move(factory), std::move(check_options), description});
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
