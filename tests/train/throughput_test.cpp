// Model FLOPs per token (train/model_flops.h) against hand computations for the tiny config, and
// the step rows' throughput and memory fields: MFU only with a peak, a positive peak RSS on the CPU
// that grows with the batch, and the run's peak and mean MFU in summary.json.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "data/data_test_util.h"
#include "train/model_flops.h"
#include "train/run_summary.h"
#include "train/tiny_run.h"
#include "train/trainer.h"

namespace darkformer {
namespace {

// The tiny config: E = 32, I = 64, 2 layers, H = 2 query heads, K = 1 KV head, D = 16, V = 320, L = 32.
// Matmul weights per layer: q 32x32, k and v 32x16, o 32x32, gate/up/down 3 x 32x64 = 9216; two
// layers and the tied head 320x32: N = 2 x 9216 + 10240 = 28672.
constexpr double kN = 28672;

ModelFlops Count(const std::string& kernel, bool qkv_only) {
  const auto config = testing::TinyRunConfig("/nonexistent", kernel);
  GemmaModel model(config.model, config.attention);
  for (auto& item : model->named_parameters()) {
    const bool qkv = item.key().find("q_proj") != std::string::npos || item.key().find("k_proj") != std::string::npos ||
                     item.key().find("v_proj") != std::string::npos;
    item.value().set_requires_grad(!qkv_only || qkv);
  }
  return CountModelFlops(*model, config.data.seq_len);
}

TEST(ThroughputTest, ModelFlopsPerTokenMatchHandCounts) {
  // Exact attention, PaLM's convention: 4 L D per query head forward = 4 x 32 x 16 x 2 = 4096 a layer.
  const double exact_attention = 2 * 4096.0;
  auto f = Count("exact", false);
  EXPECT_EQ(f.matmul_weights, static_cast<int64_t>(kN));
  EXPECT_DOUBLE_EQ(f.attention_forward_per_token, exact_attention);
  EXPECT_DOUBLE_EQ(f.per_token, 6 * kN + 3 * exact_attention);
  // q/k/v only: weight gradients for q, k, v alone (2 x (1024 + 512 + 512) = 4096 weights).
  f = Count("exact", true);
  EXPECT_EQ(f.trainable_matmul_weights, 4096);
  EXPECT_DOUBLE_EQ(f.per_token, 4 * kN + 2 * 4096 + 3 * exact_attention);
  // Performer, m = 32, chunk min(64, L) = 32, V = D + 1 = 17: per query head 2Dm + 2C(m+V) + 2mV
  // = 1024 + 3136 + 1088, per KV head 2Dm + 2mV = 2112: 2 x 5248 + 2112 = 12608 a layer.
  f = Count("performer", false);
  EXPECT_DOUBLE_EQ(f.attention_forward_per_token, 2 * 12608.0);
  EXPECT_DOUBLE_EQ(f.per_token, 6 * kN + 3 * 2 * 12608.0);
}

TEST(ThroughputTest, StepRowsCarryFlopsMfuAndAPeakMemoryThatGrowsWithTheBatch) {
  auto run = [](const std::string& dir, const std::vector<std::string>& extra) {
    std::vector<std::string> overrides = {"train.steps=3", "log.every=1"};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    EXPECT_EQ(Trainer(testing::TinyRunConfig(dir, "performer", overrides)).Run(), kExitOk);
    return testing::TrainLines(dir);
  };
  testing::TempDir small_dir, large_dir;
  const auto small = run(small_dir.path(), {"data.batch_size=2"});
  const auto large = run(large_dir.path(), {"data.batch_size=96", "train.peak_tflops=1"});
  ASSERT_EQ(small.size(), 3u);
  ASSERT_EQ(large.size(), 3u);
  const double flops = Count("performer", false).per_token;
  for (const auto& line : small) {
    EXPECT_DOUBLE_EQ(line["flops_per_token"].as<double>(), flops);
    EXPECT_TRUE(line["mfu"].IsNull()) << "no peak is known on a CPU";
    EXPECT_GT(line["peak_rss_bytes"].as<int64_t>(), 0);
    EXPECT_FALSE(line["gpu_mem_bytes"]) << "the always-0 field is gone";
    EXPECT_FALSE(line["cuda_allocated_peak_bytes"]);
  }
  // A 1 TFLOP/s peak: MFU = FLOPs per token x tokens/s / 1e12.
  for (const auto& line : large) {
    EXPECT_NEAR(line["mfu"].as<double>(), flops * line["tokens_per_s"].as<double>() / 1e12,
                1e-9 * line["mfu"].as<double>());
  }
  // 96 rows hold 48x the activations of 2 (logits alone 3.8 MiB against 80 KiB).
  const int64_t small_peak = small.back()["peak_rss_bytes"].as<int64_t>();
  const int64_t large_peak = large.back()["peak_rss_bytes"].as<int64_t>();
  std::printf("[throughput] peak RSS of a step: batch 2 %.1f MiB, batch 96 %.1f MiB\n", small_peak / 1048576.0,
              large_peak / 1048576.0);
  EXPECT_GT(large_peak, small_peak);
  const auto summary = ReadRunSummary(large_dir.path());
  ASSERT_TRUE(summary.has_value());
  EXPECT_GT(summary->peak_memory_bytes, 0);
  EXPECT_GT(summary->mean_mfu, 0.0);
  EXPECT_EQ(ReadRunSummary(small_dir.path())->mean_mfu, 0.0);
}

// train.profile: a 3-step run profiling step 2 writes a Chrome trace that parses as JSON and names
// the model's ops; a bad window is a config error naming the key.
TEST(ThroughputTest, ProfileWritesAChromeTraceOfTheChosenSteps) {
  testing::TempDir dir;
  const std::vector<std::string> overrides = {"train.steps=3", "train.profile.start_step=2", "train.profile.steps=1"};
  ASSERT_EQ(Trainer(testing::TinyRunConfig(dir.path(), "performer", overrides)).Run(), kExitOk);
  const auto path = std::filesystem::path(dir.path()) / "trace_steps_2-2.json";
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  std::ifstream in(path);
  const auto trace = nlohmann::json::parse(in);
  std::set<std::string> names;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.contains("name") && e["name"].is_string()) names.insert(e["name"].get<std::string>());
  }
  for (const std::string op : {"aten::embedding", "aten::mm", "aten::rsqrt"}) EXPECT_TRUE(names.count(op)) << op;
  try {
    testing::TinyRunConfig(dir.path(), "performer", {"train.profile.start_step=0", "train.profile.steps=1"});
    ADD_FAILURE() << "start_step 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.profile.start_step"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace darkformer
