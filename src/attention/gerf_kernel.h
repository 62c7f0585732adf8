// GERF / FAVOR++ attention (002 sec. 2.3, eq. 10-13): positive features
// phi(x) = D exp(A |w|^2 + B w^T x - |x|^2 / 2) / sqrt(m), w ~ N(0, I_d), A < 1/8,
// B = sqrt(1 - 4A), D = (1 - 4A)^{d/4}; unbiased for exp(x^T y) for every such A, A = 0 being
// Performer. A is fixed (`a: <number>`) or the variance-optimal A* of 002 eq. 13 (`a: optimal`),
// A* = (1 - 2 rho - sqrt((2 rho + 1)^2 + 8 rho)) / 16, rho = mean |x + y|^2 / d, from a
// calibration batch of the layer's x and y pooled over heads (so key features stay once per KV
// head); until calibrated A = 0. A is a buffer: checkpoints keep it.
#pragma once

#include "attention/log_feature_kernel.h"

namespace darkformer {

// 002 eq. 13 from the homogeneity statistic rho = mean |x + y|^2 / d.
double OptimalGerfA(double rho);
// rho of 002 eq. 13 from samples x_ND and y_ND (rows): (mean|x|^2 + mean|y|^2 + 2 mean(x).mean(y)) / d.
double GerfRho(const torch::Tensor& x_ND, const torch::Tensor& y_ND);
// Closed-form variance of one feature's product phi(x) phi(y) (m = 1) under w ~ N(0, I_d), for x_PD, y_PD:
// (1-4A)^d (1-8A)^{-d/2} exp(2 (1-4A) |x+y|^2 / (1-8A) - |x|^2 - |y|^2) - exp(2 x.y).
torch::Tensor GerfClosedFormVariance(const torch::Tensor& x_PD, const torch::Tensor& y_PD, double a);
// log phi for inputs x_BNLD (already transformed), projection w_MD and A (a 1-element tensor).
torch::Tensor GerfLogFeatures(const torch::Tensor& x_BNLD, const torch::Tensor& w_MD, const torch::Tensor& a);

class GerfKernelImpl : public LogFeatureKernel {
 public:
  struct Options {
    FeatureKernelOptions features;
    double a = 0.0;  // A when fixed
    bool optimal_a = false;
    // `a` as gerf declares it; saderf declares its own default and doc line.
    static Options Read(const ConfigReader& reader, const char* default_a = "0",
                        const char* a_doc = "A < 1/8 (0 = performer), or optimal: A* of 002 eq. 13 from a calibration batch (a buffer)");
  };
  GerfKernelImpl(const KernelShape& shape, const Options& options);
  torch::Tensor LogFeaturesWith(const torch::Tensor& x_BNLD, const std::vector<torch::Tensor>& params,
                                bool is_query) const override;
  std::vector<torch::Tensor> FeatureParams() const override { return {projection_, a_}; }
  // exp(x.y) for every A < 1/8 (002 sec. 2.3); saderf too (Psi x . Psi^-1 y = x.y).
  torch::Tensor EstimatorTarget(const torch::Tensor& x_BHPD, const torch::Tensor& y_BHPD) const override {
    return SoftmaxKernelTarget(x_BHPD, y_BHPD);
  }
  bool wants_calibration() const override { return optimal_a_; }
  void Calibrate(const torch::Tensor& q_BHLD, const torch::Tensor& k_BHLD, double scale) override;
  double a() const { return a_.item<double>(); }

 protected:
  // Sets A* from transformed samples x_ND, y_ND (when `a: optimal`).
  void SetOptimalA(const torch::Tensor& x_ND, const torch::Tensor& y_ND);

  torch::Tensor a_;  // A, 1 element, fp32 buffer
  bool optimal_a_ = false;
};
TORCH_MODULE(GerfKernel);

}  // namespace darkformer
