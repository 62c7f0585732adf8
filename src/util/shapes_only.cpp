// Shapes-only building (see shapes_only.h).
#include "util/shapes_only.h"

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <optional>

namespace darkformer {

namespace {

// This thread's dispatch state outside its ShapesOnlyScope (none: not inside one).
thread_local std::optional<c10::impl::LocalDispatchKeySet> outside_shapes_only;

}  // namespace

ShapesOnlyScope::ShapesOnlyScope() : was_active_(outside_shapes_only.has_value()) {
  const auto now = c10::impl::tls_local_dispatch_key_set();
  if (!was_active_) outside_shapes_only = now;
  // With the meta key included, the meta backend outranks the CPU's for every op on a tensor.
  // Factories (empty, zeros, ...) take no tensor: BackendSelect would send them to the device their
  // options name, so it is excluded and they too run their meta kernels: true meta tensors.
  guard_ = std::make_unique<c10::impl::ForceDispatchKeyGuard>(
      now.included_ | c10::DispatchKeySet(c10::DispatchKey::Meta),
      now.excluded_ | c10::DispatchKeySet(c10::DispatchKey::BackendSelect));
}

ShapesOnlyScope::~ShapesOnlyScope() {
  guard_.reset();
  if (!was_active_) outside_shapes_only.reset();
}

RealTensorsScope::RealTensorsScope() {
  if (outside_shapes_only) guard_ = std::make_unique<c10::impl::ForceDispatchKeyGuard>(*outside_shapes_only);
}

RealTensorsScope::~RealTensorsScope() = default;

}  // namespace darkformer
