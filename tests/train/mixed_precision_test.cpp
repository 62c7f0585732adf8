// bf16 autocast trains correctly on the CPU with the same autocast logic CUDA runs:
// - no stale weights: step 2's reported loss is the loss a fresh model with step 1's weights
//   computes for the same batch under autocast (a run-long autocast scope would keep step 1's
//   cached bf16 weights: the bug this guards);
// - every kernel trains 20 steps in bf16 tracking its fp32 run, on the raw CPU kernel and on the
//   LibTorch-ops path CUDA runs, with the fused operator's features and state in fp32.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <set>

#include "attention/kernel_traits.h"
#include "attention/fused_causal_attention.h"
#include "data/batch_source.h"
#include "data/data_test_util.h"
#include "model/weights_io.h"
#include "train/model_loading.h"
#include "train/bf16_rule.h"
#include "train/tiny_run.h"
#include "train/trainer.h"
#include "util/mixed_precision.h"

namespace darkformer {
namespace {

// The loss of one batch under bf16 autocast, by a fresh model loaded from `weights`.
double AutocastLoss(const RunConfig& config, const std::string& weights, const Batch& batch) {
  GemmaModel model(config.model, config.attention);
  LoadWeights(weights, *model);
  torch::NoGradGuard no_grad;
  AutocastScope autocast(torch::kCPU, true);
  return CausalLmLoss(model->forward(batch.input_ids_BL), batch.labels_BL).item<double>();
}

TEST(MixedPrecisionTest, StepTwoTrainsOnStepOnesWeightsNotStaleCasts) {
  testing::TempDir dir;
  const auto config = testing::TinyRunConfig(
      dir.path(), "darkformer",
      {"train.precision=bf16_autocast", "train.steps=2", "train.checkpoint_every=1", "train.keep_last=3"});
  // The weights before step 1, for contrast.
  {
    GemmaModel initial = BuildModelFrom(config, "", "test");
    SaveWeights(dir.path() + "/initial.h5", *initial);
  }
  ASSERT_EQ(Trainer(config).Run(), kExitOk);
  const auto lines = testing::TrainLines(dir.path());
  ASSERT_EQ(lines.size(), 2u);
  const double reported = lines[1]["loss"].as<double>();

  // Step 2's batch: the loader at the position the step-1 checkpoint saved.
  const auto step1 = CheckpointPath(dir.path(), 1);
  const auto meta = YAML::Load(ReadStringAttributeH5(step1, "trainer_state"));
  auto loader = OpenBatchSource(config.data, "train");
  loader->Restore(LoaderState::FromYaml(meta["loader"], step1));
  const auto batch = loader->Next();

  const double fresh = AutocastLoss(config, step1, batch);
  const double stale = AutocastLoss(config, dir.path() + "/initial.h5", batch);
  std::printf("[bf16 step 2] reported %.10g, fresh model with step-1 weights %.10g, with step-0 weights %.10g\n",
              reported, fresh, stale);
  // metrics.jsonl keeps 10 significant digits.
  EXPECT_NEAR(reported, fresh, 1e-8 * std::abs(fresh) + 1e-9);
  // The check can tell the two apart: step 1 moved the loss of this batch far beyond that.
  EXPECT_GT(std::abs(fresh - stale), 1e-4);
}

struct KernelCase {
  std::string kernel;
  std::string op;  // log-form kernels' `op` (auto: the raw CPU kernel where it applies); empty for the others
};

void PrintTo(const KernelCase& c, std::ostream* os) { *os << c.kernel << (c.op.empty() ? "" : " (op " + c.op + ")"); }

std::vector<double> Losses(const std::string& run_dir) {
  std::vector<double> losses;
  for (const auto& line : testing::TrainLines(run_dir)) losses.push_back(line["loss"].as<double>());
  return losses;
}

class Bf16TracksFp32Test : public ::testing::TestWithParam<KernelCase> {};

// Kernels with a chunked causal path get chunk_size 8: the 32-token sequences span 4 chunks.
std::vector<std::string> KernelOverrides(const std::string& kernel) {
  if (!TraitsOf(kernel).option_defaults.count("chunk_size")) return {};
  return {"attention." + kernel + ".chunk_size=8", "attention." + kernel + ".num_features=32"};
}

TEST_P(Bf16TracksFp32Test, TwentyStepsWithinBf16Tolerance) {
  const auto& c = GetParam();
  auto overrides = KernelOverrides(c.kernel);
  if (!c.op.empty()) overrides.push_back("attention." + c.kernel + ".op=" + c.op);
  testing::TempDir fp32_dir, bf16_dir;
  ASSERT_EQ(Trainer(testing::TinyRunConfig(fp32_dir.path(), c.kernel, overrides)).Run(), kExitOk);
  overrides.push_back("train.precision=bf16_autocast");
  ASSERT_EQ(Trainer(testing::TinyRunConfig(bf16_dir.path(), c.kernel, overrides)).Run(), kExitOk);
  const auto fp32 = Losses(fp32_dir.path()), bf16 = Losses(bf16_dir.path());
  ASSERT_EQ(fp32.size(), 20u);
  testing::ExpectBf16TracksFp32(fp32, bf16, c.kernel + " (" + (c.op.empty() ? "-" : c.op) + ")");
}

std::vector<KernelCase> Cases() {
  std::vector<KernelCase> cases;
  for (const auto& t : AllKernelTraits()) {
    if (!t.log_form) cases.push_back({t.name, ""});
    for (const std::string op : {"auto", "chunk_loop", "chunk_parallel"}) {
      if (t.log_form) cases.push_back({t.name, op});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Kernels, Bf16TracksFp32Test, ::testing::ValuesIn(Cases()), [](const auto& info) {
  return info.param.kernel + (info.param.op.empty() ? "" : "_" + info.param.op);
});

// train.frozen_weights_bf16: frozen projections and MLP stored in bf16. Autocast rounds them to
// bf16 for every GEMM anyway, so q/k/v-only finetuning trains as with fp32 storage; the frozen
// weights are bf16, the trainable and the embedding fp32; an interrupted run resumes exactly.
TEST(MixedPrecisionTest, FrozenWeightsInBf16TrainAsFp32StorageAndResume) {
  const std::vector<std::string> qkv = {"train.precision=bf16_autocast", "train.steps=8", "train.checkpoint_every=4",
                                        "train.trainable=[\"*q_proj*\", \"*k_proj*\", \"*v_proj*\", \"*.kernel.*\"]",
                                        "attention.darkformer.chunk_size=8"};
  testing::TempDir fp32_dir, bf16_dir, resumed_dir;
  ASSERT_EQ(Trainer(testing::TinyRunConfig(fp32_dir.path(), "darkformer", qkv)).Run(), kExitOk);
  auto with_bf16 = qkv;
  with_bf16.push_back("train.frozen_weights_bf16=true");
  Trainer trainer(testing::TinyRunConfig(bf16_dir.path(), "darkformer", with_bf16));
  ASSERT_EQ(trainer.Run(), kExitOk);
  for (const auto& item : trainer.model()->named_parameters()) {
    const auto& name = item.key();
    const bool frozen_linear = !item.value().requires_grad() && name.find("_proj.weight") != std::string::npos;
    EXPECT_EQ(item.value().scalar_type(), frozen_linear ? torch::kBFloat16 : torch::kFloat32) << name;
  }
  const auto a = Losses(fp32_dir.path()), b = Losses(bf16_dir.path());
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), a.size());
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / a[i]);
  std::printf("[frozen bf16] worst relative loss gap to fp32 storage over 8 steps: %.2e\n", worst);
  EXPECT_LT(worst, 1e-3);

  auto interrupted = with_bf16;
  interrupted.push_back("train.fault_injection.stop_at_step=4");
  const auto config = testing::TinyRunConfig(resumed_dir.path(), "darkformer", interrupted);
  ASSERT_EQ(Trainer(config).Run(), kExitInterrupted);
  ASSERT_EQ(Trainer(config).Run(), kExitOk);
  const auto c = Losses(resumed_dir.path());
  ASSERT_EQ(c.size(), b.size());
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(b[i], c[i]) << "step " << i + 1;
}

// The operator takes bf16 q, k, v and computes in fp32 inside an autocast scope, its backward too
// (the in-place fold of a bf16 product into the fp32 state failed before), in every LibTorch form.
TEST(MixedPrecisionTest, FusedOperatorComputesInFp32UnderAutocastInEveryForm) {
  for (const auto op : {CausalOp::kChunkLoop, CausalOp::kChunkParallel}) {
    torch::manual_seed(0);
    const auto q = torch::randn({1, 2, 40, 8}).to(torch::kBFloat16).requires_grad_();
    const auto k = torch::randn({1, 1, 40, 8}).to(torch::kBFloat16).requires_grad_();
    const auto v = torch::randn({1, 1, 40, 8}).to(torch::kBFloat16).requires_grad_();
    const auto w = torch::randn({16, 8});
    FeatureMap map;
    map.log_features = [](const torch::Tensor& x, const std::vector<torch::Tensor>& p, bool) {
      return x.matmul(p[0].t()) - 0.5 * x.square().sum(-1, true);
    };
    map.params = {w};
    map.positive_features = false;
    map.op = op;
    torch::Tensor out;
    {
      AutocastScope autocast(torch::kCPU, true);
      out = FusedCausalLinearAttention(q * 0.3, k * 0.3, v, map, /*chunk_size=*/8);  // 5 chunks
      out.sum().backward();
    }
    const auto d = LastFusedCausalDtypes();
    EXPECT_EQ(out.scalar_type(), torch::kFloat32);
    EXPECT_EQ(d.features, torch::kFloat32) << CausalOpName(op);
    EXPECT_EQ(d.state, torch::kFloat32);
    EXPECT_EQ(d.normaliser, torch::kFloat32);
    EXPECT_EQ(d.gradients, torch::kFloat32);
    EXPECT_TRUE(q.grad().defined() && torch::isfinite(q.grad().to(torch::kFloat32)).all().item<bool>());
  }
}

}  // namespace
}  // namespace darkformer
