// Label conventions shared by the data loader and the loss: positions whose label is
// kIgnoreIndex (PyTorch's and Hugging Face's -100) count in neither loss nor accuracy.
#pragma once

#include <cstdint>

namespace darkformer {

inline constexpr int64_t kIgnoreIndex = -100;

}  // namespace darkformer
