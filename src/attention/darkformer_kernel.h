// DARKFormer attention (000 sec. 4.1, eq. 3, Appendix B): a learnable M (r x d) and
// phi(x) = exp(W(Mx) - |Mx|^2/2) / sqrt(m) with rows of W ~ N(0, I_r), so the projections M^T w are
// N(0, M^T M) and E[phi(x).phi(y)] = exp(x^T M^T M y). M = I is exactly the Performer kernel.
// apply_to: queries maps the queries only (keys get Performer's phi): exp(x^T M^T y), a learned
// bilinear form with the same parameters and no metric, the control that separates the two.
// target: softmax keeps the draws M^T w ~ N(0, Sigma) as an importance-sampling proposal for
// exp(x^T y) itself (000 Prop. 4.1 read the other way): each side's feature carries
// sqrt(p_I(M^T w) / p_Sigma(M^T w)), so M changes the estimator's variance and not its kernel.
#pragma once

#include "attention/log_feature_kernel.h"

namespace darkformer {

enum class DarkformerInit { kIdentity, kScaledIdentity, kWhitening };

class DarkformerKernelImpl : public LogFeatureKernel {
 public:
  struct Options {
    FeatureKernelOptions features;
    int64_t rank = 0;  // 0 = head_dim
    bool share_across_heads = false;
    bool queries_only = false;    // apply_to: queries
    bool softmax_target = false;  // target: softmax
    DarkformerInit init = DarkformerInit::kIdentity;
    double init_scale = 1.0;
    double eigen_floor = 1e-4;
    static Options Read(const ConfigReader& reader);  // and refuses unknown keys
  };
  DarkformerKernelImpl(const KernelShape& shape, const Options& options);
  torch::Tensor LogFeaturesWith(const torch::Tensor& x_BNLD, const std::vector<torch::Tensor>& params,
                                bool is_query) const override;
  std::vector<torch::Tensor> FeatureParams() const override;
  // log phi = LogPositiveFeatures(x M^T, W): M applied outside the fused operator (autograd), the
  // features' backward in closed form inside it. Queries only: the two sides' maps differ, so the
  // operator takes LogFeaturesWith.
  // So do importance weights (a per-feature offset and |x|^2 in place of |Mx|^2).
  std::optional<PositiveFeatureForm> PositiveForm() const override {
    if (queries_only_ || softmax_target_) return std::nullopt;
    return PositiveFeatureForm{M, projection_};
  }
  // Per-head M on keys: key features are per query head (the fused operator computes them G times).
  bool KeysPerQueryHead() const override { return M.size(0) > 1 && !queries_only_; }
  std::vector<bool> FeatureParamsPerHead() const override { return {M.size(0) > 1, false}; }
  // exp(x^T M^T M y) (000 eq. 3), exp(x^T M^T y) for queries only, with head 0's M (or the shared
  // one); exp(x^T y) for target: softmax.
  torch::Tensor EstimatorTarget(const torch::Tensor& x_BHPD, const torch::Tensor& y_BHPD) const override;

  // Whitening init (000 Appendix C): M = Lambda^-1/2 from the pooled covariance Lambda of
  // x = sqrt(s) q and y = sqrt(s) k (per head, or over all heads when M is shared), computed in
  // fp64 with eigenvalues floored at eigen_floor. With r < d, M keeps the r directions of largest
  // variance: M = diag(lambda_top^-1/2) U_top^T.
  void Calibrate(const torch::Tensor& q_BHLD, const torch::Tensor& k_BHLD, double scale) override;
  bool wants_calibration() const override { return init_ == DarkformerInit::kWhitening; }

  DarkformerInit init() const { return init_; }
  torch::Tensor M;  // (H or 1) x r x d, trainable

 private:
  // target: softmax's log phi (darkformer_kernel.cpp) for M per head or shared and the draw W.
  torch::Tensor ImportanceWeightedLogFeatures(const torch::Tensor& x_BNLD, const torch::Tensor& m,
                                              const torch::Tensor& w) const;
  DarkformerInit init_;
  double eigen_floor_;
  bool queries_only_;
  bool softmax_target_;
};
TORCH_MODULE(DarkformerKernel);

}  // namespace darkformer
