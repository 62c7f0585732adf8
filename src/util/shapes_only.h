// Building a module for its shapes alone, as PyTorch's `with torch.device("meta")`, which LibTorch
// lacks: inside a ShapesOnlyScope this thread's dispatch runs every op on the meta backend, so
// tensors made there are meta tensors (no storage) and initialisers do nothing, while the names,
// sizes and dtypes are those a real build gives. The memory estimate and the parameter counts
// build a run's model so: a 7B model costs no memory. Read such tensors' sizes, dtypes and
// requires_grad, and convert them (.to(dtype) gives a meta tensor); they have no values.
#pragma once

#include <memory>

namespace c10::impl {
struct ForceDispatchKeyGuard;
}

namespace darkformer {

class ShapesOnlyScope {
 public:
  ShapesOnlyScope();
  ~ShapesOnlyScope();
  ShapesOnlyScope(const ShapesOnlyScope&) = delete;
  ShapesOnlyScope& operator=(const ShapesOnlyScope&) = delete;

 private:
  std::unique_ptr<c10::impl::ForceDispatchKeyGuard> guard_;
  bool was_active_ = false;
};

// Inside a ShapesOnlyScope, real tensors again: for parts that compute while they are built (the
// attention kernels draw their projections and read their own values; they are small). Outside
// one, it does nothing.
class RealTensorsScope {
 public:
  RealTensorsScope();
  ~RealTensorsScope();
  RealTensorsScope(const RealTensorsScope&) = delete;
  RealTensorsScope& operator=(const RealTensorsScope&) = delete;

 private:
  std::unique_ptr<c10::impl::ForceDispatchKeyGuard> guard_;
};

}  // namespace darkformer
