// DARKFormer kernel (see darkformer_kernel.h).
#include "attention/darkformer_kernel.h"

#include "attention/kernel_registry.h"
#include "attention/ops/fp32_products.h"
#include "attention/positive_features.h"
#include "attention/softmax_estimator.h"

namespace darkformer {

DarkformerKernelImpl::Options DarkformerKernelImpl::Options::Read(const ConfigReader& reader) {
  Options o{FeatureKernelOptions::Read(reader, /*with_redraw=*/true, /*with_op=*/true)};
  o.rank = reader.Get<int64_t>("rank", o.rank, KeySpec("r, rows of M").Min(0, "0 = head_dim"));
  o.share_across_heads = reader.Get<bool>("share_across_heads", o.share_across_heads,
                                          "one M per layer instead of one per query head");
  o.queries_only = reader.GetEnum("apply_to", o.queries_only, {{"both", false}, {"queries", true}},
                                  "what M maps: both (the learned metric, exp(x^T M^T M y)) or queries (keys unmapped: "
                                  "exp(x^T M^T y), a learned bilinear form of the same size and no metric)");
  o.softmax_target = reader.GetEnum(
      "target", o.softmax_target, {{"metric", false}, {"softmax", true}},
      "what the features estimate: metric (exp(x^T M^T M y)) or softmax (exp(x^T y) itself, the draws from N(0, M^T M) "
      "importance-weighted: M shapes the variance only, finite while every eigenvalue of M^T M exceeds 1/2)");
  o.init = reader.GetEnum("init", o.init,
                          {{"identity", DarkformerInit::kIdentity},
                           {"scaled_identity", DarkformerInit::kScaledIdentity},
                           {"whitening", DarkformerInit::kWhitening}},
                          "M's start: identity, init_scale times identity, or Lambda^-1/2 from a calibration batch");
  o.init_scale = reader.Get<double>("init_scale", o.init_scale, "the scale of scaled_identity");
  o.eigen_floor = reader.Get<double>("eigen_floor", o.eigen_floor,
                                     KeySpec("floor on the covariance eigenvalues for whitening").Above(0));
  reader.RejectUnknown();
  // Queries only compares M x with unmapped keys: M must be square, and whitening (a metric's
  // start) has no meaning for it.
  DF_CHECK(!o.queries_only || o.rank == 0,
           "config key '" << reader.KeyPath("rank") << "' = " << o.rank << ValueOrigin(reader.KeyPath("rank"), reader.node()["rank"])
                          << " with '" << reader.KeyPath("apply_to") << "' = queries: keys stay in head_dim dimensions, so M is square; set rank: 0");
  DF_CHECK(!o.queries_only || o.init != DarkformerInit::kWhitening,
           "config key '" << reader.KeyPath("init") << "' = whitening" << ValueOrigin(reader.KeyPath("init"), reader.node()["init"])
                          << " with '" << reader.KeyPath("apply_to") << "' = queries: whitening starts a metric (both sides); use identity or scaled_identity");
  // Importance weights need p_Sigma's density: Sigma = M^T M of full rank, and one M on both sides.
  DF_CHECK(!o.softmax_target || o.rank == 0,
           "config key '" << reader.KeyPath("rank") << "' = " << o.rank << ValueOrigin(reader.KeyPath("rank"), reader.node()["rank"])
                          << " with '" << reader.KeyPath("target") << "' = softmax: the proposal N(0, M^T M) needs a square M; set rank: 0");
  DF_CHECK(!o.softmax_target || !o.queries_only,
           "config key '" << reader.KeyPath("apply_to") << "' = queries" << ValueOrigin(reader.KeyPath("apply_to"), reader.node()["apply_to"])
                          << " with '" << reader.KeyPath("target") << "' = softmax: importance weights sample both sides from one proposal; use apply_to: both");
  return o;
}

DarkformerKernelImpl::DarkformerKernelImpl(const KernelShape& shape, const Options& options)
    : LogFeatureKernel(shape, options.features),
      init_(options.init),
      eigen_floor_(options.eigen_floor),
      queries_only_(options.queries_only),
      softmax_target_(options.softmax_target) {
  const int64_t d = shape.head_dim;
  const int64_t rank = options.rank == 0 ? d : options.rank;
  const bool shared = options.share_across_heads;
  DF_CHECK(!queries_only_ || rank == d, "darkformer: apply_to: queries needs a square M, got rank " << rank << " for head_dim " << d);
  DF_CHECK(!queries_only_ || init_ != DarkformerInit::kWhitening, "darkformer: apply_to: queries takes no whitening init");
  DF_CHECK(!softmax_target_ || (rank == d && !queries_only_),
           "darkformer: target: softmax needs a square M on both sides, got rank " << rank << " for head_dim " << d);
  const double init_scale = options.init_scale;
  RegisterDraw(rank);  // W is m x r
  // Identity (and whitening until Calibrate runs); r != d gives the rectangular identity.
  auto m_init = torch::eye(rank, d, torch::kFloat32);
  if (init_ == DarkformerInit::kScaledIdentity) m_init = m_init * init_scale;
  const int64_t copies = shared ? 1 : shape.num_heads;
  M = register_parameter("M", m_init.unsqueeze(0).repeat({copies, 1, 1}).contiguous());
}

// params = {M (trainable, per head or shared), W (the draw)}; M x then Performer features (keys
// unmapped for queries only).
torch::Tensor DarkformerKernelImpl::LogFeaturesWith(const torch::Tensor& x_BNLD, const std::vector<torch::Tensor>& params,
                                                    bool is_query) const {
  if (queries_only_ && !is_query) return LogPositiveFeatures(x_BNLD, params.at(1));
  if (softmax_target_) return ImportanceWeightedLogFeatures(x_BNLD, params.at(0), params.at(1));
  const auto m_NRD = params.at(0).to(x_BNLD.scalar_type());
  const auto mx_BNLR = Fp32Matmul(x_BNLD, m_NRD.transpose(-1, -2).unsqueeze(0));
  return LogPositiveFeatures(mx_BNLR, params.at(1));
}

// log phi(x) = w.(M x) - |x|^2/2 - log(m)/2 + log rho(w)/2 with rho the importance ratio of the
// projection u = M^T w ~ N(0, Sigma) against N(0, I): log rho = -|u|^2/2 + u^T Sigma^-1 u/2 +
// log det(Sigma)/2 = (|w|^2 - |M^T w|^2)/2 + log|det M| for square M. Then E[phi(x).phi(y)] =
// E_Sigma[exp(u.(x + y) - |x|^2/2 - |y|^2/2) rho(u)] = E_I[...] = exp(x.y). Each row of an
// orthogonal draw is marginally N(0, I), so each feature is unbiased as with Performer. At M = I,
// rho = 1: Performer's features.
torch::Tensor DarkformerKernelImpl::ImportanceWeightedLogFeatures(const torch::Tensor& x_BNLD, const torch::Tensor& m,
                                                                  const torch::Tensor& w) const {
  const auto dtype = FeatureDtype(x_BNLD.scalar_type());
  const auto x = x_BNLD.to(dtype).contiguous();
  const auto m_NDD = m.to(x.device(), dtype);
  const auto w_MD = w.to(x.device(), dtype);
  const int64_t features = w.size(0);
  const auto proj_BNLM = Fp32Matmul(Fp32Matmul(x, m_NDD.transpose(-1, -2).unsqueeze(0)), w_MD.t());
  const auto mtw_NMD = torch::matmul(w_MD.unsqueeze(0), m_NDD);  // rows (M^T w)^T
  const auto log_det_N = std::get<1>(torch::linalg_slogdet(m_NDD));
  const auto half_log_rho_NM = 0.25 * (w_MD.pow(2).sum(-1).unsqueeze(0) - mtw_NMD.pow(2).sum(-1)) + 0.5 * log_det_N.unsqueeze(-1);
  const auto offset_BNL1 = 0.5 * x.pow(2).sum(-1, /*keepdim=*/true) + 0.5 * std::log(static_cast<double>(features));
  return proj_BNLM - offset_BNL1 + half_log_rho_NM.unsqueeze(0).unsqueeze(2);
}

std::vector<torch::Tensor> DarkformerKernelImpl::FeatureParams() const { return {M, projection_}; }

torch::Tensor DarkformerKernelImpl::EstimatorTarget(const torch::Tensor& x_BHPD, const torch::Tensor& y_BHPD) const {
  torch::NoGradGuard no_grad;  // a reference value, never differentiated
  if (softmax_target_) return SoftmaxKernelTarget(x_BHPD, y_BHPD);
  const auto m_RD = M[0];
  // (M x).y = x.(M^T y) for queries only; (M x).(M y) = x.(M^T M y) for both.
  return SoftmaxKernelTarget(x_BHPD, torch::matmul(y_BHPD, queries_only_ ? m_RD : m_RD.t().mm(m_RD)));
}

void DarkformerKernelImpl::Calibrate(const torch::Tensor& q_BHLD, const torch::Tensor& k_BHLD, double scale) {
  torch::NoGradGuard no_grad;
  const int64_t heads = q_BHLD.size(1), d = q_BHLD.size(3), rank = M.size(1);
  DF_CHECK(d == M.size(2), "Calibrate: head dim " << d << " does not match M " << M.sizes());
  DF_CHECK(M.size(0) == 1 || M.size(0) == heads, "Calibrate: " << heads << " heads for M " << M.sizes());
  const double root = std::sqrt(scale);
  // Samples per head: every position of x and y, pooled (the kernel compares both).
  auto samples_HND = torch::cat({q_BHLD.to(torch::kFloat64) * root, k_BHLD.to(torch::kFloat64) * root}, 2)
                         .transpose(0, 1).reshape({heads, -1, d});
  if (M.size(0) == 1) samples_HND = samples_HND.reshape({1, -1, d});
  const auto centred_HND = samples_HND - samples_HND.mean(1, /*keepdim=*/true);
  const auto cov_HDD = torch::matmul(centred_HND.transpose(1, 2), centred_HND) / std::max<int64_t>(1, samples_HND.size(1) - 1);
  auto [eigenvalues_HD, eigenvectors_HDD] = torch::linalg_eigh(cov_HDD);  // ascending
  const auto inv_root_HD = eigenvalues_HD.clamp_min(eigen_floor_).rsqrt();
  torch::Tensor m_HRD;
  if (rank == d) {
    m_HRD = torch::matmul(eigenvectors_HDD * inv_root_HD.unsqueeze(1), eigenvectors_HDD.transpose(1, 2));
  } else {
    DF_CHECK(rank < d, "Calibrate: rank " << rank << " exceeds head dim " << d);
    const auto top_HDR = eigenvectors_HDD.narrow(2, d - rank, rank);
    m_HRD = (top_HDR * inv_root_HD.narrow(1, d - rank, rank).unsqueeze(1)).transpose(1, 2);
  }
  M.copy_(m_HRD.to(M.options()));
}

// Its registration (kernel_registry.h): the name, the row in the tables, the config section's doc.
namespace {

// phi_Sigma(x) = phi_I(M x) (000 sec. 4.1): Performer's estimator on (M x, M y), which estimates
// exp(x^T M^T M y).
FittedEstimator PerformerOn(const torch::Tensor& m_RD) {
  const auto performer = DerfEstimator(PerformerDerf(m_RD.size(0)));
  const auto mapped = [m_RD](const torch::Tensor& x_PD) { return torch::matmul(x_PD.to(torch::kFloat64), m_RD.t()); };
  FittedEstimator e;
  e.target = "exp(x^T M^T M y)";
  e.target_value = [=](const torch::Tensor& x, const torch::Tensor& y) {
    return SoftmaxTargetValue(mapped(x), mapped(y));
  };
  e.ratios = [=](const torch::Tensor& x, const torch::Tensor& y, int64_t m, int64_t draws, uint64_t seed) {
    return performer.ratios(mapped(x), mapped(y), m, draws, seed);
  };
  e.variance_per_feature = [=](const torch::Tensor& x, const torch::Tensor& y) {
    return performer.variance_per_feature(mapped(x), mapped(y));
  };
  return e;
}

// M = Lambda_hat^-1/2 by the kernel's own Calibrate on the sample (x and y pooled, one head).
torch::Tensor WhiteningOf(const torch::Tensor& x_ND, const torch::Tensor& y_ND) {
  KernelShape shape;
  shape.num_heads = 1;
  shape.head_dim = x_ND.size(1);
  DarkformerKernelImpl::Options options;
  options.init = DarkformerInit::kWhitening;
  DarkformerKernel kernel(shape, options);
  kernel->Calibrate(x_ND.view({1, 1, -1, shape.head_dim}), y_ND.view({1, 1, -1, shape.head_dim}), 1.0);
  return kernel->M[0].detach().to(torch::kFloat64);
}

[[maybe_unused]] const bool kRegistered = RegisterKernel<DarkformerKernel>(
    "darkformer", 10, "phi(x) = exp(W(Mx) - |Mx|^2/2)/sqrt(m): unbiased for exp(x^T M^T M y)");
// Its estimators (softmax_estimator.h): at M = I (Performer's, an independent run) and at the
// whitening M (000 Appendix C), each against its own target.
[[maybe_unused]] const bool kEstimatorIdentity = RegisterEstimator(
    {"darkformer_identity", "darkformer", /*dense_exponential=*/false,
     [](const torch::Tensor& x_ND, const torch::Tensor&) { return DerfEstimator(PerformerDerf(x_ND.size(1))); }});
[[maybe_unused]] const bool kEstimatorWhitening =
    RegisterEstimator({"darkformer_whitening", "darkformer", /*dense_exponential=*/false,
                       [](const torch::Tensor& x_ND, const torch::Tensor& y_ND) {
                         return PerformerOn(WhiteningOf(x_ND, y_ND));
                       }});
}  // namespace

}  // namespace darkformer
