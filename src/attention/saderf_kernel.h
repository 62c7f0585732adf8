// SADERF / FAVOR# attention (002 sec. 4.3, eq. 18-20): GERF (gerf_kernel.h) applied to Psi x for
// queries and Psi^-1 y for keys, Psi = diag(psi) so that (Psi x)^T (Psi^-1 y) = x^T y: still
// unbiased for exp(x^T y). Minimising the shifted log-variance gives per coordinate
// psi_l = (sum_j y_jl^2 / sum_i x_il^2)^{1/4}, then A* (`a: optimal`, the default) from the
// transformed statistics. Both come from a calibration batch (pooled over heads, so key
// features stay once per KV head) and are buffers; until calibrated psi = 1 and A = 0.
#pragma once

#include "attention/gerf_kernel.h"

namespace darkformer {

// 002 eq. 19: psi_D from samples x_ND, y_ND (coordinates with no mass on either side keep 1).
torch::Tensor SaderfPsi(const torch::Tensor& x_ND, const torch::Tensor& y_ND);

class SaderfKernelImpl : public GerfKernelImpl {
 public:
  // gerf's options; FAVOR# is defined with the optimal A, and a fixed `a` is still accepted.
  struct Options : GerfKernelImpl::Options {
    static Options Read(const ConfigReader& reader) {
      return {GerfKernelImpl::Options::Read(reader, "optimal", "optimal (FAVOR#'s definition) or a fixed A < 1/8")};
    }
  };
  SaderfKernelImpl(const KernelShape& shape, const Options& options);
  torch::Tensor LogFeaturesWith(const torch::Tensor& x_BNLD, const std::vector<torch::Tensor>& params,
                                bool is_query) const override;
  std::vector<torch::Tensor> FeatureParams() const override { return {projection_, a_, psi_}; }
  bool wants_calibration() const override { return true; }
  void Calibrate(const torch::Tensor& q_BHLD, const torch::Tensor& k_BHLD, double scale) override;
  const torch::Tensor& psi() const { return psi_; }

 private:
  torch::Tensor psi_;  // D, fp32 buffer
};
TORCH_MODULE(SaderfKernel);

}  // namespace darkformer
