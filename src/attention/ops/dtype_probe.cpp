// The operators' dtype probe (see dtype_probe.h).
#include "attention/ops/dtype_probe.h"

#include <array>

namespace darkformer {

namespace {
// A dtype's code plus one: 0 (how the array starts) is "nothing recorded".
std::array<std::atomic<int>, kProbeFields> fields{};
}  // namespace

void RecordDtype(ProbeField field, const torch::Tensor& t) {
  fields[static_cast<size_t>(field)].store(static_cast<int>(t.scalar_type()) + 1, std::memory_order_relaxed);
}

void ResetForwardDtypes() {
  for (auto f : {ProbeField::kInputs, ProbeField::kFeatures, ProbeField::kState, ProbeField::kNormaliser}) {
    fields[static_cast<size_t>(f)].store(0, std::memory_order_relaxed);
  }
}

DtypeProbeUnchanged::DtypeProbeUnchanged() {
  for (size_t i = 0; i < fields.size(); ++i) saved_[i] = fields[i].load(std::memory_order_relaxed);
}

DtypeProbeUnchanged::~DtypeProbeUnchanged() {
  for (size_t i = 0; i < fields.size(); ++i) fields[i].store(saved_[i], std::memory_order_relaxed);
}

FusedCausalDtypes LastFusedCausalDtypes() {
  auto get = [](ProbeField f) {
    const int v = fields[static_cast<size_t>(f)].load(std::memory_order_relaxed);
    return v == 0 ? c10::ScalarType::Undefined : static_cast<c10::ScalarType>(v - 1);
  };
  return {get(ProbeField::kInputs), get(ProbeField::kFeatures), get(ProbeField::kState), get(ProbeField::kNormaliser),
          get(ProbeField::kGradients)};
}

}  // namespace darkformer
