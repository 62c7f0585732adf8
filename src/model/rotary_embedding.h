// Rotary position embedding, half-rotation layout (rotate_half), computed in fp32.
#pragma once

#include <torch/torch.h>

namespace darkformer {

struct RotaryTables {
  torch::Tensor cos_LD;  // fp32
  torch::Tensor sin_LD;  // fp32
};

// Tables for positions 0..length-1; `scaling` is linear RoPE scaling (inv_freq / scaling).
RotaryTables MakeRotaryTables(int64_t length, int64_t head_dim, double theta, double scaling,
                              const torch::Device& device);
// x_BHLD rotated by the tables; the rotation runs in fp32 and returns x's dtype.
torch::Tensor ApplyRotary(const torch::Tensor& x_BHLD, const RotaryTables& tables);

}  // namespace darkformer
