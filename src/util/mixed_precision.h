// Mixed precision as torch.autocast does it, for LibTorch: a scope that switches autocast on for
// one device type and, when the outermost scope exits, empties autocast's cast cache; a guard that
// excludes autocast inside (the fp32 regions of random-feature attention); and the state a
// recomputation (activation checkpointing) must restore.
//
// Why a scope and not a switch: autocast caches the bf16 copy of every fp32 leaf that requires
// grad (the weights) until the outermost scope exits. Switched on once for a whole run, every
// step after the first would compute with the first step's weights (an optimizer step updates the
// fp32 weight in place; the cached copy is not refreshed).
#pragma once

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

namespace darkformer {

// Autocast to `dtype` on `device` for the scope's lifetime (enabled = false: a no-op). Nests; the
// previous state is restored on exit and the cast cache is cleared when no scope is left.
class AutocastScope {
 public:
  AutocastScope(c10::DeviceType device, bool enabled, at::ScalarType dtype = at::kBFloat16);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  c10::DeviceType device_;
  bool active_, previous_enabled_ = false;
  at::ScalarType previous_dtype_ = at::kBFloat16;
};

// Inside: no op is autocast, whatever scope is open (kernels that must compute in fp32 cast their
// inputs themselves). Autocast's own wrappers use the same exclusion.
class NoAutocastGuard {
 public:
  NoAutocastGuard() : guard_(c10::autocast_dispatch_keyset) {}

 private:
  c10::impl::ExcludeDispatchKeyGuard guard_;
};

// Whether an op dispatched here would be autocast on `device` (enabled and not excluded).
bool AutocastActive(c10::DeviceType device);

// The autocast state of the CPU and CUDA, as a forward saw it, to recompute under the same state.
struct AutocastState {
  bool cpu = false, cuda = false;
  at::ScalarType cpu_dtype = at::kBFloat16, cuda_dtype = at::kBFloat16;
  static AutocastState Current();
};

// Re-enters a saved state for a scope (a checkpointed layer's recomputation in the backward).
class AutocastReplay {
 public:
  explicit AutocastReplay(const AutocastState& state)
      : cpu_(c10::DeviceType::CPU, state.cpu, state.cpu_dtype), cuda_(c10::DeviceType::CUDA, state.cuda, state.cuda_dtype) {}

 private:
  AutocastScope cpu_, cuda_;
};

}  // namespace darkformer
