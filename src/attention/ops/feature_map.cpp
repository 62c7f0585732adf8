// Names of the causal operator's forms, and the map saved with an autograd node (see feature_map.h).
#include "attention/ops/feature_map.h"

#include <utility>
#include <vector>

#include "util/error.h"

namespace darkformer {

namespace {

struct FeatureMapCapsule : torch::CustomClassHolder {
  explicit FeatureMapCapsule(FeatureMap m) : map(std::move(m)) {}
  FeatureMap map;
};

constexpr const char* kSavedMapKey = "map";

// The one declaration of the forms' names; everything else derives from it.
const std::vector<std::pair<std::string, CausalOp>>& CausalOps() {
  static const std::vector<std::pair<std::string, CausalOp>> ops = {
      {"auto", CausalOp::kAuto},
      {"naive", CausalOp::kNaive},
      {"chunk_loop", CausalOp::kChunkLoop},
      {"chunk_parallel", CausalOp::kChunkParallel},
      {"raw_cpu", CausalOp::kRawCpu},
      {"cuda", CausalOp::kCuda}};
  return ops;
}

}  // namespace

const std::vector<std::string>& CausalOpNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& [name, op] : CausalOps()) out.push_back(name);
    return out;
  }();
  return names;
}

CausalOp ParseCausalOp(const std::string& name, const std::string& key_path) {
  for (const auto& [known, op] : CausalOps()) {
    if (name == known) return op;
  }
  std::string valid;
  for (const auto& known : CausalOpNames()) valid += (valid.empty() ? "" : ", ") + known;
  Fail("config key '" + key_path + "': unknown op '" + name + "'; valid: " + valid);
}

std::string CausalOpName(CausalOp op) {
  for (const auto& [name, known] : CausalOps()) {
    if (op == known) return name;
  }
  return "auto";
}

void SaveFeatureMap(torch::autograd::AutogradContext* ctx, const FeatureMap& map) {
  ctx->saved_data[kSavedMapKey] = c10::IValue::make_capsule(c10::make_intrusive<FeatureMapCapsule>(map));
}

const FeatureMap& SavedFeatureMap(torch::autograd::AutogradContext* ctx) {
  // saved_data holds the capsule, so the map outlives this call's temporary pointer.
  return c10::static_intrusive_pointer_cast<FeatureMapCapsule>(ctx->saved_data.at(kSavedMapKey).toCapsule())->map;
}

}  // namespace darkformer
