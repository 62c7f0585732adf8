// The dtypes a causal operator's most recent call computed in, for the tests that assert fp32
// features and state under bf16 autocast (whatever form ran: chunk loop, chunk parallel, raw CPU).
#pragma once

#include <torch/torch.h>

#include <atomic>

namespace darkformer {

// Its inputs after conversion, its features, the running key state, the normaliser (forward)
// and dx (backward); Undefined where nothing was recorded.
struct FusedCausalDtypes {
  c10::ScalarType inputs, features, state, normaliser, gradients;
};
FusedCausalDtypes LastFusedCausalDtypes();

enum class ProbeField { kInputs, kFeatures, kState, kNormaliser, kGradients };
inline constexpr size_t kProbeFields = static_cast<size_t>(ProbeField::kGradients) + 1;
// Written by whichever thread computes (relaxed atomics: every writer of a call writes the same value).
void RecordDtype(ProbeField field, const torch::Tensor& t);
// Clears the forward's fields (a new forward call).
void ResetForwardDtypes();

// While it lives, the calls made leave no record: the fields are as before when it goes (a call
// made to learn a kernel's traits is not one a test's run made).
class DtypeProbeUnchanged {
 public:
  DtypeProbeUnchanged();
  ~DtypeProbeUnchanged();
  DtypeProbeUnchanged(const DtypeProbeUnchanged&) = delete;
  DtypeProbeUnchanged& operator=(const DtypeProbeUnchanged&) = delete;

 private:
  int saved_[kProbeFields];
};

}  // namespace darkformer
