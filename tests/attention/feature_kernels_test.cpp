// Kernel-level checks for performer, darkformer, lfk, random and constant: prefix invariance,
// finite-difference gradients in fp64, finiteness at large norms (fp32 and bf16), redraws,
// whitening calibration and option errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>

#include "attention/kernel_traits.h"
#include "attention/darkformer_kernel.h"
#include "attention/feature_kernel_base.h"
#include "attention/kernel_registry.h"
#include "attention/log_feature_kernel.h"
#include "attention/lfk_kernel.h"
#include "attention/performer_kernel.h"
#include "attention/positive_features.h"
#include "attention/saderf_kernel.h"
#include "attention/derf_test_state.h"
#include "attention/finite_difference.h"
#include "rounding_bounds.h"

namespace darkformer {
namespace {

KernelShape Shape(int64_t heads, int64_t head_dim, int64_t layer = 0) {
  KernelShape shape;
  shape.num_heads = heads;
  shape.head_dim = head_dim;
  shape.layer_index = layer;
  return shape;
}

AttentionKernel Make(const std::string& name, const std::string& yaml, const KernelShape& shape) {
  return MakeAttentionKernel(name, shape, ConfigReader(YAML::Load(yaml), "attention." + name));
}

const std::vector<std::string> kAllKernels = KernelNames();
const char* kSmallOptions = "{num_features: 16, chunk_size: 4}";

std::string OptionsFor(const std::string& name) {
  if (name == "gerf") return "{num_features: 16, chunk_size: 4, a: -0.2}";  // A != 0: not Performer
  return (name == "exact" || name == "constant") ? "{}" : name == "random" ? "{seed: 3}" : kSmallOptions;
}

// Moves a kernel's data-dependent state away from the identity it starts at (darkformer's M,
// saderf's psi and A, aderf's and sderf's A and P) so that tests see the kernel itself, not Performer.
void Perturb(AttentionKernelImpl& kernel, double scale) {
  torch::NoGradGuard no_grad;
  PerturbDerf(kernel, scale);
  if (auto dark = dynamic_cast<DarkformerKernelImpl*>(&kernel)) dark->M.add_(scale * torch::randn_like(dark->M));
  if (auto saderf = dynamic_cast<SaderfKernelImpl*>(&kernel)) {
    for (auto& b : saderf->named_buffers()) {
      if (b.key() == "psi") b.value().copy_((scale * torch::randn_like(b.value())).exp());
      if (b.key() == "a") b.value().fill_(-0.15);
    }
  }
}

TEST(FeatureKernelsTest, PrefixInvarianceForEveryKernel) {
  torch::manual_seed(0);
  const int64_t length = 19, t = 8, heads = 2, d = 8;
  const auto q = torch::randn({2, heads, length, d}), k = torch::randn({2, heads, length, d}),
             v = torch::randn({2, heads, length, d});
  auto q2 = q.clone(), k2 = k.clone(), v2 = v.clone();
  const auto later = [&](torch::Tensor& x) { return x.narrow(2, t + 1, length - t - 1); };
  later(q2).normal_().mul_(30.0);  // new tokens after t, and keys with huge norms
  later(k2).normal_().mul_(30.0);
  later(v2).normal_();
  AttentionCall call;
  call.scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (const auto& name : kAllKernels) {
    // A fresh kernel per call with the same seed: the same draws both times.
    const auto a = Make(name, OptionsFor(name), Shape(heads, d))->forward(q, k, v, call);
    const auto b = Make(name, OptionsFor(name), Shape(heads, d))->forward(q2, k2, v2, call);
    const double err = (a.narrow(2, 0, t + 1) - b.narrow(2, 0, t + 1)).abs().max().item<double>();
    std::cout << "[prefix invariance] " << name << ": max change at positions <= " << t << " = " << err << "\n";
    EXPECT_LE(err, 1e-6) << name;
    EXPECT_GT((a.narrow(2, t + 1, 1) - b.narrow(2, t + 1, 1)).abs().max().item<double>(), 1e-3) << name;
  }
}

// The whole pipeline (x = sqrt(s) q, stabilised features, chunked sums) against the plain formula
// out_i = sum_{j<=i} phi(x_i).phi(y_j) v_j / sum_{j<=i} phi(x_i).phi(y_j) with unshifted features in fp64,
// within a rounding bound (rounding_bounds.h). Every weight sum_m exp(a_im + l_jm) is positive. The
// map's own fp32 rounding of the exponents is taken as it is on these inputs (max |a32 - a64| and
// max |l32 - l64|), twice over: the operator evaluates the same sums (x W^T, |x|^2) itself, in its
// own order or base. The operator's shifts give arguments up to 4 A (A = max |log phi|) through at
// most N + 2 exps and products, and each term is summed over m features and L positions.
TEST(FeatureKernelsTest, KernelForwardMatchesUnstabilisedFormula) {
  torch::manual_seed(6);
  const int64_t heads = 2, length = 23, d = 8;
  const auto q = torch::randn({2, heads, length, d}), k = torch::randn({2, heads, length, d}),
             v = torch::randn({2, heads, length, d});
  AttentionCall call;
  call.scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (const std::string& name : KernelNames(KernelFamily::kPositive)) {
    for (bool causal : {true, false}) {
      call.causal = causal;
      auto kernel = std::dynamic_pointer_cast<LogFeatureKernel>(Make(name, OptionsFor(name), Shape(heads, d)).ptr());
      Perturb(*kernel, 0.2);
      const auto out = kernel->forward(q, k, v, call);
      torch::Tensor reference;
      {
        torch::NoGradGuard no_grad;
        const double root = std::sqrt(call.scale);
        const auto phi_x = torch::exp(kernel->LogFeatures(q.to(torch::kFloat64) * root));
        const auto phi_y = torch::exp(kernel->LogFeatures(k.to(torch::kFloat64) * root, /*is_query=*/false));
        auto a = torch::matmul(phi_x, phi_y.transpose(-1, -2));
        if (causal) a = a.tril();
        reference = torch::matmul(a, v.to(torch::kFloat64)) / a.sum(-1, true);
      }
      double bound = 0;
      {
        torch::NoGradGuard no_grad;
        const auto root32 = std::sqrt(call.scale);
        const auto a64 = kernel->LogFeatures(q.to(torch::kFloat64) * root32);
        const auto l64 = kernel->LogFeatures(k.to(torch::kFloat64) * root32, /*is_query=*/false);
        const auto a32 = kernel->LogFeatures(q * root32), l32 = kernel->LogFeatures(k * root32, /*is_query=*/false);
        const double map_error = (a32 - a64).abs().max().item<double>() + (l32 - l64).abs().max().item<double>();
        const double a = std::max(a64.abs().max().item<double>(), l64.abs().max().item<double>());
        const int64_t m = a64.size(-1), chunks = (length + kernel->options().chunk_size - 1) / kernel->options().chunk_size;
        const double weight_error = std::expm1(2 * map_error) + testing::ScaleChainError(chunks + 2, 4 * a);
        bound = testing::PositiveAverageBound(weight_error, m + length + 3, v.abs().max().item<double>());
      }
      const double err = (out.to(torch::kFloat64) - reference).abs().max().item<double>();
      std::cout << "[pipeline] " << name << (causal ? " causal" : " non-causal") << ": max|kernel - plain formula| = " << err
                << " (bound " << bound << ")\n";
      EXPECT_LE(err, bound) << name;
    }
  }
}

using testing::MaxGradientError;

TEST(FeatureKernelsTest, GradientsMatchFiniteDifferencesInFloat64) {
  torch::manual_seed(1);
  const int64_t heads = 2, length = 7, d = 3;
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  auto q = torch::randn({1, heads, length, d}, f64).requires_grad_(), k = torch::randn({1, heads, length, d}, f64).requires_grad_(),
       v = torch::randn({1, heads, length, d}, f64).requires_grad_();
  const auto weights = torch::randn({1, heads, length, d}, f64);
  AttentionCall call;
  call.scale = 0.5;
  const std::string options = "{num_features: 6, chunk_size: 3, projection: iid}";
  for (bool causal : {true, false}) {
    call.causal = causal;
    for (const std::string& name : KernelNames(KernelFamily::kPositive)) {
      auto kernel = Make(name, name == "gerf" ? "{num_features: 6, chunk_size: 3, projection: iid, a: -0.2}" : options,
                         Shape(heads, d));
      kernel->to(torch::kFloat64);
      if (name == "saderf" || name == "aderf" || name == "sderf") Perturb(*kernel, 0.3);
      std::vector<torch::Tensor> inputs = {q, k, v};
      std::string extra;
      if (name == "darkformer") {
        auto dark = std::dynamic_pointer_cast<DarkformerKernelImpl>(kernel.ptr());
        torch::NoGradGuard no_grad;
        dark->M.add_(0.3 * torch::randn_like(dark->M));  // away from identity
        inputs.push_back(dark->M);
        extra = " (incl. M)";
      }
      if (name == "lfk") {
        inputs.push_back(std::dynamic_pointer_cast<LfkKernelImpl>(kernel.ptr())->W);
        extra = " (incl. W)";
      }
      const auto loss = [&] { return (kernel->forward(q, k, v, call) * weights).sum(); };
      const double err = MaxGradientError(loss, inputs);
      std::cout << "[finite differences] " << name << (causal ? " causal" : " non-causal") << extra
                << ": max relative gradient error " << err << "\n";
      EXPECT_LE(err, 1e-6) << name;
    }
  }
}

TEST(FeatureKernelsTest, FiniteOutputsAndGradientsAtLargeNorms) {
  torch::manual_seed(2);
  const int64_t heads = 2, length = 40, d = 8;
  AttentionCall call;
  call.scale = 1.0;  // x = q
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (double norm : {1.0, 10.0, 30.0}) {
      const auto dir = [&] { auto x = torch::randn({1, heads, length, d}); return x / x.norm(2, -1, true) * norm; };
      auto q = dir().to(dtype).requires_grad_(), k = dir().to(dtype).requires_grad_(),
           v = torch::randn({1, heads, length, d}).to(dtype).requires_grad_();
      for (const std::string& name : KernelNames(KernelFamily::kPositive)) {
        auto kernel = Make(name, "{num_features: 32, chunk_size: 16}", Shape(heads, d));
        Perturb(*kernel, 0.3);
        q.mutable_grad() = torch::Tensor();
        k.mutable_grad() = torch::Tensor();
        const auto out = kernel->forward(q, k, v, call);
        EXPECT_EQ(out.scalar_type(), dtype);
        out.to(torch::kFloat32).pow(2).sum().backward();
        bool finite = torch::isfinite(out).all().item<bool>() && torch::isfinite(q.grad()).all().item<bool>() &&
                      torch::isfinite(k.grad()).all().item<bool>() && torch::isfinite(v.grad()).all().item<bool>();
        for (const auto& p : kernel->parameters()) finite = finite && torch::isfinite(p.grad()).all().item<bool>();
        std::cout << "[large norms] " << name << " " << c10::toString(dtype) << " |x|=" << norm
                  << ": outputs and gradients finite = " << finite << "\n";
        EXPECT_TRUE(finite) << name << " |x|=" << norm;
      }
    }
  }
}

TEST(FeatureKernelsTest, KernelStateStaysFloat32UnderBfloat16) {
  auto kernel = Make("darkformer", kSmallOptions, Shape(2, 8));
  kernel->to(torch::kBFloat16);
  for (const auto& p : kernel->named_parameters()) EXPECT_EQ(p.value().scalar_type(), torch::kFloat32) << p.key();
  for (const auto& b : kernel->named_buffers()) {
    const auto expected = b.key() == "projection" ? torch::kFloat32 : torch::kInt64;
    EXPECT_EQ(b.value().scalar_type(), expected) << b.key();
  }
}

TEST(FeatureKernelsTest, RedrawPolicies) {
  auto never = std::dynamic_pointer_cast<FeatureKernelBase>(Make("performer", kSmallOptions, Shape(1, 8)).ptr());
  auto every_n = std::dynamic_pointer_cast<FeatureKernelBase>(
      Make("performer", "{num_features: 16, redraw: every_n, redraw_interval: 3}", Shape(1, 8)).ptr());
  auto every_step = std::dynamic_pointer_cast<FeatureKernelBase>(
      Make("performer", "{num_features: 16, redraw: every_step}", Shape(1, 8)).ptr());
  const auto initial = every_n->projection().clone();
  EXPECT_TRUE(torch::equal(initial, never->projection()));  // same seed and layer: same draw 0
  for (int64_t steps_done = 0; steps_done < 8; ++steps_done) {  // before each of 8 steps
    never->before_train_step(steps_done);
    every_n->before_train_step(steps_done);
    every_step->before_train_step(steps_done);
  }
  EXPECT_EQ(never->draw_count(), 0);
  EXPECT_EQ(every_n->draw_count(), 2);     // before steps 4 and 7 (3 and 6 done)
  EXPECT_EQ(every_step->draw_count(), 7);  // before each step but the first
  EXPECT_TRUE(torch::equal(initial, never->projection()));
  EXPECT_FALSE(torch::equal(initial, every_n->projection()));
  // Layers draw from different seeds.
  auto layer1 = std::dynamic_pointer_cast<FeatureKernelBase>(Make("performer", kSmallOptions, Shape(1, 8, 1)).ptr());
  EXPECT_FALSE(torch::equal(initial, layer1->projection()));
}

TEST(FeatureKernelsTest, DarkformerFeaturesUseMAndPerHeadMatrices) {
  auto kernel = std::dynamic_pointer_cast<DarkformerKernelImpl>(Make("darkformer", kSmallOptions, Shape(3, 4)).ptr());
  EXPECT_EQ(kernel->M.sizes(), torch::IntArrayRef({3, 4, 4}));
  auto shared = std::dynamic_pointer_cast<DarkformerKernelImpl>(
      Make("darkformer", "{share_across_heads: true, rank: 2, init: scaled_identity, init_scale: 0.5}", Shape(3, 4)).ptr());
  EXPECT_EQ(shared->M.sizes(), torch::IntArrayRef({1, 2, 4}));
  EXPECT_EQ(shared->projection().sizes(), torch::IntArrayRef({256, 2}));
  EXPECT_TRUE(torch::allclose(shared->M[0], 0.5 * torch::eye(2, 4)));
  torch::NoGradGuard no_grad;
  kernel->M.normal_();
  const auto x = torch::randn({2, 3, 5, 4});
  const auto expected = LogPositiveFeatures(torch::matmul(x, kernel->M.transpose(-1, -2).unsqueeze(0)), kernel->projection());
  EXPECT_TRUE(torch::allclose(kernel->LogFeatures(x), expected));
  EXPECT_TRUE(torch::allclose(kernel->LogFeatures(x, /*is_query=*/false), expected));
  EXPECT_TRUE(kernel->PositiveForm().has_value());
  EXPECT_TRUE(kernel->KeysPerQueryHead());
}

// apply_to: queries: M x against Performer's features of the unmapped keys, so the fused operator
// takes the generic path (no positive form) with keys once per KV head.
TEST(FeatureKernelsTest, DarkformerOnQueriesOnlyLeavesTheKeysUnmapped) {
  auto kernel = std::dynamic_pointer_cast<DarkformerKernelImpl>(
      Make("darkformer", "{num_features: 16, apply_to: queries}", Shape(3, 4)).ptr());
  EXPECT_EQ(kernel->M.sizes(), torch::IntArrayRef({3, 4, 4}));
  EXPECT_FALSE(kernel->PositiveForm().has_value());
  EXPECT_FALSE(kernel->KeysPerQueryHead());
  torch::NoGradGuard no_grad;
  kernel->M.normal_();
  const auto x = torch::randn({2, 3, 5, 4});
  EXPECT_TRUE(torch::allclose(kernel->LogFeatures(x),
                              LogPositiveFeatures(torch::matmul(x, kernel->M.transpose(-1, -2).unsqueeze(0)), kernel->projection())));
  EXPECT_TRUE(torch::equal(kernel->LogFeatures(x, /*is_query=*/false), LogPositiveFeatures(x, kernel->projection())));
}

// target: softmax: the features are Performer's on the projections u = M^T w, each weighted by
// sqrt(p_I(u) / p_Sigma(u)) with Gaussian densities written out here in fp64 (Sigma^-1 and
// log det Sigma from Sigma = M^T M, not the kernel's closed form). At M = I they are Performer's.
TEST(FeatureKernelsTest, DarkformerSoftmaxTargetWeighsTheDrawsByTheirImportance) {
  const int64_t heads = 3, d = 4;
  auto kernel = std::dynamic_pointer_cast<DarkformerKernelImpl>(
      Make("darkformer", "{num_features: 16, target: softmax}", Shape(heads, d)).ptr());
  EXPECT_FALSE(kernel->PositiveForm().has_value());
  EXPECT_TRUE(kernel->KeysPerQueryHead());
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({2, heads, 5, d});
  EXPECT_TRUE(torch::allclose(kernel->LogFeatures(x), LogPositiveFeatures(x, kernel->projection()), 1e-6, 1e-6));
  kernel->M.add_(0.3 * torch::randn_like(kernel->M));
  const auto x64 = x.to(torch::kFloat64), m64 = kernel->M.to(torch::kFloat64), w64 = kernel->projection().to(torch::kFloat64);
  const auto u_HMD = torch::matmul(w64.unsqueeze(0), m64);  // rows u = M^T w
  const auto sigma_HDD = torch::matmul(m64.transpose(1, 2), m64);
  const auto log_p_identity_HM = -0.5 * u_HMD.pow(2).sum(-1);
  const auto log_p_sigma_HM = -0.5 * (torch::matmul(u_HMD, torch::linalg_inv(sigma_HDD)) * u_HMD).sum(-1) -
                              0.5 * torch::logdet(sigma_HDD).unsqueeze(-1);
  const auto expected = torch::matmul(x64, u_HMD.transpose(1, 2).unsqueeze(0)) - 0.5 * x64.pow(2).sum(-1, true) -
                        0.5 * std::log(16.0) + (0.5 * (log_p_identity_HM - log_p_sigma_HM)).unsqueeze(0).unsqueeze(2);
  for (const bool is_query : {true, false}) {
    EXPECT_TRUE(torch::allclose(kernel->LogFeatures(x, is_query).to(torch::kFloat64), expected, 1e-4, 1e-4)) << is_query;
  }
  EXPECT_TRUE(torch::allclose(kernel->LogFeatures(x64), expected, 1e-10, 1e-10));
  // The target is the softmax kernel, whatever M is.
  const auto y = torch::randn({1, 1, 5, d});
  EXPECT_TRUE(torch::allclose(kernel->EstimatorTarget(x64.narrow(0, 0, 1).narrow(1, 0, 1), y.to(torch::kFloat64)),
                              torch::exp((x64.narrow(0, 0, 1).narrow(1, 0, 1) * y.to(torch::kFloat64)).sum(-1))));
}

TEST(FeatureKernelsTest, WhiteningCalibrationGivesInverseCovariance) {
  torch::manual_seed(5);
  const int64_t heads = 2, d = 4;
  auto kernel = std::dynamic_pointer_cast<DarkformerKernelImpl>(
      Make("darkformer", "{init: whitening, eigen_floor: 1e-6}", Shape(heads, d)).ptr());
  // Head h: x = A_h z with distinct A_h; after calibration M Lambda M^T = I per head.
  const auto a_HDD = torch::randn({heads, d, d}, torch::kFloat64) + 2 * torch::eye(d, torch::kFloat64);
  const auto z = torch::randn({3, heads, 500, d}, torch::kFloat64);
  const auto q = torch::matmul(z, a_HDD.transpose(1, 2).unsqueeze(0));
  const auto k = torch::matmul(torch::randn_like(z), a_HDD.transpose(1, 2).unsqueeze(0));
  const double scale = 0.25;
  kernel->Calibrate(q, k, scale);
  for (int64_t h = 0; h < heads; ++h) {
    auto samples = torch::cat({q.select(1, h), k.select(1, h)}, 1).reshape({-1, d}) * std::sqrt(scale);
    samples = samples - samples.mean(0, true);
    const auto cov = samples.t().mm(samples) / (samples.size(0) - 1);
    const auto m = kernel->M[h].to(torch::kFloat64);
    const double err = (m.mm(cov).mm(m.t()) - torch::eye(d, torch::kFloat64)).abs().max().item<double>();
    std::cout << "[whitening] head " << h << ": max|M Lambda M^T - I| = " << err << "\n";
    EXPECT_LE(err, 1e-5);
  }
}

TEST(FeatureKernelsTest, OptionErrorsNameTheKey) {
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const auto unknown = message([] { Make("perfromer", "{}", Shape(1, 8)); });
  std::cout << "[errors] " << unknown << "\n";
  for (const auto& name : kAllKernels) EXPECT_NE(unknown.find(name), std::string::npos) << unknown;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"performer", "{num_feature: 3}"},   {"performer", "{projection: gaussian}"},
      {"performer", "{redraw: sometimes}"}, {"darkformer", "{init: random}"},
      {"lfk", "{redraw: every_step}"},      {"random", "{sed: 1}"},
      {"darkformer", "{num_features: -1}"}, {"gerf", "{a: 0.2}"},
      {"gerf", "{a: best}"},                {"saderf", "{psi: 1}"},
      {"aderf", "{ridge: 0}"},              {"aderf", "{ridge: -1}"},
      {"aderf", "{ridge: .nan}"},           {"aderf", "{a: -0.1}"},
      {"sderf", "{ridge: 0.001}"},          {"sderf", "{psi: 1}"},
      {"darkformer", "{apply_to: keys}"},   {"darkformer", "{rank: 2, apply_to: queries}"},
      {"darkformer", "{init: whitening, apply_to: queries}"},
      {"darkformer", "{target: kernel}"},   {"darkformer", "{rank: 2, target: softmax}"},
      {"darkformer", "{apply_to: queries, target: softmax}"},
  };
  for (const auto& [name, yaml] : cases) {
    const auto text = message([&] { Make(name, yaml, Shape(1, 8)); });
    const auto key = YAML::Load(yaml).begin()->first.as<std::string>();
    std::cout << "[errors] attention." << name << " " << yaml << " -> " << text << "\n";
    EXPECT_NE(text.find("attention." + name + "." + key), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace darkformer
