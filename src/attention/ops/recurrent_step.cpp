// The recurrent form (see recurrent_step.h).
#include "attention/ops/recurrent_step.h"

#include "attention/ops/chunk_common.h"
#include "attention/ops/state_fold.h"
#include "util/mixed_precision.h"

namespace darkformer {

using namespace causal_ops;

LinearAttentionState LinearAttentionPrefillState(const torch::Tensor& y_BKLD, const torch::Tensor& v_BKLD,
                                                 const FeatureMap& map, int64_t num_query_heads,
                                                 int64_t chunk_size) {
  DF_CHECK(chunk_size > 0, "LinearAttentionPrefillState: chunk_size must be positive, got " << chunk_size);
  NoAutocastGuard no_autocast;
  const auto x_probe = y_BKLD.narrow(1, 0, 1).expand({y_BKLD.size(0), num_query_heads, y_BKLD.size(2), y_BKLD.size(3)});
  const auto l = MakeLayout(x_probe, y_BKLD, v_BKLD, map);
  KeyState state;
  for (int64_t start = 0; start < l.length; start += chunk_size) {
    const int64_t c = std::min(chunk_size, l.length - start);
    const auto key = SplitKeys(KeyLogFeatures(map, map.params, y_BKLD.narrow(2, start, c), l));
    auto r_BKFC = std::get<0>(key.b_BKFC.cummax(-1));
    if (state.ref_X.defined()) r_BKFC = torch::maximum(r_BKFC, state.ref_X.unsqueeze(-1));
    state.Fold(key.k_BKFCM, key.b_BKFC, WithOnes(v_BKLD.narrow(2, start, c).to(key.k_BKFCM.scalar_type())),
               r_BKFC.select(-1, c - 1));
  }
  return {state.s_XMV, state.ref_X, l.length};
}

torch::Tensor LinearAttentionStep(LinearAttentionState& state, const torch::Tensor& x_BH1D,
                                  const torch::Tensor& y_BK1D, const torch::Tensor& v_BK1D, const FeatureMap& map) {
  NoAutocastGuard no_autocast;
  const auto l = MakeLayout(x_BH1D, y_BK1D, v_BK1D, map);
  DF_CHECK(l.length == 1, "LinearAttentionStep takes one token, got " << l.length);
  const auto key = SplitKeys(KeyLogFeatures(map, map.params, y_BK1D, l));
  // The new reference: the running max including this key (the state is rescaled down to it).
  const auto b_BKF = key.b_BKFC.squeeze(-1);
  const auto new_ref_BKF = state.ref_BKF.defined() ? torch::maximum(state.ref_BKF, b_BKF) : b_BKF;
  KeyState keys(state.state_BKFMV, state.ref_BKF);
  keys.Fold(key.k_BKFCM, key.b_BKFC, WithOnes(v_BK1D.to(key.k_BKFCM.scalar_type())), new_ref_BKF);
  state = {keys.s_XMV, keys.ref_X, state.tokens + 1};
  const auto q_BKG1M = ShiftedQueryFeatures(QueryLogFeatures(map, map.params, x_BH1D, l));
  const auto n_BKG1V = torch::matmul(q_BKG1M, state.state_BKFMV);
  const auto den_BKG1 = n_BKG1V.select(-1, l.value_dim).clamp_min(Tiny(n_BKG1V));
  return (n_BKG1V.narrow(-1, 0, l.value_dim) / den_BKG1.unsqueeze(-1)).reshape({l.batch, l.heads, 1, l.value_dim});
}

}  // namespace darkformer
