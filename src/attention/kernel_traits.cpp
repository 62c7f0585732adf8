// Kernel traits by introspection of the registry (see kernel_traits.h).
#include "attention/kernel_traits.h"

#include <mutex>

#include "attention/kernel_registry.h"
#include "attention/log_feature_kernel.h"
#include "attention/ops/dtype_probe.h"
#include "attention/signed_feature_kernel.h"

namespace darkformer {

const char* KernelFamilyName(KernelFamily family) {
  switch (family) {
    case KernelFamily::kExact: return "exact";
    case KernelFamily::kPositive: return "positive";
    case KernelFamily::kSigned: return "signed";
    case KernelFamily::kBaseline: return "baseline";
  }
  return "?";
}

namespace {

// One small causal call with q, k and v leaves of the graph (fixed values: no RNG is drawn from),
// then which of q and k the output's gradient reaches.
bool ReadsQueriesAndKeys(AttentionKernelImpl& kernel, const KernelShape& shape) {
  const torch::AutoGradMode grad_mode(true);  // whoever asks first may hold a NoGradGuard
  const DtypeProbeUnchanged probe;             // nor does it see this call in the operators' probe
  const auto leaf = [&](double from, double to) {
    const int64_t n = shape.num_heads * 3 * shape.head_dim;
    return torch::linspace(from, to, n).reshape({1, shape.num_heads, 3, shape.head_dim}).requires_grad_(true);
  };
  const auto q = leaf(-0.5, 0.5), k = leaf(0.4, -0.3), v = leaf(-1.0, 1.0);
  const auto out = kernel.forward(q, k, v, AttentionCall{});
  const auto grads = torch::autograd::grad({out.sum()}, {q, k}, /*grad_outputs=*/{}, /*retain_graph=*/false,
                                           /*create_graph=*/false, /*allow_unused=*/true);
  return grads[0].defined() && grads[1].defined();
}

KernelTraits Introspect(const std::string& name) {
  KernelTraits t;
  t.name = name;
  const std::string path = "attention." + name;
  const ConfigReader options(YAML::Node(YAML::NodeType::Map), path);
  const KernelShape shape{4, 16, 0, 0};
  auto kernel = MakeAttentionKernel(name, shape, options);
  const auto* impl = kernel.get();
  if (dynamic_cast<const LogFeatureKernel*>(impl)) {
    t.family = KernelFamily::kPositive;
    t.log_form = true;
  } else if (dynamic_cast<const SignedFeatureKernel*>(impl)) {
    t.family = KernelFamily::kSigned;
  } else if (name == "exact") {
    t.family = KernelFamily::kExact;
  } else {
    t.family = KernelFamily::kBaseline;
  }
  t.supports_softcap = impl->supports_softcap();
  t.supports_sliding_window = impl->supports_sliding_window();
  t.wants_calibration = impl->wants_calibration();
  t.reads_queries_and_keys = ReadsQueriesAndKeys(*kernel, shape);
  for (const auto& p : kernel->named_parameters()) t.learns.push_back(p.key());
  for (const auto& b : kernel->named_buffers()) t.buffers.push_back(b.key());
  for (const auto& [key, value] : options.defaults_used()) t.option_defaults[key.substr(path.size() + 1)] = value;
  return t;
}

}  // namespace

const KernelTraits& TraitsOf(const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, KernelTraits> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, Introspect(name)).first;
  return it->second;
}

std::vector<KernelTraits> AllKernelTraits() {
  std::vector<KernelTraits> all;
  for (const auto& name : KernelNamesInTableOrder()) all.push_back(TraitsOf(name));
  return all;
}

std::vector<std::string> KernelNames(KernelFamily family) {
  std::vector<std::string> names;
  for (const auto& name : KernelNames()) {
    if (TraitsOf(name).family == family) names.push_back(name);
  }
  return names;
}

Json ToJson(const KernelTraits& t) {
  Json options = Json::object();
  for (const auto& [key, value] : t.option_defaults) {
    // The YAML text of a scalar default as JSON where it is one (numbers, booleans), else a string.
    const auto parsed = Json::parse(value, nullptr, /*allow_exceptions=*/false);
    options[key] = parsed.is_discarded() ? Json(value) : parsed;
  }
  return {{"name", t.name},
          {"family", KernelFamilyName(t.family)},
          {"log_form", t.log_form},
          {"supports_softcap", t.supports_softcap},
          {"supports_sliding_window", t.supports_sliding_window},
          {"wants_calibration", t.wants_calibration},
          {"reads_queries_and_keys", t.reads_queries_and_keys},
          {"learns", t.learns},
          {"buffers", t.buffers},
          {"options", options}};
}

}  // namespace darkformer
