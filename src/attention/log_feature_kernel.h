// Positive feature maps given in log form, log phi(x) (performer, darkformer, lfk, gerf, saderf),
// and the one forward pass they share: x = sqrt(s) q, y = sqrt(s) k -> the fused causal operator
// (fused_causal_attention.h), or stabilised features -> chunked linear attention (the naive
// composite path). The log form is what lets the operator and the stabiliser shift features
// before exponentiating, so nothing overflows.
#pragma once

#include <optional>
#include <vector>

#include "attention/feature_kernel_base.h"
#include "attention/fused_causal_attention.h"

namespace darkformer {

class LogFeatureKernel : public FeatureKernelBase {
 public:
  torch::Tensor forward(const torch::Tensor& q_BHLD, const torch::Tensor& k_BKLD, const torch::Tensor& v_BKLD,
                        const AttentionCall& call) override;
  // Packed documents: the causal operator honours them (document_ids into every form); the naive
  // composite path runs once per document (Attend).
  bool HandlesDocuments(const AttentionCall& call) const override {
    return call.causal && options_.op != CausalOp::kNaive;
  }
  // The recurrent form (fused_causal_attention.h): running sums of phi(k) [v, 1]^T per KV head
  // with the causal-safe reference, fp32, no per-position storage. A first call with several
  // tokens (the prompt) runs forward()'s parallel path and keeps its final state.
  torch::Tensor Decode(std::unique_ptr<DecodeState>& state, const torch::Tensor& q_BHTD, const torch::Tensor& k_BKTD,
                       const torch::Tensor& v_BKTD, const AttentionCall& call) override;

  // log phi(x) for x_BNLD already scaled by sqrt(s) (features in fp32 / fp64), computed from
  // `params` (the tensors FeatureParams() returns, or leaf copies of them): the kernel's gradient
  // path. N is the number of query heads, or of KV heads when the parameters are shared across
  // heads. is_query tells the two sides apart for kernels whose maps differ.
  virtual torch::Tensor LogFeaturesWith(const torch::Tensor& x_BNLD, const std::vector<torch::Tensor>& params,
                                        bool is_query) const = 0;
  virtual std::vector<torch::Tensor> FeatureParams() const = 0;
  // Whether key features depend on the query head (parameters per query head).
  virtual bool KeysPerQueryHead() const { return false; }
  // Which of FeatureParams() have one slice per query head along their first dimension.
  virtual std::vector<bool> FeatureParamsPerHead() const { return {}; }
  torch::Tensor LogFeatures(const torch::Tensor& x_BHLD, bool is_query = true) const {
    return LogFeaturesWith(x_BHLD, FeatureParams(), is_query);
  }
  // The map the fused operator and the recurrent step use.
  FeatureMap MakeFeatureMap() const;
  // Kernels whose log phi(x) is LogPositiveFeatures(x A^T, W) (performer, lfk: A = I; darkformer:
  // A = M) say so here; the causal path then applies A outside the fused operator (autograd
  // carries M's gradient) and the operator differentiates the features in closed form.
  struct PositiveFeatureForm {
    torch::Tensor input_map_NRD;  // A per query head (N = H) or shared (N = 1); undefined: identity
    torch::Tensor w_MR;           // W, shared across heads
  };
  virtual std::optional<PositiveFeatureForm> PositiveForm() const { return std::nullopt; }
  // The causal operator's shadow (the naive path: the composite one).
  ShadowAttention ShadowForward(shadow::Tape& tape, const ShadowAttentionCall& call, const shadow::Shadow& q,
                                const shadow::Shadow& k, const shadow::Shadow& v) const override;
  double MaxLogFeature(const torch::Tensor& x_BHLD) const override {
    return LogFeatures(x_BHLD).max().item<double>();
  }

  // sum_m exp(log phi_m(x) + log phi_m(y)), keys with is_query false.
  torch::Tensor PairEstimate(const torch::Tensor& x_BHPD, const torch::Tensor& y_BHPD) const override;

 protected:
  using FeatureKernelBase::FeatureKernelBase;

 private:
  // The causal fused path of a PositiveForm() kernel.
  torch::Tensor ForwardPositiveFused(const PositiveFeatureForm& form, const torch::Tensor& q_BHLD,
                                     const torch::Tensor& k_BKLD, const torch::Tensor& v_BKLD, double root_scale,
                                     const torch::Tensor& document_ids_BL) const;
};

}  // namespace darkformer
