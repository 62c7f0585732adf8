// RoPE tables and application (see rotary_embedding.h). Matches HF's default/linear rope types.
#include "model/rotary_embedding.h"

namespace darkformer {

RotaryTables MakeRotaryTables(int64_t length, int64_t head_dim, double theta, double scaling,
                              const torch::Device& device) {
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  // inv_freq_i = theta^(-2i/D), as HF computes it in fp32.
  const auto exponent = torch::arange(0, head_dim, 2, opts) / static_cast<double>(head_dim);
  const auto inv_freq = 1.0 / torch::pow(torch::scalar_tensor(theta, opts), exponent) / scaling;
  const auto positions = torch::arange(length, opts);
  const auto freqs_LD2 = torch::outer(positions, inv_freq);
  const auto angles_LD = torch::cat({freqs_LD2, freqs_LD2}, -1);
  return {angles_LD.cos(), angles_LD.sin(), /*document_ids_BL=*/torch::Tensor()};  // one document a row
}

RotaryTables RotaryTablesAt(const RotaryTables& tables, const torch::Tensor& positions_BL) {
  const int64_t batch = positions_BL.size(0), length = positions_BL.size(1), dim = tables.cos_LD.size(-1);
  const auto flat = positions_BL.reshape({-1});
  return {tables.cos_LD.index_select(0, flat).view({batch, 1, length, dim}),
          tables.sin_LD.index_select(0, flat).view({batch, 1, length, dim}), tables.document_ids_BL};
}

torch::Tensor ApplyRotary(const torch::Tensor& x_BHLD, const RotaryTables& tables) {
  const auto x = x_BHLD.to(torch::kFloat32);
  const int64_t half = x.size(-1) / 2;
  const auto rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return (x * tables.cos_LD + rotated * tables.sin_LD).to(x_BHLD.scalar_type());
}

}  // namespace darkformer
