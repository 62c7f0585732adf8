// ADERF and SDERF attention (FAVOR#, 002 sec. 4.1-4.2): dense-exponential positive features
// (derf_parameters.h) whose variance-optimal parameters come in closed form from a calibration
// batch's second moments: ADERF (`aderf`) rescales queries and keys by dense P_1 = P_2^-T (an
// SVD, Thm 4.2), SDERF (`sderf`) rotates both by one orthogonal Q_3^T and gives every rotated
// coordinate its own A (an eigendecomposition, Thm 4.3). Statistics are pooled over heads (key
// features stay once per KV head) and taken from the calibration batch, never the current
// sequence; a, P_query and P_key are buffers that checkpoints carry. Until calibrated a = 0 and
// P = I: Performer. Options beyond the feature-kernel ones: aderf's `ridge` (default 1e-4), the
// regularisation M_k + ridge (tr M_k / d) I that keeps Thm 4.2's inverses finite.
#pragma once

#include "attention/log_feature_kernel.h"

namespace darkformer {

class DerfKernelImpl : public LogFeatureKernel {
 public:
  enum class Variant { kAsymmetric, kSymmetric };  // aderf | sderf
  struct Options {
    FeatureKernelOptions features;
    double ridge = 1e-4;  // aderf only
    static Options Read(const ConfigReader& reader, Variant variant);  // and refuses unknown keys
  };
  DerfKernelImpl(const KernelShape& shape, const Options& options, Variant variant);
  torch::Tensor LogFeaturesWith(const torch::Tensor& x_BNLD, const std::vector<torch::Tensor>& params,
                                bool is_query) const override;
  std::vector<torch::Tensor> FeatureParams() const override { return {projection_, a_, p_query_, p_key_}; }
  // exp(x.y) for every valid a, P (002 Thm 4.1): P_query^T P_key = I.
  torch::Tensor EstimatorTarget(const torch::Tensor& x_BHPD, const torch::Tensor& y_BHPD) const override {
    return SoftmaxKernelTarget(x_BHPD, y_BHPD);
  }
  bool wants_calibration() const override { return true; }
  void Calibrate(const torch::Tensor& q_BHLD, const torch::Tensor& k_BHLD, double scale) override;
  double ridge() const { return ridge_; }

 private:
  Variant variant_;
  double ridge_;
  torch::Tensor a_;        // D, fp32 buffer: diagonal of A
  torch::Tensor p_query_;  // D x D, fp32 buffer: P_1
  torch::Tensor p_key_;    // D x D, fp32 buffer: P_2
};

struct AderfKernelImpl : DerfKernelImpl {
  struct Options : DerfKernelImpl::Options {
    static Options Read(const ConfigReader& reader) { return {DerfKernelImpl::Options::Read(reader, Variant::kAsymmetric)}; }
  };
  AderfKernelImpl(const KernelShape& shape, const Options& options) : DerfKernelImpl(shape, options, Variant::kAsymmetric) {}
};
TORCH_MODULE(AderfKernel);

struct SderfKernelImpl : DerfKernelImpl {
  struct Options : DerfKernelImpl::Options {
    static Options Read(const ConfigReader& reader) { return {DerfKernelImpl::Options::Read(reader, Variant::kSymmetric)}; }
  };
  SderfKernelImpl(const KernelShape& shape, const Options& options) : DerfKernelImpl(shape, options, Variant::kSymmetric) {}
};
TORCH_MODULE(SderfKernel);

}  // namespace darkformer
