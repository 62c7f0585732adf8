// Chunked causal and non-causal linear attention (see causal_linear_attention.h).
#include "attention/causal_linear_attention.h"

#include <limits>

#include "attention/ops/fp32_products.h"
#include "util/error.h"

namespace darkformer {

namespace {

// Floor for the normaliser: only an fp32 underflow of every term (huge, misaligned x and y) reaches
// it; numerator and denominator then both vanish and the output is 0 instead of NaN.
torch::Tensor SafeDivide(const torch::Tensor& num_BHLD, const torch::Tensor& den_BHL, double signed_floor) {
  if (signed_floor > 0) {
    // Signed features (trig): the normaliser can cross zero; its magnitude is floored, its sign kept.
    const auto den = torch::where(den_BHL >= 0, den_BHL.clamp_min(signed_floor), den_BHL.clamp_max(-signed_floor));
    return num_BHLD / den.unsqueeze(-1);
  }
  const double tiny = den_BHL.scalar_type() == torch::kFloat64 ? std::numeric_limits<double>::min()
                                                                : std::numeric_limits<float>::min();
  return num_BHLD / den_BHL.clamp_min(tiny).unsqueeze(-1);
}

torch::Tensor NonCausal(const torch::Tensor& q_BHLM, const torch::Tensor& k_BHLM, const torch::Tensor& b_BHL,
                        const torch::Tensor& v_BHLD, double signed_floor) {
  // Every key is visible to every query, so the global max of b is a legitimate common reference.
  const auto ref_BH1 = std::get<0>(b_BHL.max(-1, /*keepdim=*/true));
  const auto kw_BHLM = k_BHLM * torch::exp(b_BHL - ref_BH1).unsqueeze(-1);
  const auto state_BHMD = Fp32Matmul(kw_BHLM.transpose(-1, -2), v_BHLD);
  const auto norm_BHM = kw_BHLM.sum(-2);
  const auto num_BHLD = Fp32Matmul(q_BHLM, state_BHMD);
  const auto den_BHL = Fp32Matmul(q_BHLM, norm_BHM.unsqueeze(-1)).squeeze(-1);
  return SafeDivide(num_BHLD, den_BHL, signed_floor);
}

torch::Tensor Causal(const torch::Tensor& q_BHLM, const torch::Tensor& k_BHLM, const torch::Tensor& b_BHL,
                     const torch::Tensor& v_BHLD, int64_t chunk_size, double signed_floor) {
  const int64_t length = q_BHLM.size(2);
  // r_i = max_{j <= i} b_j: the reference of query i, a prefix quantity.
  const auto r_BHL = std::get<0>(b_BHL.cummax(-1));
  const auto tril_CC = torch::ones({chunk_size, chunk_size}, torch::TensorOptions().dtype(torch::kBool).device(q_BHLM.device())).tril();
  const double neg_inf = -std::numeric_limits<double>::infinity();
  torch::Tensor state_BHMD, norm_BHM, state_ref_BH;  // sums over earlier chunks, relative to state_ref
  std::vector<torch::Tensor> outputs;
  // split, not narrow per chunk: one backward node concatenates the chunk gradients, where each
  // narrow's backward would materialise a full-length gradient (quadratic time and memory).
  const auto q_chunks = q_BHLM.split(chunk_size, 2), k_chunks = k_BHLM.split(chunk_size, 2),
             v_chunks = v_BHLD.split(chunk_size, 2), b_chunks = b_BHL.split(chunk_size, -1),
             r_chunks = r_BHL.split(chunk_size, -1);
  for (size_t index = 0; index < q_chunks.size(); ++index) {
    const int64_t start = static_cast<int64_t>(index) * chunk_size;
    const auto& q_BHCM = q_chunks[index];
    const auto& k_BHCM = k_chunks[index];
    const auto& v_BHCD = v_chunks[index];
    const auto& b_BHC = b_chunks[index];
    const auto& r_BHC = r_chunks[index];
    const int64_t c = q_BHCM.size(2);
    // Inside the chunk: a_ij = q_i.k_j * exp(b_j - r_i) for j <= i (exponent <= 0); later keys are
    // masked before the exp, so they can neither overflow nor touch query i.
    const auto tril = tril_CC.narrow(0, 0, c).narrow(1, 0, c);
    const auto log_w_BHCC = (b_BHC.unsqueeze(-2) - r_BHC.unsqueeze(-1)).masked_fill(tril.logical_not(), neg_inf);
    const auto a_BHCC = Fp32Matmul(q_BHCM, k_BHCM.transpose(-1, -2)) * torch::exp(log_w_BHCC);
    auto num_BHCD = Fp32Matmul(a_BHCC, v_BHCD);
    auto den_BHC = a_BHCC.sum(-1);
    if (state_BHMD.defined()) {
      // Earlier chunks, brought from their reference to r_i (>= it: the factor is <= 1).
      const auto factor_BHC = torch::exp(state_ref_BH.unsqueeze(-1) - r_BHC);
      num_BHCD = num_BHCD + Fp32Matmul(q_BHCM, state_BHMD) * factor_BHC.unsqueeze(-1);
      den_BHC = den_BHC + Fp32Matmul(q_BHCM, norm_BHM.unsqueeze(-1)).squeeze(-1) * factor_BHC;
    }
    outputs.push_back(SafeDivide(num_BHCD, den_BHC, signed_floor));
    if (start + c >= length) break;
    // Fold this chunk into the running state at the new reference (the prefix max at its end);
    // rescaling the old state when the max grows keeps every exponent <= 0.
    const auto new_ref_BH = r_BHC.select(-1, c - 1);
    const auto kw_BHCM = k_BHCM * torch::exp(b_BHC - new_ref_BH.unsqueeze(-1)).unsqueeze(-1);
    const auto chunk_state_BHMD = Fp32Matmul(kw_BHCM.transpose(-1, -2), v_BHCD);
    const auto chunk_norm_BHM = kw_BHCM.sum(-2);
    if (state_BHMD.defined()) {
      const auto rescale_BH = torch::exp(state_ref_BH - new_ref_BH);
      state_BHMD = state_BHMD * rescale_BH.unsqueeze(-1).unsqueeze(-1) + chunk_state_BHMD;
      norm_BHM = norm_BHM * rescale_BH.unsqueeze(-1) + chunk_norm_BHM;
    } else {
      state_BHMD = chunk_state_BHMD;
      norm_BHM = chunk_norm_BHM;
    }
    state_ref_BH = new_ref_BH;
  }
  return torch::cat(outputs, 2);
}

}  // namespace

torch::Tensor LinearAttention(const torch::Tensor& query_features_BHLM, const torch::Tensor& key_features_BHLM,
                              const torch::Tensor& key_log_scale_BHL, const torch::Tensor& v_BHLD, bool causal,
                              int64_t chunk_size, double signed_floor) {
  DF_CHECK(chunk_size > 0, "LinearAttention: chunk_size must be positive, got " << chunk_size);
  DF_CHECK(query_features_BHLM.dim() == 4 && key_features_BHLM.sizes() == query_features_BHLM.sizes(),
           "LinearAttention: query/key features must be BHLM of equal shape, got "
               << query_features_BHLM.sizes() << " and " << key_features_BHLM.sizes());
  const auto dtype = query_features_BHLM.scalar_type();
  const auto k_BHLM = key_features_BHLM.to(dtype);
  const auto v = v_BHLD.to(dtype);
  const auto b_BHL = key_log_scale_BHL.defined()
                         ? key_log_scale_BHL.to(dtype).detach()
                         : torch::zeros(k_BHLM.sizes().slice(0, 3), k_BHLM.options());
  return causal ? Causal(query_features_BHLM, k_BHLM, b_BHL, v, chunk_size, signed_floor)
                : NonCausal(query_features_BHLM, k_BHLM, b_BHL, v, signed_floor);
}

}  // namespace darkformer
