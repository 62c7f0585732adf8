// The table of attention kernels by name: one line per kernel.
#include "attention/kernel_registry.h"

#include <algorithm>
#include <cctype>
#include <map>

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

template <typename KernelModule>
KernelFactory Factory() {
  return [](const KernelShape& shape, const ConfigReader& options) {
    // Upcast first: ModuleHolder's forwarding constructor would otherwise try to build the base.
    std::shared_ptr<AttentionKernelImpl> kernel = KernelModule(shape, options).ptr();
    return AttentionKernel(kernel);
  };
}

struct Registered {
  KernelFactory factory;
  std::string description;  // one line: what it computes, citing its seed paper
};

std::map<std::string, Registered>& Registry() {
  static std::map<std::string, Registered> registry = {
      {"aderf", {Factory<AderfKernel>(), "FAVOR# ADERF (002 Thm 4.2): gerf with A* on P x and P^-T y, P from an SVD of a calibration batch's second moments"}},
      {"constant", {Factory<ConstantKernel>(), "equal weights over allowed positions (running mean of v)"}},
      {"darkformer", {Factory<DarkformerKernel>(), "phi(x) = exp(W(Mx) - |Mx|^2/2)/sqrt(m): unbiased for exp(x^T M^T M y)"}},
      {"exact", {Factory<ExactKernel>(), "softmax attention (SDPA, or the fp32 masked softmax)"}},
      {"flexformer", {Factory<FlexformerKernel>(), "Flexformer (004): trainable Fourier frequencies for the Gaussian factor, learnable exp(tau)"}},
      {"gerf", {Factory<GerfKernel>(), "FAVOR++ (002 eq. 10): phi(x) = D exp(A|w|^2 + B w^T x - |x|^2/2)/sqrt(m), B = sqrt(1-4A), D = (1-4A)^(d/4)"}},
      {"lfk", {Factory<LfkKernel>(), "Performer features with a trainable W (initialised by a draw)"}},
      {"performer", {Factory<PerformerKernel>(), "FAVOR+: phi(x) = exp(Wx - |x|^2/2)/sqrt(m), W rows ~ N(0, I)"}},
      {"random", {Factory<RandomKernel>(), "uniform random weights over allowed positions, normalised"}},
      {"saderf", {Factory<SaderfKernel>(), "FAVOR# (002 eq. 18-20): gerf on diag(psi) x and diag(psi)^-1 y, psi and A* from a calibration batch"}},
      {"sderf", {Factory<SderfKernel>(), "FAVOR# SDERF (002 Thm 4.3): x and y rotated by Q^T (eigenvectors of mean (x+y)(x+y)^T), a per-coordinate A*"}},
      {"slay", {Factory<SlayKernel>(), "SLAY (003): spherical Yat kernel t^2/(C - 2t) of unit-norm q, k by Gauss-Laguerre quadrature"}},
      {"trig", {Factory<TrigKernel>(), "RFA (001): phi(x) = exp(|x|^2/2)/sqrt(m) [sin Wx, cos Wx]; signed features, composite path"}},
  };
  return registry;
}

}  // namespace

AttentionKernel MakeAttentionKernel(const std::string& name, const KernelShape& shape, const ConfigReader& options) {
  const auto& registry = Registry();
  const auto it = registry.find(name);
  if (it == registry.end()) {
    std::string valid;
    for (const auto& [n, r] : registry) valid += (valid.empty() ? "" : ", ") + n;
    Fail("unknown attention kernel '" + name + "'" + DidYouMean(name, KernelNames()) + "; valid kernels: " + valid);
  }
  return it->second.factory(shape, options);
}

std::string KernelDescription(const std::string& name) {
  const auto it = Registry().find(name);
  return it == Registry().end() ? std::string() : it->second.description;
}

void RegisterAttentionKernel(const std::string& name, KernelFactory factory, const std::string& description) {
  const bool identifier = !name.empty() && std::islower(static_cast<unsigned char>(name[0])) &&
                          std::all_of(name.begin(), name.end(), [](unsigned char c) {
                            return std::islower(c) || std::isdigit(c) || c == '_';
                          });
  DF_CHECK(identifier, "attention kernel name '" << name << "' must be lowercase letters, digits and '_'");
  DF_CHECK(Registry().count(name) == 0, "attention kernel '" << name << "' is already registered");
  DF_CHECK(factory, "attention kernel '" << name << "' registered without a factory");
  Registry()[name] = {std::move(factory), description};
}

std::vector<std::string> KernelNames() {
  std::vector<std::string> names;
  for (const auto& [name, registered] : Registry()) names.push_back(name);
  return names;
}

}  // namespace darkformer
