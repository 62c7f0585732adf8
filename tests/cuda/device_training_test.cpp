// Training on the test device (DARKFORMER_TEST_DEVICE; cuda in tools/gpu_check.sh) against the
// CPU and against its own plain forms:
// - one step of a tiny model (TF32 off): loss and every gradient equal the CPU's to 1e-5 relative;
// - activation checkpointing and the chunked loss equal the plain forward on the device;
// - bf16 autocast on the device tracks fp32 by the CPU test's rule (tests/train/mixed_precision_test.cpp);
// - resume with train.deterministic is bit-exact on the device;
// - greedy generation on the device gives the CPU's tokens;
// - a training step's host syncs (util/host_syncs.h) are its loss and grad norm, whatever its
//   number of micro-batches;
// - metrics.jsonl carries the device's fields: CUDA's allocator peaks, MFU against the peak the
//   GPU's name looks up (null where none is known, as on the CPU).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "cuda/test_device.h"
#include "data/data_test_util.h"
#include "model/gemma_model.h"
#include "model/generation.h"
#include "train/bf16_rule.h"
#include "train/model_flops.h"
#include "train/step_memory.h"
#include "tiny_gemma.h"
#include "train/tiny_run.h"
#include "train/trainer.h"
#include "util/host_syncs.h"

namespace darkformer {
namespace {

GemmaModel TinyModel(const std::string& kernel, torch::Device device) {
  GemmaModel model(testing::TinyGemmaConfig(2), testing::TinyAttentionConfig(kernel, 2));
  model->InitializeWeights(0.2, 5);
  model->to(device);
  return model;
}

struct Step {
  double loss;
  std::map<std::string, torch::Tensor> grads;  // on the CPU
};

enum class LossForm { kFull, kChunked };

Step ForwardBackward(const std::string& kernel, torch::Device device, bool checkpointing, LossForm form) {
  auto model = TinyModel(kernel, device);
  model->SetActivationCheckpointing(checkpointing);
  torch::manual_seed(9);
  const auto ids = torch::randint(0, 96, {2, 40}, torch::kLong).to(device);  // 5 chunks of 8
  const auto labels = ShiftedLabels(ids);
  torch::Tensor loss;
  if (form == LossForm::kFull) {
    loss = CausalLmLoss(model->forward(ids), labels);
  } else {
    const auto count = (labels != -100).sum().to(torch::kFloat32);
    loss = model->LossSum(ids, labels, /*chunk_tokens=*/24) / count;
  }
  loss.backward();
  Step s{loss.item<double>(), {}};
  for (const auto& item : model->named_parameters()) {
    if (item.value().grad().defined()) s.grads[item.key()] = item.value().grad().cpu();
  }
  return s;
}

void ExpectSame(const Step& got, const Step& want, double tol, const std::string& what) {
  EXPECT_LE(std::abs(got.loss - want.loss), tol * std::abs(want.loss)) << what << " loss";
  ASSERT_EQ(got.grads.size(), want.grads.size()) << what;
  ASSERT_FALSE(want.grads.empty()) << what;
  for (const auto& [name, g] : want.grads) {
    ASSERT_TRUE(got.grads.count(name)) << what << ": no gradient for " << name;
    const double scale = g.abs().max().item<double>();
    const double diff = (got.grads.at(name) - g).abs().max().item<double>();
    EXPECT_LE(diff, tol * scale + 1e-12) << what << ": " << name;
  }
}

class DeviceTrainingTest : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(Kernels, DeviceTrainingTest, ::testing::Values("exact", "performer", "darkformer"),
                         [](const auto& info) { return info.param; });

TEST_P(DeviceTrainingTest, OneStepEqualsTheCpuStep) {
  const auto device = testing::TestDevice();
  const auto cpu = ForwardBackward(GetParam(), torch::kCPU, false, LossForm::kFull);
  const auto on_device = ForwardBackward(GetParam(), device, false, LossForm::kFull);
  ExpectSame(on_device, cpu, 1e-5, GetParam() + " on " + device.str() + " vs cpu");
}

TEST_P(DeviceTrainingTest, CheckpointingAndChunkedLossEqualThePlainForward) {
  const auto device = testing::TestDevice();
  const auto plain = ForwardBackward(GetParam(), device, false, LossForm::kFull);
  ExpectSame(ForwardBackward(GetParam(), device, true, LossForm::kFull), plain, 1e-6, GetParam() + " checkpointed");
  ExpectSame(ForwardBackward(GetParam(), device, false, LossForm::kChunked), plain, 1e-5, GetParam() + " chunked loss");
}

std::vector<double> Losses(const std::string& run_dir) {
  std::vector<double> losses;
  for (const auto& line : testing::TrainLines(run_dir)) losses.push_back(line["loss"].as<double>());
  return losses;
}

std::vector<std::string> DeviceOverrides(const std::string& kernel) {
  std::vector<std::string> o = {"train.device=" + testing::TestDeviceKey()};
  if (kernel != "exact") {
    o.push_back("attention." + kernel + ".chunk_size=8");
    o.push_back("attention." + kernel + ".num_features=32");
  }
  return o;
}

// The CPU test's rule (tests/train/bf16_rule.h), features and state fp32 included.
TEST_P(DeviceTrainingTest, Bf16AutocastTracksFp32) {
  testing::TestDevice();
  auto overrides = DeviceOverrides(GetParam());
  testing::TempDir fp32_dir, bf16_dir;
  ASSERT_EQ(Trainer(testing::TinyRunConfig(fp32_dir.path(), GetParam(), overrides)).Run(), kExitOk);
  overrides.push_back("train.precision=bf16_autocast");
  ASSERT_EQ(Trainer(testing::TinyRunConfig(bf16_dir.path(), GetParam(), overrides)).Run(), kExitOk);
  const auto fp32 = Losses(fp32_dir.path()), bf16 = Losses(bf16_dir.path());
  ASSERT_EQ(fp32.size(), 20u);
  testing::ExpectBf16TracksFp32(fp32, bf16, GetParam() + " on " + testing::TestDeviceKey());
}

TEST_P(DeviceTrainingTest, DeterministicResumeIsBitExact) {
  testing::TestDevice();
  auto common = DeviceOverrides(GetParam());
  for (const char* o : {"train.steps=8", "train.checkpoint_every=2", "train.deterministic=true"}) common.push_back(o);
  testing::TempDir straight_dir, resumed_dir;
  ASSERT_EQ(Trainer(testing::TinyRunConfig(straight_dir.path(), GetParam(), common)).Run(), kExitOk);
  auto interrupted = common;
  interrupted.push_back("train.fault_injection.stop_at_step=4");
  const auto resumed_config = testing::TinyRunConfig(resumed_dir.path(), GetParam(), interrupted);
  ASSERT_EQ(Trainer(resumed_config).Run(), kExitInterrupted);
  ASSERT_EQ(Trainer(resumed_config).Run(), kExitOk);
  const auto a = testing::TrainLines(straight_dir.path()), b = testing::TrainLines(resumed_dir.path());
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["loss"].as<std::string>(), b[i]["loss"].as<std::string>()) << "step " << i + 1;
    EXPECT_EQ(a[i]["grad_norm"].as<std::string>(), b[i]["grad_norm"].as<std::string>()) << "step " << i + 1;
  }
}

// The syncs of `steps` steps minus those of 2: what the run's setup, last checkpoint and final eval
// cost cancels, leaving the steps' own.
double HostSyncsPerStep(const std::string& kernel, int64_t grad_accum, const std::vector<std::string>& extra = {}) {
  auto overrides = DeviceOverrides(kernel);
  overrides.push_back("train.grad_accum=" + std::to_string(grad_accum));
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  std::map<int64_t, int64_t> syncs;
  for (const int64_t steps : {2, 4}) {
    testing::TempDir dir;
    auto o = overrides;
    o.push_back("train.steps=" + std::to_string(steps));
    const auto config = testing::TinyRunConfig(dir.path(), kernel, o);
    syncs[steps] = CountHostSyncs([&] { EXPECT_EQ(Trainer(config).Run(), kExitOk); }).value_or(-1);
  }
  return static_cast<double>(syncs[4] - syncs[2]) / 2.0;
}

// The host reads the step's loss shares and its grad norm (to watch for spikes; the clip stays on
// the device) in one copy, and waits for nothing else: batches go up through pinned memory.
TEST_P(DeviceTrainingTest, AStepWaitsForTheDeviceOnceWhateverItsMicroBatches) {
  const auto device = testing::TestDevice();
  if (!device.is_cuda()) GTEST_SKIP() << "host syncs are counted on a CUDA device";
  const double one = HostSyncsPerStep(GetParam(), 1), three = HostSyncsPerStep(GetParam(), 3);
  std::printf("[ %s ] host syncs per step: %.1f (grad_accum 1), %.1f (grad_accum 3)\n", GetParam().c_str(), one, three);
  EXPECT_EQ(three, one) << "a host sync per micro-batch";
  EXPECT_EQ(one, 1.0);
}

// An evaluation adds its batches' loss sums and counts on the device and reads them back once, at
// its end, whatever its batches and the head's chunks.
TEST_P(DeviceTrainingTest, AnEvaluationWaitsForTheDeviceOnce) {
  const auto device = testing::TestDevice();
  if (!device.is_cuda()) GTEST_SKIP() << "host syncs are counted on a CUDA device";
  for (const char* chunk : {"train.loss_chunk_tokens=0", "train.loss_chunk_tokens=16"}) {
    const double syncs = HostSyncsPerStep(GetParam(), 1, {"eval.every=1", "eval.batches=3", chunk});
    std::printf("[ %s ] host syncs per step, evaluating every step (%s): %.1f\n", GetParam().c_str(), chunk, syncs);
    EXPECT_EQ(syncs, 1.0 + 1.0) << chunk;
  }
}

// A redraw makes its draw on the host: each layer's seed and count come down in one copy, the draw
// goes up from pinned memory without waiting: one more wait a step for each layer.
TEST_P(DeviceTrainingTest, ARedrawWaitsForTheDeviceOncePerLayer) {
  const auto device = testing::TestDevice();
  if (!device.is_cuda()) GTEST_SKIP() << "host syncs are counted on a CUDA device";
  if (GetParam() == "exact") GTEST_SKIP() << "exact attention draws nothing";
  const double syncs = HostSyncsPerStep(GetParam(), 1, {"attention." + GetParam() + ".redraw=every_step"});
  std::printf("[ %s ] host syncs per step, redrawing every step: %.1f\n", GetParam().c_str(), syncs);
  testing::TempDir dir;
  const auto layers = testing::TinyRunConfig(dir.path(), GetParam(), {}).model.num_hidden_layers;
  EXPECT_EQ(syncs, 1.0 + static_cast<double>(layers));
}

TEST_P(DeviceTrainingTest, GreedyGenerationEqualsTheCpus) {
  const auto device = testing::TestDevice();
  auto cpu_model = TinyModel(GetParam(), torch::kCPU), device_model = TinyModel(GetParam(), device);
  cpu_model->eval();
  device_model->eval();
  SamplingOptions options;
  options.greedy = true;
  options.max_new_tokens = 24;
  const std::vector<int64_t> prompt = {2, 17, 41, 5, 63, 8, 30};
  const auto want = Generate(cpu_model, prompt, options).tokens;
  const auto got = Generate(device_model, prompt, options).tokens;
  EXPECT_EQ(got, want) << GetParam() << " on " << device.str();
}

TEST_P(DeviceTrainingTest, MetricsCarryTheDevicesFields) {
  const auto device = testing::TestDevice();
  testing::TempDir dir;
  auto overrides = DeviceOverrides(GetParam());
  overrides.push_back("train.steps=3");
  ASSERT_EQ(Trainer(testing::TinyRunConfig(dir.path(), GetParam(), overrides)).Run(), kExitOk);
  const auto lines = testing::TrainLines(dir.path());
  ASSERT_EQ(lines.size(), 3u);
  const bool known_peak = PeakFlops(0.0, StepMemory(device).DeviceName()) > 0;
  for (const auto& line : lines) {
    EXPECT_EQ(line["cuda_allocated_peak_bytes"].IsDefined(), device.is_cuda());
    if (device.is_cuda()) {
      EXPECT_GT(line["cuda_allocated_peak_bytes"].as<int64_t>(), 0);
      EXPECT_GE(line["cuda_reserved_peak_bytes"].as<int64_t>(), line["cuda_allocated_peak_bytes"].as<int64_t>());
    }
    ASSERT_TRUE(line["mfu"].IsDefined());
    EXPECT_EQ(!line["mfu"].IsNull(), known_peak) << StepMemory(device).DeviceName();
    if (known_peak) EXPECT_GT(line["mfu"].as<double>(), 0.0);
  }
}

}  // namespace
}  // namespace darkformer
