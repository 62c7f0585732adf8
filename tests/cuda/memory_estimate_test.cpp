// The memory estimate (train/memory_estimate.h) against the allocator of the test device
// (DARKFORMER_TEST_DEVICE; LibTorch's CPU allocator here, CUDA's caching allocator in
// tools/gpu_check.sh): three small runs of the real Trainer (full finetune; q/k/v + kernel only;
// activation checkpointing with the chunked loss and gradient accumulation), each two optimizer
// steps, so AdamW's state exists, plus the end-of-run evaluation and checkpoint Run() does. On the
// CPU the allocator reports are installed (util/peak_memory.h) before the Trainer builds its
// model; on CUDA the allocator's peak of allocated bytes is reset first (train/step_memory.h). So
// weights, gradients, AdamW state, activations, loss buffers and every transient are counted; the
// peak over the whole Run() must be within 15% of the predicted peak. Also: bad input is refused.
// (The estimate asks a model built for its shapes: tests/model/shapes_only_test.cpp checks that
// build against a real one.)
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/util/ThreadLocalDebugInfo.h>

#include <chrono>
#include <cstdio>

#include "cuda/test_device.h"
#include "data/data_test_util.h"
#include "attention/ops/chunk_parallel.h"
#include "model/gemma_model.h"
#include "train/memory_estimate.h"
#include "train/step_memory.h"
#include "train/tiny_run.h"
#include "train/trainer.h"
#include "util/error.h"
#include "util/peak_memory.h"

namespace darkformer {
namespace {

using testing::TempDir;
using testing::TinyRunConfig;

// hidden 256, 4 layers, 4 query heads sharing 1 KV head of 64, MLP 512, vocab 8192 (the shards'
// 320 pieces index its first rows), 4 sequences of 256 tokens, darkformer with 64 features.
std::vector<std::string> SmallShape() {
  return {"model.vocab_size=8192",      "model.hidden_size=256",     "model.intermediate_size=512",
          "model.num_hidden_layers=4",  "model.num_attention_heads=4", "model.num_key_value_heads=1",
          "model.head_dim=64",          "data.seq_len=256",          "data.batch_size=4",
          "train.steps=2",              "train.warmup_steps=1",      "attention.darkformer.num_features=64",
          "attention.darkformer.chunk_size=64", "eval.batches=1"};
}

RunConfig SmallRun(const std::string& dir, std::vector<std::string> extra) {
  auto overrides = SmallShape();
  overrides.push_back("train.device=" + testing::TestDeviceKey());
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return TinyRunConfig(dir, "darkformer", overrides);
}

int64_t MeasuredPeak(const RunConfig& config) {
  const auto device = testing::TestDevice();
  if (device.is_cuda()) {
    // The trainer reads (and so resets) the allocator's peak at every step: the run's peak is the
    // larger of its steps' (summary.json) and what came after its last step (eval, checkpoint).
    StepMemory memory(device);
    memory.ReadAndReset();
    EXPECT_EQ(Trainer(config).Run(), 0);
    const int64_t after_steps = memory.ReadAndReset().cuda_allocated;
    const auto summary = YAML::LoadFile(config.log.dir + "/summary.json");
    return std::max(after_steps, summary["peak_memory_bytes"].as<int64_t>());
  }
  auto info = std::make_shared<PeakMemory>();
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, info);
    Trainer trainer(config);
    EXPECT_EQ(trainer.Run(), 0);
  }
  return info->peak();
}

void ExpectWithin15Percent(const std::string& what, const std::vector<std::string>& extra) {
  TempDir dir;
  const auto config = SmallRun(dir.File("run"), extra);
  MemoryEstimateOptions options;
  options.cpu = !testing::TestDevice().is_cuda();
  const auto estimate = EstimateTrainingMemory(config, options);
  const auto start = std::chrono::steady_clock::now();
  const int64_t measured = MeasuredPeak(config);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double mib = 1024.0 * 1024.0;
  const double ratio = static_cast<double>(estimate.peak) / static_cast<double>(measured);
  std::printf("[memory] %-44s estimate %8.2f MiB  measured %8.2f MiB  ratio %.3f  (peak at: %s; %.1f s)\n",
              what.c_str(), estimate.peak / mib, measured / mib, ratio, estimate.peak_phase.c_str(), seconds);
  for (const auto& p : estimate.phases) std::printf("[memory]     %-40s %8.2f MiB\n", p.name.c_str(), p.bytes / mib);
  EXPECT_GT(ratio, 0.85) << what;
  EXPECT_LT(ratio, 1.15) << what;
}

TEST(MemoryEstimate, FullFinetuneWithin15Percent) { ExpectWithin15Percent("full finetune", {}); }

TEST(MemoryEstimate, QkvOnlyWithin15Percent) {
  ExpectWithin15Percent("q/k/v + kernel only",
                        {"train.trainable=[\"*q_proj*\", \"*k_proj*\", \"*v_proj*\", \"*.kernel.*\"]"});
}

TEST(MemoryEstimate, CheckpointedChunkedAccumulatedWithin15Percent) {
  ExpectWithin15Percent("checkpointing, chunked loss 256, grad_accum 2",
                        {"train.activation_checkpointing=true", "train.loss_chunk_tokens=256", "train.grad_accum=2"});
}

// Where the chunk-parallel form (auto on a GPU) makes its terms in slices, the estimate says so
// once, with the slice ops/chunk_parallel.h takes: darkformer's per-head M gives 4 key rows a
// sequence, 4 sequences; at 65,536 tokens one row's terms (~0.6 GiB) fit the budget, two do not.
// At the small shape the whole call fits: no such note.
TEST(MemoryEstimate, SaysWhereTheChunkParallelFormSlices) {
  TempDir dir;
  MemoryEstimateOptions gpu;
  gpu.cpu = false;
  auto notes_of = [&](const std::vector<std::string>& extra) {
    auto overrides = SmallShape();
    overrides.push_back("train.device=cuda");
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    return EstimateTrainingMemory(TinyRunConfig(dir.File("run"), "darkformer", overrides), gpu).notes;
  };
  auto attention_notes = [](const std::vector<std::string>& notes) {
    std::vector<std::string> found;
    for (const auto& n : notes) {
      if (n.rfind("attention (chunk-parallel form)", 0) == 0) found.push_back(n);
    }
    return found;
  };
  EXPECT_TRUE(attention_notes(notes_of({})).empty());
  const auto sliced =
      attention_notes(notes_of({"data.seq_len=65536", "model.max_position_embeddings=65536"}));
  const ChunkParallelDims dims{4, 65536, 4, 4, 64, 64, 64};
  ASSERT_EQ(ChunkParallelSlice(dims, kChunkParallelSliceBytes), 1);
  ASSERT_EQ(sliced.size(), 1u) << "one note for the 4 layers";
  EXPECT_NE(sliced[0].find("its terms 1 key row of 16 at a time"), std::string::npos) << sliced[0];
}

TEST(MemoryEstimate, RefusesBadInput) {
  TempDir dir;
  const auto config = SmallRun(dir.File("run"), {});
  MemoryEstimateOptions zero;
  zero.devices = 0;
  EXPECT_THROW(EstimateTrainingMemory(config, zero), Error);
  MemoryEstimateOptions three;
  three.devices = 3;  // 4 rows do not split over 3 devices
  EXPECT_THROW(EstimateTrainingMemory(config, three), Error);
  const auto frozen = SmallRun(dir.File("run"), {"train.trainable=[\"nothing*\"]"});
  EXPECT_THROW(EstimateTrainingMemory(frozen, {}), Error);
}

}  // namespace
}  // namespace darkformer
