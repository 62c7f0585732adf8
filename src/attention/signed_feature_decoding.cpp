// Recurrent decoding with signed features (see signed_feature_decoding.h).
#include "attention/signed_feature_decoding.h"

#include <vector>

#include "attention/ops/fp32_products.h"
#include "attention/ops/state_fold.h"

namespace darkformer {

namespace {

struct SignedFeatureState : DecodeState {
  causal_ops::KeyState sums;  // sum_j exp(b_j - ref) f(k_j) [v_j, 1]^T per head (B x H x M x V) and ref
  int64_t Bytes() const override { return NbytesOrZero(sums.s_XMV) + NbytesOrZero(sums.ref_X); }
};

}  // namespace

torch::Tensor SignedFeatureDecode(std::unique_ptr<DecodeState>& state, const torch::Tensor& q_BHTM,
                                  const torch::Tensor& k_BHTM, const torch::Tensor& b_BHT, const torch::Tensor& v_BHTD,
                                  double normaliser_floor) {
  if (!state) state = std::make_unique<SignedFeatureState>();
  auto& s = dynamic_cast<SignedFeatureState&>(*state);
  const int64_t new_tokens = q_BHTM.size(2), dv = v_BHTD.size(-1);
  const auto v = v_BHTD.to(q_BHTM.scalar_type());
  const auto vh_BHTV = torch::cat({v, torch::ones_like(v.narrow(-1, 0, 1))}, -1);
  const auto b = b_BHT.defined() ? b_BHT.to(q_BHTM.scalar_type()) : torch::zeros(k_BHTM.sizes().slice(0, 3), k_BHTM.options());
  std::vector<torch::Tensor> outs;
  for (int64_t t = 0; t < new_tokens; ++t) {
    // Fold key t at the new running max (the state rescaled down when it grows), then read.
    const auto b_BH = b.select(2, t);
    const auto ref_BH = s.sums.ref_X.defined() ? torch::maximum(s.sums.ref_X, b_BH) : b_BH;
    s.sums.Fold(k_BHTM.narrow(2, t, 1), b.narrow(2, t, 1), vh_BHTV.narrow(2, t, 1), ref_BH);
    const auto n_BHV = Fp32Matmul(q_BHTM.select(2, t).unsqueeze(-2), s.sums.s_XMV).squeeze(-2);
    const auto den_BH = n_BHV.select(-1, dv);
    const auto safe_BH = torch::where(den_BH >= 0, den_BH.clamp_min(normaliser_floor), den_BH.clamp_max(-normaliser_floor));
    outs.push_back((n_BHV.narrow(-1, 0, dv) / safe_BH.unsqueeze(-1)).unsqueeze(2));
  }
  s.tokens += new_tokens;
  return torch::cat(outs, 2);
}

}  // namespace darkformer
