// SLAY (003): attention with the spherical Yat kernel K(t) = t^2 / (C - 2t), C = 2 + epsilon, of
// t = q^.k^ for unit-norm q^ = q/|q|, k^ = k/|k| (bounded by 1/epsilon). Bernstein's integral
// 1/(C - 2t) = int_0^inf exp(-sC) exp(2st) ds with s = u/C and n-point Gauss-Laguerre nodes u_i,
// weights a_i gives K(t) ~ sum_i (a_i / C) t^2 exp(beta_i t), beta_i = 2 u_i / C. Features:
// t^2 = <q^ (x) q^, k^ (x) k^> (exact, d^2 coordinates, or sketched: (S1 q^) * (S2 q^) / sqrt(p)
// with Gaussian S1, S2, unbiased for t^2) times positive random features of exp(beta t),
// exp(sqrt(beta) w.q^ - beta/2) / sqrt(m), concatenated over the nodes. The polynomial part's
// coordinates are signed, so SLAY is a signed feature map (signed_feature_kernel.h), with no
// log-scale: the unit norms keep every exponent bounded. The layer's scale s does not enter: the
// kernel is defined on directions.
#pragma once

#include "attention/signed_feature_kernel.h"

namespace darkformer {

// n-point Gauss-Laguerre rule (weight e^-u on [0, inf)), Golub-Welsch in fp64: {nodes, weights}.
std::pair<torch::Tensor, torch::Tensor> GaussLaguerre(int64_t n);
// K(t) = t^2 / (C - 2t) and its n-node quadrature sum_i (a_i / C) t^2 exp(2 u_i t / C), fp64.
torch::Tensor YatKernel(const torch::Tensor& t, double epsilon);
torch::Tensor YatQuadrature(const torch::Tensor& t, double epsilon, int64_t nodes);

class SlayKernelImpl : public SignedFeatureKernel {
 public:
  struct Options : SignedOptions {
    int64_t nodes = 3;
    double epsilon = 0.1;
    int64_t sketch_dim = 16;  // 0: the exact d^2 tensor features
    static Options Read(const ConfigReader& reader);  // and refuses unknown keys
  };
  SlayKernelImpl(const KernelShape& shape, const Options& options);
  // The feature map of q or k (any norm; normalised here): x_BNLD -> BNL(n P m).
  torch::Tensor Features(const torch::Tensor& x_BNLD) const;
  torch::Tensor SignedFeatures(const torch::Tensor& x_BNLD) const override { return Features(x_BNLD); }
  // The Yat kernel's n-node quadrature YatQuadrature(x^.y^) (what the features are unbiased for).
  torch::Tensor EstimatorTarget(const torch::Tensor& x_BHPD, const torch::Tensor& y_BHPD) const override;
  double MaxLogFeature(const torch::Tensor& x_BHLD) const override;
  double epsilon() const { return epsilon_; }
  int64_t nodes() const { return nodes_; }

 private:
  static constexpr int64_t kDefaultSlayFeatures = 16;
  bool ScalesInputs() const override { return false; }

  double epsilon_;
  int64_t nodes_, sketch_dim_;  // sketch_dim 0: the exact d^2 tensor features
  torch::Tensor sketch_;        // 2 x p x d Gaussian rows (buffer), when sketched
};
TORCH_MODULE(SlayKernel);

}  // namespace darkformer
