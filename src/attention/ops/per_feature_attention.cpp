// The per-feature stabilised composite form (see per_feature_attention.h).
#include "attention/ops/per_feature_attention.h"

#include <limits>

#include "attention/ops/fp32_products.h"
#include "util/error.h"

namespace darkformer {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// [v, 1]: the normaliser rides along as the last column.
torch::Tensor WithOnes(const torch::Tensor& v) { return torch::cat({v, torch::ones_like(v.narrow(-1, 0, 1))}, -1); }

torch::Tensor Divide(const torch::Tensor& n_BHLV) {
  const int64_t d = n_BHLV.size(-1) - 1;
  return n_BHLV.narrow(-1, 0, d) / n_BHLV.narrow(-1, d, 1);
}

torch::Tensor NonCausal(const torch::Tensor& a, const torch::Tensor& l, const torch::Tensor& v) {
  // Every key is visible to every query: R_i is the max over all keys.
  const auto r_BH1M = l.amax(2, /*keepdim=*/true).detach();
  const auto s_BHL1 = (a.detach() + r_BH1M).amax(-1, /*keepdim=*/true);
  const auto q_BHLM = torch::exp(a + r_BH1M - s_BHL1);
  const auto k_BHLM = torch::exp(l - r_BH1M);
  return Divide(Fp32Matmul(q_BHLM, Fp32Matmul(k_BHLM.transpose(-1, -2), WithOnes(v))));
}

torch::Tensor Causal(const torch::Tensor& a, const torch::Tensor& l, const torch::Tensor& v, int64_t chunk_size) {
  const auto later_CC1 = torch::ones({chunk_size, chunk_size}, a.options().dtype(torch::kBool)).triu(1).unsqueeze(-1);
  torch::Tensor state_BHMV, ref_BHM;  // keys of earlier chunks relative to their per-feature max
  std::vector<torch::Tensor> outputs;
  // split, not narrow: one backward node concatenates the chunk gradients.
  const auto a_chunks = a.split(chunk_size, 2), l_chunks = l.split(chunk_size, 2), v_chunks = v.split(chunk_size, 2);
  for (size_t index = 0; index < a_chunks.size(); ++index) {
    const auto &a_BHCM = a_chunks[index], &l_BHCM = l_chunks[index];
    const auto vh_BHCV = WithOnes(v_chunks[index]);
    const int64_t c = a_BHCM.size(2);
    // R_i(t) for the chunk's positions: its keys' prefix max, against the state's.
    auto r_BHCM = std::get<0>(l_BHCM.detach().cummax(2));
    if (ref_BHM.defined()) r_BHCM = torch::maximum(r_BHCM, ref_BHM.unsqueeze(2));
    const auto s_BHC = (a_BHCM.detach() + r_BHCM).amax(-1);
    // Pairs inside the chunk, feature by feature: a_ti + l_ji - s_t <= 0 for j <= t; later keys
    // are masked before the exp (they can neither overflow nor reach query t).
    const auto args_BHCCM = (a_BHCM - s_BHC.unsqueeze(-1)).unsqueeze(3) + l_BHCM.unsqueeze(2);
    const auto later = later_CC1.narrow(0, 0, c).narrow(1, 0, c);
    const auto w_BHCC = torch::exp(args_BHCCM.masked_fill(later, kNegInf)).sum(-1);
    auto n_BHCV = Fp32Matmul(w_BHCC, vh_BHCV);
    if (state_BHMV.defined()) {
      const auto q_BHCM = torch::exp(a_BHCM + ref_BHM.unsqueeze(2) - s_BHC.unsqueeze(-1));  // <= 1
      n_BHCV = n_BHCV + Fp32Matmul(q_BHCM, state_BHMV);
    }
    outputs.push_back(Divide(n_BHCV));
    if (index + 1 == a_chunks.size()) break;
    // Fold the chunk at the new per-feature max; the old rows decay by exp(R_old - R_new) <= 1.
    const auto new_ref_BHM = r_BHCM.select(2, c - 1);
    const auto k_BHCM = torch::exp(l_BHCM - new_ref_BHM.unsqueeze(2));
    const auto chunk_BHMV = Fp32Matmul(k_BHCM.transpose(-1, -2), vh_BHCV);
    state_BHMV = state_BHMV.defined()
                     ? state_BHMV * torch::exp(ref_BHM - new_ref_BHM).unsqueeze(-1) + chunk_BHMV
                     : chunk_BHMV;
    ref_BHM = new_ref_BHM;
  }
  return torch::cat(outputs, 2);
}

}  // namespace

torch::Tensor PerFeatureLinearAttention(const torch::Tensor& a_BHLM, const torch::Tensor& l_BHLM,
                                        const torch::Tensor& v_BHLD, bool causal, int64_t chunk_size) {
  DF_CHECK(chunk_size > 0, "PerFeatureLinearAttention: chunk_size must be positive, got " << chunk_size);
  DF_CHECK(a_BHLM.dim() == 4 && l_BHLM.dim() == 4 && v_BHLD.dim() == 4 && a_BHLM.size(-1) == l_BHLM.size(-1) &&
               l_BHLM.size(2) == v_BHLD.size(2) && (!causal || a_BHLM.size(2) == l_BHLM.size(2)),
           "PerFeatureLinearAttention: log-features BHLM and values BHLD do not match: "
               << a_BHLM.sizes() << ", " << l_BHLM.sizes() << ", " << v_BHLD.sizes());
  const auto v = v_BHLD.to(a_BHLM.scalar_type());
  const auto l = l_BHLM.to(a_BHLM.scalar_type());
  return causal ? Causal(a_BHLM, l, v, chunk_size) : NonCausal(a_BHLM, l, v);
}

}  // namespace darkformer
