// Evaluating a benchmark's labelled records (`prepare --labelled`, `eval`): loss and accuracy
// count exactly the labelled positions, with labels[t] scored against the prediction at t (no
// shift). Checked against the model's own forward on the same rows, scored by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "data/batch_source.h"
#include "data/data_test_util.h"
#include "data/prepare.h"
#include "train/trainer.h"
#include "util/labels.h"

namespace darkformer {
namespace {

constexpr int64_t kVocab = 64, kSeqLen = 16;

struct Record {
  std::vector<int64_t> ids, labels;
};

// Answer-only records, MQAR-like: random ids, and a label (a random id) on a few positions only.
std::vector<Record> MakeRecords(int count) {
  std::mt19937 rng(7);
  std::vector<Record> records;
  for (int i = 0; i < count; ++i) {
    Record r;
    const int64_t length = 3 + static_cast<int64_t>(rng() % (kSeqLen - 2));
    for (int64_t t = 0; t < length; ++t) {
      r.ids.push_back(static_cast<int64_t>(rng() % kVocab));
      r.labels.push_back(rng() % 3 == 0 ? static_cast<int64_t>(rng() % kVocab) : kIgnoreIndex);
    }
    r.labels.back() = static_cast<int64_t>(rng() % kVocab);  // at least one scored position
    records.push_back(r);
  }
  return records;
}

std::string JsonArray(const std::vector<int64_t>& values) {
  std::string s = "[";
  for (size_t i = 0; i < values.size(); ++i) s += (i ? ", " : "") + std::to_string(values[i]);
  return s + "]";
}

RunConfig LabelledRun(const std::string& dir, const std::string& shards_dir) {
  auto root = YAML::Load(R"(
model: {family: gemma, vocab_size: 64, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,
        num_attention_heads: 2, num_key_value_heads: 2, head_dim: 16, max_position_embeddings: 64}
attention: {kernel: exact}
data: {seq_len: 16, batch_size: 4}
train: {steps: 1, device: cpu, threads: 2, checkpoint_every: 0, seed: 5}
eval: {every: 0, batches: 1}
log: {every: 0}
)");
  root["data"]["shards_dir"] = shards_dir;
  root["log"]["dir"] = dir;
  return RunConfig::FromNode(root, "labelled eval test config");
}

TEST(LabelledEvalTest, LossAndAccuracyAreThoseOfTheLabelledPositions) {
  testing::TempDir dir;
  const auto records = MakeRecords(10);  // not a multiple of batch_size 4: the last batch is padded
  std::string lines;
  for (const auto& r : records) lines += "{\"input_ids\": " + JsonArray(r.ids) + ", \"labels\": " + JsonArray(r.labels) + "}\n";
  testing::WritePlain(dir.File("bench.jsonl"), lines);
  PrepareOptions prepare;
  prepare.val_inputs = {dir.File("bench.jsonl")};
  prepare.output_dir = dir.File("shards");
  prepare.pretokenized_vocab_size = kVocab;
  prepare.labelled = true;
  prepare.threads = 1;
  RunPrepare(prepare);

  const auto config = LabelledRun(dir.File("run"), dir.File("shards"));
  Trainer trainer(config);
  const auto loader = OpenEvalSource(config.data, "val");
  ASSERT_EQ(loader->batches_per_epoch(), 3);
  const auto r = trainer.EvaluateFrom(*loader, loader->batches_per_epoch());

  // By hand: the same rows (record, then pad id 0), one forward, log-softmax at each labelled t.
  auto ids = torch::zeros({static_cast<int64_t>(records.size()), kSeqLen}, torch::kInt64);
  for (size_t i = 0; i < records.size(); ++i) {
    for (size_t t = 0; t < records[i].ids.size(); ++t) ids[i][t] = records[i].ids[t];
  }
  torch::NoGradGuard no_grad;
  auto model = trainer.model();
  model->eval();
  const auto log_probs = torch::log_softmax(model->forward(ids).to(torch::kFloat64), -1);
  double loss_sum = 0;
  int64_t correct = 0, scored = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    for (size_t t = 0; t < records[i].labels.size(); ++t) {
      const int64_t label = records[i].labels[t];
      if (label == kIgnoreIndex) continue;
      loss_sum -= log_probs[i][t][label].item<double>();
      correct += log_probs[i][t].argmax().item<int64_t>() == label;
      ++scored;
    }
  }
  EXPECT_EQ(r.tokens, scored);
  EXPECT_NEAR(r.loss, loss_sum / scored, 1e-5);
  EXPECT_DOUBLE_EQ(r.accuracy, static_cast<double>(correct) / scored);
}

}  // namespace
}  // namespace darkformer
