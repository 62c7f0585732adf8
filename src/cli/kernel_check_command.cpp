// `darkformer kernel-check`: a kernel against exact softmax attention on synthetic inputs
// (estimator mean over independent draws vs exp(x.y), attention-output error, prefix invariance),
// and with --bench its forward+backward time and peak CPU memory vs exact over lengths.
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <fmt/format.h>

#include <chrono>
#include <iostream>

#include "attention/darkformer_kernel.h"
#include "attention/feature_kernel_base.h"
#include "attention/kernel_registry.h"
#include "cli/commands.h"

namespace darkformer {

namespace {

struct KernelCheckArgs {
  std::string kernel = "performer";
  std::string options = "{}";   // the kernel's YAML options section, inline
  int64_t heads = 8, head_dim = 64, length = 512, draws = 200;
  double norm = 1.0;             // row norm of x = sqrt(s) q and y = sqrt(s) k
  uint64_t seed = 0;
  bool bench = false;
  std::vector<int64_t> bench_lengths = {256, 1024, 4096, 16384};
  std::vector<int64_t> bench_head_dims = {64, 256};
  int64_t repeats = 2;
};

AttentionKernel Build(const KernelCheckArgs& a, const std::string& name, const std::string& options, int64_t head_dim,
                      int64_t seed_offset = 0) {
  KernelShape shape;
  shape.num_heads = a.heads;
  shape.head_dim = head_dim;
  auto node = YAML::Load(options);
  if (seed_offset > 0) node["seed"] = node["seed"] ? node["seed"].as<int64_t>() + seed_offset : seed_offset;
  return MakeAttentionKernel(name, shape, ConfigReader(node, "attention." + name));
}

// Rows of norm `norm` (after the sqrt(s) scaling the kernel applies): q = x / sqrt(s).
torch::Tensor Rows(int64_t heads, int64_t length, int64_t d, double norm, double scale) {
  auto x = torch::randn({1, heads, length, d});
  return x / x.norm(2, -1, true) * norm / std::sqrt(scale);
}

void Check(const KernelCheckArgs& a) {
  torch::manual_seed(a.seed);
  AttentionCall call;
  call.scale = 1.0 / std::sqrt(static_cast<double>(a.head_dim));
  const auto q = Rows(a.heads, a.length, a.head_dim, a.norm, call.scale);
  const auto k = Rows(a.heads, a.length, a.head_dim, a.norm, call.scale);
  const auto v = torch::randn({1, a.heads, a.length, a.head_dim});
  torch::NoGradGuard no_grad;
  auto kernel = Build(a, a.kernel, a.options, a.head_dim);
  const auto exact = Build(a, "exact", "{}", a.head_dim)->forward(q, k, v, call);
  const auto out = kernel->forward(q, k, v, call);
  std::cout << fmt::format("{}: B=1 H={} L={} D={} |x|={}\n", a.kernel, a.heads, a.length, a.head_dim, a.norm);
  std::cout << fmt::format("  attention output vs exact: relative L2 error {:.4g}\n",
                           ((out - exact).norm() / exact.norm()).item<double>());
  // Prefix invariance: new tokens (and huge keys) after t must not move outputs at <= t.
  const int64_t t = a.length / 2, rest = a.length - t - 1;
  auto q2 = q.clone(), k2 = k.clone(), v2 = v.clone();
  q2.narrow(2, t + 1, rest).normal_();
  k2.narrow(2, t + 1, rest).normal_().mul_(30.0);
  v2.narrow(2, t + 1, rest).normal_();
  const auto out2 = Build(a, a.kernel, a.options, a.head_dim)->forward(q2, k2, v2, call);
  const auto again = Build(a, a.kernel, a.options, a.head_dim)->forward(q, k, v, call);
  std::cout << fmt::format("  prefix invariance: max change at positions <= {} = {:.3g}\n", t,
                           (again.narrow(2, 0, t + 1) - out2.narrow(2, 0, t + 1)).abs().max().item<double>());
  auto features = std::dynamic_pointer_cast<FeatureKernelBase>(kernel.ptr());
  if (!features) return;
  // Estimator: phi(x).phi(y) over independent draws (seeds) for a few fixed pairs.
  const int64_t pairs = 8;
  const auto x = Rows(1, pairs, a.head_dim, a.norm, 1.0), y = Rows(1, pairs, a.head_dim, a.norm, 1.0);
  std::vector<torch::Tensor> estimates;
  for (int64_t draw = 0; draw < a.draws; ++draw) {
    auto f = std::dynamic_pointer_cast<FeatureKernelBase>(Build(a, a.kernel, a.options, a.head_dim, draw + 1).ptr());
    // Every head sees the same pairs; head 0's estimate is reported.
    const auto x_h = x.expand({1, a.heads, pairs, a.head_dim}), y_h = y.expand({1, a.heads, pairs, a.head_dim});
    estimates.push_back(torch::exp(f->LogFeatures(x_h) + f->LogFeatures(y_h)).sum(-1)[0][0]);
  }
  const auto est_NP = torch::stack(estimates).to(torch::kFloat64);
  auto y_target = y;
  if (auto dark = std::dynamic_pointer_cast<DarkformerKernelImpl>(kernel.ptr())) {  // exp(x^T M^T M y), head 0
    const auto m = dark->M[0];
    y_target = torch::matmul(y, m.t().mm(m));
  }
  const auto target_P = torch::exp((x * y_target).sum(-1).flatten().to(torch::kFloat64));
  const auto ratio_NP = est_NP / target_P;
  const auto mean_P = ratio_NP.mean(0), se_P = ratio_NP.std(0) / std::sqrt(static_cast<double>(a.draws));
  std::cout << fmt::format("  estimator over {} draws ({} at init; darkformer targets exp(x^T M^T M y), = exp(x.y) at M = I):\n",
                           a.draws, a.kernel);
  for (int64_t p = 0; p < pairs; ++p) {
    std::cout << fmt::format("    pair {}: log target = {:+.3f}, mean/target = {:.4f} +- {:.4f}, relative MSE = {:.4g}\n", p,
                             std::log(target_P[p].item<double>()), mean_P[p].item<double>(), se_P[p].item<double>(),
                             (ratio_NP.select(1, p) - 1).pow(2).mean().item<double>());
  }
}

// Peak bytes allocated by the CPU allocator on this thread while installed.
class PeakMemory : public c10::MemoryReportingInfoBase {
 public:
  void reportMemoryUsage(void*, int64_t alloc_size, size_t, size_t, c10::Device device) override {
    if (!device.is_cpu()) return;
    current_ += alloc_size;
    peak_ = std::max(peak_, current_);
  }
  bool memoryProfilingEnabled() const override { return true; }
  int64_t peak() const { return peak_; }

 private:
  int64_t current_ = 0, peak_ = 0;
};

struct Timing {
  double ms = 0;
  double peak_mib = 0;
};

Timing TimeForwardBackward(AttentionKernel kernel, int64_t heads, int64_t length, int64_t d, int64_t repeats) {
  AttentionCall call;
  call.scale = 1.0 / std::sqrt(static_cast<double>(d));
  Timing best{1e300, 0};
  for (int64_t r = 0; r < repeats; ++r) {
    auto info = std::make_shared<PeakMemory>();
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, info);
    auto q = torch::randn({1, heads, length, d}).requires_grad_(), k = torch::randn({1, heads, length, d}).requires_grad_(),
         v = torch::randn({1, heads, length, d}).requires_grad_();
    const auto start = std::chrono::steady_clock::now();
    kernel->forward(q, k, v, call).sum().backward();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    best.ms = std::min(best.ms, ms);
    best.peak_mib = info->peak() / (1024.0 * 1024.0);
  }
  return best;
}

void Bench(const KernelCheckArgs& a) {
  std::cout << fmt::format("forward+backward, CPU fp32, B=1 H={}, {} vs exact, options {} (best of {}; peak = CPU "
                           "allocator bytes on the calling thread, inputs included)\n",
                           a.heads, a.kernel, a.options, a.repeats);
  std::cout << fmt::format("{:>5} {:>7} {:>12} {:>12} {:>12} {:>12}\n", "D", "L", a.kernel + " ms", "exact ms",
                           a.kernel + " MiB", "exact MiB");
  for (int64_t d : a.bench_head_dims) {
    int64_t crossover = -1;
    for (int64_t length : a.bench_lengths) {
      const auto kernel = TimeForwardBackward(Build(a, a.kernel, a.options, d), a.heads, length, d, a.repeats);
      const auto exact = TimeForwardBackward(Build(a, "exact", "{}", d), a.heads, length, d, a.repeats);
      if (crossover < 0 && kernel.ms < exact.ms) crossover = length;
      std::cout << fmt::format("{:>5} {:>7} {:>12.1f} {:>12.1f} {:>12.1f} {:>12.1f}\n", d, length, kernel.ms, exact.ms,
                               kernel.peak_mib, exact.peak_mib);
    }
    std::cout << fmt::format("  D={}: {} faster than exact from L = {}\n", d, a.kernel,
                             crossover < 0 ? std::string("(not within the lengths run)") : std::to_string(crossover));
  }
}

}  // namespace

void AddKernelCheckCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("kernel-check", "Check an attention kernel against exact attention; --bench times it");
  static KernelCheckArgs args;
  cmd->add_option("--kernel", args.kernel, "kernel name")->capture_default_str();
  cmd->add_option("--options", args.options, "the kernel's options as inline YAML, e.g. '{num_features: 256}'")
      ->capture_default_str();
  cmd->add_option("--heads", args.heads, "query heads")->capture_default_str();
  cmd->add_option("--head-dim", args.head_dim, "head dimension")->capture_default_str();
  cmd->add_option("--length", args.length, "sequence length of the check")->capture_default_str();
  cmd->add_option("--norm", args.norm, "row norm of x = sqrt(s) q and y = sqrt(s) k")->capture_default_str();
  cmd->add_option("--draws", args.draws, "independent draws for the estimator check")->capture_default_str();
  cmd->add_option("--seed", args.seed, "seed of the synthetic inputs")->capture_default_str();
  cmd->add_flag("--bench", args.bench, "time forward+backward and peak memory against exact instead");
  cmd->add_option("--bench-lengths", args.bench_lengths, "sequence lengths to time")->delimiter(',')->capture_default_str();
  cmd->add_option("--bench-head-dims", args.bench_head_dims, "head dims to time")->delimiter(',')->capture_default_str();
  cmd->add_option("--repeats", args.repeats, "timed repeats per point (best kept)")->capture_default_str();
  cmd->callback([] { args.bench ? Bench(args) : Check(args); });
}

}  // namespace darkformer
