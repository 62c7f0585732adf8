// Autocast scopes and guards (see mixed_precision.h).
#include "util/mixed_precision.h"

namespace darkformer {

AutocastScope::AutocastScope(c10::DeviceType device, bool enabled, at::ScalarType dtype)
    : device_(device), active_(enabled) {
  if (!active_) return;
  previous_enabled_ = at::autocast::is_autocast_enabled(device_);
  previous_dtype_ = at::autocast::get_autocast_dtype(device_);
  at::autocast::set_autocast_enabled(device_, true);
  at::autocast::set_autocast_dtype(device_, dtype);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  // As torch.autocast.__exit__: the outermost scope drops every cached cast, so the next scope
  // casts the weights as they are then.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_, previous_dtype_);
}

bool AutocastActive(c10::DeviceType device) {
  if (!at::autocast::is_autocast_enabled(device)) return false;
  const auto key = at::autocast::get_autocast_dispatch_key_from_device_type(device);
  return !c10::impl::tls_is_dispatch_key_excluded(key);
}

AutocastState AutocastState::Current() {
  AutocastState s;
  s.cpu = AutocastActive(c10::DeviceType::CPU);
  s.cuda = AutocastActive(c10::DeviceType::CUDA);
  s.cpu_dtype = at::autocast::get_autocast_dtype(c10::DeviceType::CPU);
  s.cuda_dtype = at::autocast::get_autocast_dtype(c10::DeviceType::CUDA);
  return s;
}

}  // namespace darkformer
