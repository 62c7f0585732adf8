// The recurrent form (see recurrent_step.h).
#include "attention/ops/recurrent_step.h"

#include <tuple>

#include "attention/ops/chunk_common.h"
#include "attention/ops/cuda_op.h"
#include "attention/ops/fp32_products.h"
#include "util/mixed_precision.h"

namespace darkformer {

using namespace causal_ops;

namespace {

// Folds keys with log-features l_BKFCM and values [v, 1] vh_BK1CV into the state at the new
// per-feature max (the old rows decay by exp(R_old - R_new) <= 1, the new keys' factors are <= 1).
void FoldKeys(LinearAttentionState& state, const torch::Tensor& l_BKFCM, const torch::Tensor& vh_BK1CV) {
  auto ref_BKFM = l_BKFCM.amax(-2);
  if (state.ref_BKFM.defined()) ref_BKFM = torch::maximum(ref_BKFM, state.ref_BKFM);
  const auto k_BKFCM = torch::exp(l_BKFCM - ref_BKFM.unsqueeze(-2));
  const auto chunk_BKFMV = torch::matmul(k_BKFCM.transpose(-1, -2), vh_BK1CV);
  state.state_BKFMV = state.state_BKFMV.defined()
                          ? state.state_BKFMV * torch::exp(state.ref_BKFM - ref_BKFM).unsqueeze(-1) + chunk_BKFMV
                          : chunk_BKFMV;
  state.ref_BKFM = ref_BKFM;
}

}  // namespace

LinearAttentionState LinearAttentionPrefillState(const torch::Tensor& y_BKLD, const torch::Tensor& v_BKLD,
                                                 const FeatureMap& map, int64_t num_query_heads,
                                                 int64_t chunk_size) {
  DF_CHECK(chunk_size > 0, "LinearAttentionPrefillState: chunk_size must be positive, got " << chunk_size);
  NoAutocastGuard no_autocast;
  NoTf32Scope fp32_products;  // as the operator's forms (fp32_products.h)
  LinearAttentionState state;
  if (map.op == CausalOp::kCuda) {  // the CUDA operator's own scan
    std::tie(state.state_BKFMV, state.ref_BKFM) = CudaPrefillState(y_BKLD, v_BKLD, map, num_query_heads, chunk_size);
    state.tokens = y_BKLD.size(2);
    return state;
  }
  const auto x_probe = y_BKLD.narrow(1, 0, 1).expand({y_BKLD.size(0), num_query_heads, y_BKLD.size(2), y_BKLD.size(3)});
  const auto l = MakeLayout(x_probe, y_BKLD, v_BKLD, map);
  for (int64_t start = 0; start < l.length; start += chunk_size) {
    const int64_t c = std::min(chunk_size, l.length - start);
    const auto l_BKFCM = KeyLogFeatures(map, map.params, y_BKLD.narrow(2, start, c), l);
    FoldKeys(state, l_BKFCM, WithOnes(v_BKLD.narrow(2, start, c).to(l_BKFCM.scalar_type())));
  }
  state.tokens = l.length;
  return state;
}

torch::Tensor LinearAttentionStep(LinearAttentionState& state, const torch::Tensor& x_BH1D,
                                  const torch::Tensor& y_BK1D, const torch::Tensor& v_BK1D, const FeatureMap& map) {
  NoAutocastGuard no_autocast;
  NoTf32Scope fp32_products;
  const auto l = MakeLayout(x_BH1D, y_BK1D, v_BK1D, map);
  DF_CHECK(l.length == 1, "LinearAttentionStep takes one token, got " << l.length);
  const auto l_BKF1M = KeyLogFeatures(map, map.params, y_BK1D, l);
  FoldKeys(state, l_BKF1M, WithOnes(v_BK1D.to(l_BKF1M.scalar_type())));
  state.tokens += 1;
  // The query against every key so far, itself included: s = max_i (a_i + R_i).
  const auto a_BKG1M = QueryLogFeatures(map, map.params, x_BH1D, l) + state.ref_BKFM.unsqueeze(-2);
  const auto q_BKG1M = torch::exp(a_BKG1M - a_BKG1M.amax(-1, /*keepdim=*/true));
  const auto n_BKG1V = torch::matmul(q_BKG1M, state.state_BKFMV);
  const auto den_BKG1 = n_BKG1V.select(-1, l.value_dim);  // >= 1: no floor
  return (n_BKG1V.narrow(-1, 0, l.value_dim) / den_BKG1.unsqueeze(-1)).reshape({l.batch, l.heads, 1, l.value_dim});
}

}  // namespace darkformer
