// `darkformer kernel-check`: a kernel against exact softmax attention on synthetic inputs
// (estimator mean over independent draws vs exp(x.y), attention-output error, prefix invariance),
// with --bench its forward+backward time and peak CPU memory vs exact over lengths, with
// --estimators the synthetic anisotropic estimator comparison (with --weights: the FAVOR estimators
// on a checkpoint's own queries and keys) and with --weights the per-layer anisotropy and kernel
// errors of a checkpoint (attention/kernel_diagnostics.h holds the math; the checkpoint's checks are
// kernel_check_weights.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <iostream>

#include "attention/feature_kernel_base.h"
#include "attention/kernel_registry.h"
#include "attention/ops/feature_map.h"
#include "cli/commands.h"
#include "cli/kernel_check_args.h"
#include "train/size_terms.h"
#include "util/error.h"

namespace darkformer {

void SayWritten(const JsonLinesFile& json) {
  if (!json.path().empty()) std::cout << fmt::format("wrote {} JSON lines to {}\n", json.lines(), json.path());
}

namespace {

// --options is parsed in several places below: checked once here, so any mistake names the flag.
void CheckOptionsText(const std::string& text) {
  YAML::Node node;
  try {
    node = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    Fail("--options: not YAML (" + e.msg + "): " + text);
  }
  DF_CHECK(node.IsNull() || node.IsMap(), "--options must be a YAML map such as '{num_features: 256}', got: " << text);
}

AttentionKernel Build(const KernelCheckArgs& a, const std::string& name, const std::string& options, int64_t head_dim,
                      int64_t seed_offset = 0) {
  KernelShape shape;
  shape.num_heads = a.heads;
  shape.head_dim = head_dim;
  auto node = YAML::Load(options);
  if (seed_offset > 0) node["seed"] = node["seed"] ? node["seed"].as<int64_t>() + seed_offset : seed_offset;
  CheckKernelOptionsFit(name, node, head_dim);
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
    estimates.push_back(f->PairEstimate(x_h, y_h)[0][0]);
  }
  const auto est_NP = torch::stack(estimates).to(torch::kFloat64);
  const auto target_P = features->EstimatorTarget(x, y).flatten();  // the kernel's own (head 0's parameters)
  const auto ratio_NP = est_NP / target_P;
  const auto mean_P = ratio_NP.mean(0), se_P = ratio_NP.std(0) / std::sqrt(static_cast<double>(a.draws));
  std::cout << fmt::format("  estimator over {} draws ({} at init; darkformer targets exp(x^T M^T M y), = exp(x.y) at M = I; "
                           "slay its quadrature of the Yat kernel):\n",
                           a.draws, a.kernel);
  for (int64_t p = 0; p < pairs; ++p) {
    std::cout << fmt::format("    pair {}: log target = {:+.3f}, mean/target = {:.4f} +- {:.4f}, relative MSE = {:.4g}\n", p,
                             std::log(target_P[p].item<double>()), mean_P[p].item<double>(), se_P[p].item<double>(),
                             (ratio_NP.select(1, p) - 1).pow(2).mean().item<double>());
  }
}


// (a): performer vs importance-sampled performer vs darkformer on synthetic anisotropic inputs.
void Estimators(KernelCheckArgs a) {
  JsonLinesFile json(a.json);
  a.synthetic.draws = a.draws;
  a.synthetic.seed = a.seed;
  const auto& o = a.synthetic;
  std::cout << fmt::format(
      "estimators on x, y ~ N(0, Lambda): d={} eigenvalues log-spaced over [{:.4g}, {:.4g}], {} pairs, {} draws, iid "
      "omega; IS: omega ~ N(0, Sigma*), Sigma* = (I + 2 Lambda)(I - 2 Lambda)^-1 (000 Thm 3.2), weight p_I/psi\n",
      o.dim, o.lambda_max / o.lambda_ratio, o.lambda_max, o.pairs, o.draws);
  std::cout << "  rel.err = mean |k_hat - k| / k; rel.var = mean Var(k_hat / k); var = mean Var(k_hat) over draws "
               "(Thm 3.2's objective); exact var = its closed form\n";
  std::cout << fmt::format("{:>22} {:>18} {:>5} {:>11} {:>11} {:>11} {:>11}\n", "estimator", "target", "m", "rel.err",
                           "rel.var", "var", "exact var");
  for (const auto& s : CompareEstimators(o, a.num_features)) {
    std::cout << fmt::format("{:>22} {:>18} {:>5} {:>11.4g} {:>11.4g} {:>11.4g} {:>11.4g}\n", s.estimator, s.target,
                             s.num_features, s.relative_error, s.relative_variance, s.variance, s.closed_form_variance);
    json.Write({{"estimator", s.estimator}, {"target", s.target}, {"num_features", s.num_features},
                     {"dim", o.dim}, {"lambda_max", o.lambda_max}, {"lambda_ratio", o.lambda_ratio},
                     {"relative_error", s.relative_error}, {"relative_variance", s.relative_variance},
                     {"variance", s.variance}, {"closed_form_variance", s.closed_form_variance}});
  }
  SayWritten(json);
}


// --op's choices: the operator's forms (ops/feature_map.h), also spelt with hyphens.
std::vector<std::string> OpChoices() {
  std::vector<std::string> choices = CausalOpNames();
  for (auto name : CausalOpNames()) {
    if (name.find('_') == std::string::npos) continue;
    std::replace(name.begin(), name.end(), '_', '-');
    choices.push_back(name);
  }
  return choices;
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
  // The options after --bench time and measure only with it: given without it they would do
  // nothing, so CLI11 refuses them (exit 2).
  auto* bench = cmd->add_flag("--bench", args.bench, "time forward+backward, peak memory and GFLOP/s against exact instead");
  auto& b = args.bench_options;
  cmd->add_option("--bench-lengths", b.lengths, "sequence lengths to time")->delimiter(',')->capture_default_str()
      ->needs(bench);
  cmd->add_option("--bench-head-dims", b.head_dims, "head dims to time")->delimiter(',')->capture_default_str()
      ->needs(bench);
  cmd->add_option("--bench-batch", b.batch, "--bench: sequences per call (B)")->capture_default_str()
      ->needs(bench);
  cmd->add_option("--kv-heads", b.kv_heads, "--bench: key/value heads (0 = --heads; 1 = multi-query)")->capture_default_str()
      ->needs(bench);
  cmd->add_option("--repeats", b.repeats, "--bench: timed repeats per row, alternating implementations (median kept)")
      ->capture_default_str()
      ->needs(bench);
  cmd->add_flag("--profile", b.profile,
                "--bench: print each op's self time over one forward+backward per row, and the ops each implementation "
                "dispatches per call (ops_forward, ops_backward in --json)")
      ->needs(bench);
  cmd->add_option("--op", b.ops, "--bench: the causal operator's forms to time, alternating (comma-separated)")
      ->delimiter(',')
      ->check(CLI::IsMember(OpChoices()))
      ->capture_default_str()
      ->needs(bench);
  cmd->add_option("--device", b.device, "--bench: cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str()
      ->needs(bench);
  cmd->add_option("--dtype", b.dtype,
                  "--bench: fp32 | bf16, the dtype of q, k, v and the incoming gradient; bf16 runs each forward under "
                  "autocast, as a bf16 model's attention runs (SDPA in bf16, our operator in fp32 inside)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str()
      ->needs(bench);
  cmd->add_option("--tf32", b.tf32,
                  "--bench: auto | true | false, as train.tf32: TF32 operands in CUDA's fp32 matrix products (SDPA's "
                  "fp32 kernels, op: cuda's for fp32 inputs); auto = on for CUDA, as training runs; true on the CPU "
                  "is refused")
      ->check(CLI::IsMember({"auto", "true", "false"}))
      ->capture_default_str()
      ->needs(bench);
  cmd->add_flag("--naive", b.naive, "--bench: also time the naive composite path (op: naive)")
      ->needs(bench);
  cmd->add_option("--bench-norm", b.norm,
                  "--bench: > 0 times sharp, opposed attention (queries near u, keys near -u) with rows of this norm")
      ->check(CLI::Validator(
          [](std::string& value) { return std::stod(value) >= 0 ? std::string() : "must be >= 0, got " + value; },
          "NORM >= 0"))
      ->capture_default_str()
      ->needs(bench);
  cmd->add_option("--bench-documents", b.document_mean,
                  "--bench: > 0 also times each implementation on packed documents of this mean length, masked "
                  "(data.document_masking), beside its unmasked time; exact also one call per document")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str()
      ->needs(bench);
  cmd->add_option("--exact-max-length", b.exact_max_length, "--bench: skip exact attention above this length")
      ->capture_default_str()
      ->needs(bench);
  cmd->add_flag("--estimators", args.estimators,
                "(a) performer vs importance-sampled performer vs darkformer vs the FAVOR kernels on synthetic q, k ~ "
                "N(0, Lambda); with --weights the FAVOR kernels on that checkpoint's own queries and keys");
  cmd->add_option("--dim", args.synthetic.dim, "(a) dimension d")->capture_default_str();
  cmd->add_option("--lambda-max", args.synthetic.lambda_max, "(a) largest eigenvalue of Lambda (< 1/2)")->capture_default_str();
  cmd->add_option("--lambda-ratio", args.synthetic.lambda_ratio, "(a) lambda_max / lambda_min (1 = isotropic)")
      ->capture_default_str();
  cmd->add_option("--pairs", args.synthetic.pairs, "(a) (x, y) pairs")->capture_default_str();
  cmd->add_option("--features", args.num_features, "(a) numbers of random features m")->delimiter(',')->capture_default_str();
  cmd->add_option("--weights", args.weights, "(b) checkpoint .h5: per-layer anisotropy and kernel errors");
  cmd->add_option("--shards", args.shards, "(b) token shards directory (one batch)");
  cmd->add_option("--split", args.split, "(b) shards split")->capture_default_str();
  cmd->add_option("--text", args.text, "(b) text file (its first --seq-len tokens)");
  cmd->add_option("--ids", args.ids, "(b) file of whitespace-separated token ids (no tokenizer)");
  cmd->add_option("--tokenizer", args.tokenizer, "(b) SentencePiece .model");
  cmd->add_option("--kernels", args.kernels, "(b) kernels to compare; darkformer gives identity and whitening")
      ->delimiter(',')->capture_default_str();
  cmd->add_option("--seq-len", args.seq_len, "(b) tokens per row")->capture_default_str();
  cmd->add_option("--batch", args.batch, "(b) rows from the shards")->capture_default_str();
  cmd->add_option("--json", args.json, "(a)/(b) write one JSON object per line to this file");
  cmd->callback([] {
    CheckOptionsText(args.options);
    if (args.bench) {
      auto options = args.bench_options;
      options.kernel = args.kernel;
      options.options = args.options;
      options.heads = args.heads;
      options.json = args.json;
      return RunKernelBench(options);
    }
    if (args.estimators) return args.weights.empty() ? Estimators(args) : FavorEstimators(args);
    if (!args.weights.empty()) return ModelDiagnostics(args);
    Check(args);
  });
}

}  // namespace darkformer
