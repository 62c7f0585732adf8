// Rotary position embedding, half-rotation layout (rotate_half), computed in fp32.
#pragma once

#include <torch/torch.h>

namespace darkformer {

// A forward's position tables: RoPE's cos and sin, and (packed windows, data.document_masking)
// the document of each position, which the attention kernels honour (document_mask.h).
struct RotaryTables {
  torch::Tensor cos_LD;  // fp32; B x 1 x L x D when positions restart per document
  torch::Tensor sin_LD;  // fp32; likewise
  torch::Tensor document_ids_BL;  // int64; undefined: each row is one document
};

// Tables for positions 0..length-1; `scaling` is linear RoPE scaling (inv_freq / scaling).
RotaryTables MakeRotaryTables(int64_t length, int64_t head_dim, double theta, double scaling,
                              const torch::Device& device);
// The rows of `tables` (positions 0..) at positions_BL: B x 1 x L x D tables.
RotaryTables RotaryTablesAt(const RotaryTables& tables, const torch::Tensor& positions_BL);
// x_BHLD rotated by the tables; the rotation runs in fp32 and returns x's dtype.
torch::Tensor ApplyRotary(const torch::Tensor& x_BHLD, const RotaryTables& tables);

}  // namespace darkformer
