// MQAR is attention-bound: a tiny Gemma with exact attention learns to recall (answer accuracy far
// above chance within a test-sized run), while constant attention, which cannot look up a key,
// stays near chance. Also: loss and accuracy count only the answer positions.
#include <gtest/gtest.h>

#include <functional>

#include "data/batch_source.h"
#include "data/data_test_util.h"
#include "train/trainer.h"

namespace darkformer {
namespace {

RunConfig MqarRun(const std::string& dir, const std::string& kernel, int64_t steps,
                  const std::function<void(YAML::Node&)>& edit = {}) {
  auto root = YAML::Load(R"(
model: {family: gemma, vocab_size: 64, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2,
        num_attention_heads: 2, num_key_value_heads: 2, head_dim: 32, max_position_embeddings: 64}
data:
  source: mqar
  seq_len: 32
  batch_size: 32
  mqar: {vocab_size: 64, num_kv_pairs: 4, power_a: 0.01, train_examples: 8192, val_examples: 256, seed: 3}
train: {lr: 3.0e-3, warmup_steps: 20, schedule: constant, weight_decay: 0.1, device: cpu, threads: 2,
        checkpoint_every: 0, seed: 3}
eval: {every: 0, batches: 8}
log: {every: 0}
)");
  root["attention"]["kernel"] = kernel;
  root["train"]["steps"] = steps;
  root["log"]["dir"] = dir;
  if (edit) edit(root);
  return RunConfig::FromNode(root, "mqar test config");
}

double FinalAccuracy(const RunConfig& config) {
  Trainer trainer(config);
  EXPECT_EQ(trainer.Run(), kExitOk);
  return trainer.state().best_eval_accuracy;
}

// How soon exact attention leaves MQAR's plateau depends on the run seed (data order, init): with
// this config 5 of train.seed 0..5 pass 0.8 by step 300 (seed 1: 0.37). Seed 3 is past 0.8 by step 200.
TEST(MqarTrainingTest, ExactAttentionLearnsRecallAndConstantAttentionCannot) {
  testing::TempDir dir;
  const double chance = 1.0 / 32;  // values are drawn from half the vocabulary
  const double exact = FinalAccuracy(MqarRun(dir.File("exact"), "exact", 300));
  const double constant = FinalAccuracy(MqarRun(dir.File("constant"), "constant", 300));
  EXPECT_GT(exact, 0.6) << "exact attention should learn MQAR (chance " << chance << ")";
  // Constant attention sees the bag of tokens: at best it guesses among the 4 values present.
  EXPECT_LT(constant, 0.3) << "constant attention cannot look keys up";
}

TEST(MqarTrainingTest, EvaluationCountsOnlyAnswerPositions) {
  testing::TempDir dir;
  const auto config = MqarRun(dir.File("run"), "exact", 1);
  Trainer trainer(config);
  auto val = OpenBatchSource(config.data, "val");
  const auto r = trainer.EvaluateFrom(*val, 2);
  EXPECT_EQ(r.tokens, 2 * 32 * 4);  // batches x rows x answers per row
}

// Issue 38: sharp attention at a large learning rate. M = 12 I makes |x| ~ 12 |q| / d^(1/4), where
// queries' and keys' large features disagree and the scalar stabiliser's normaliser underflowed:
// the loss stayed finite while the backward returned non-finite gradients, and the trainer
// skipped those updates. With the per-feature stabiliser every step's gradient is finite.
TEST(MqarTrainingTest, SharpDarkformerAttentionAtLargeLearningRateHasFiniteGradients) {
  testing::TempDir dir;
  const auto config = MqarRun(dir.File("run"), "darkformer", 20, [](YAML::Node& root) {
    root["attention"]["darkformer"]["init"] = "scaled_identity";
    root["attention"]["darkformer"]["init_scale"] = 12.0;
    root["attention"]["darkformer"]["num_features"] = 32;
    root["train"]["lr"] = 0.1;
    root["train"]["warmup_steps"] = 0;
    root["train"]["spikes"]["on_nonfinite"] = "skip";
  });
  Trainer trainer(config);
  EXPECT_EQ(trainer.Run(), kExitOk);
  EXPECT_EQ(trainer.state().skipped_updates, 0) << "steps with a finite loss and a non-finite gradient norm";
}

}  // namespace
}  // namespace darkformer
