// Checkpoint I/O streams: saving or loading a checkpoint (or weights) adds at most about one
// tensor to the memory in use, measured with LibTorch's allocator reports on a model with dozens
// of tensors; the AdamW state round-trips exactly, keyed by parameter name; and a checkpoint of the
// earlier layout (the whole optimizer as one serialized archive) still loads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "data/data_test_util.h"
#include "model/h5_corruption.h"
#include "model/weights_io.h"
#include "train/checkpoint.h"
#include "util/peak_memory.h"

namespace darkformer {
namespace {

using torch::optim::AdamW;
using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;

// 4 layers of gemma2 (4 norms each): 46 parameters; ~4.2M values, the largest tensor 1 MiB.
GemmaConfig SmallConfig() {
  GemmaConfig c;
  c.family = "gemma2";
  c.vocab_size = 1024;
  c.hidden_size = 256;
  c.intermediate_size = 1024;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.sliding_window = 8;
  c.Finalize();
  return c;
}

// A model and an AdamW optimizer shaped like the trainer's: matrices with weight decay, norms
// without (and with amsgrad, so max_exp_avg_sq is exercised), the embedding frozen (no state).
struct Training {
  GemmaModel model;
  std::unique_ptr<AdamW> optimizer;

  explicit Training(uint64_t seed, bool freeze_embedding = true) : model(SmallConfig()) {
    model->InitializeWeights(0.05, seed);
    std::vector<torch::Tensor> decay, no_decay;
    for (const auto& item : model->named_parameters()) {
      if (freeze_embedding && item.key() == "embed_tokens.weight") {
        item.value().requires_grad_(false);
        continue;
      }
      (item.value().dim() == 1 ? no_decay : decay).push_back(item.value());
    }
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, std::make_unique<AdamWOptions>(AdamWOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.1)));
    groups.emplace_back(no_decay, std::make_unique<AdamWOptions>(AdamWOptions(2e-3).weight_decay(0.0).amsgrad(true)));
    optimizer = std::make_unique<AdamW>(groups, AdamWOptions(1e-3));
  }

  void Step(uint64_t batch_seed) {
    torch::manual_seed(batch_seed);
    const auto ids = torch::randint(SmallConfig().vocab_size, {2, 12}, torch::kLong);
    optimizer->zero_grad(true);
    model->forward(ids).logsumexp(-1).mean().backward();
    optimizer->step();
  }

  AdamWParamState* State(const std::string& name) {
    const auto it = optimizer->state().find(model->named_parameters()[name].unsafeGetTensorImpl());
    return it == optimizer->state().end() ? nullptr : static_cast<AdamWParamState*>(it->second.get());
  }
};

TrainerState SomeTrainerState() {
  TrainerState s;
  s.step = 2;
  s.tokens_seen = 48;
  return s;
}

void ExpectSameModelAndOptimizer(Training& a, Training& b) {
  const auto pb = b.model->named_parameters();
  for (const auto& item : a.model->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), pb[item.key()])) << item.key();
    const auto *sa = a.State(item.key()), *sb = b.State(item.key());
    ASSERT_EQ(sa == nullptr, sb == nullptr) << item.key() << ": state present in one optimizer only";
    if (sa == nullptr) continue;
    EXPECT_EQ(sa->step(), sb->step()) << item.key();
    EXPECT_TRUE(torch::equal(sa->exp_avg(), sb->exp_avg())) << item.key();
    EXPECT_TRUE(torch::equal(sa->exp_avg_sq(), sb->exp_avg_sq())) << item.key();
    ASSERT_EQ(sa->max_exp_avg_sq().defined(), sb->max_exp_avg_sq().defined()) << item.key();
    if (sa->max_exp_avg_sq().defined()) EXPECT_TRUE(torch::equal(sa->max_exp_avg_sq(), sb->max_exp_avg_sq())) << item.key();
  }
  ASSERT_EQ(a.optimizer->param_groups().size(), b.optimizer->param_groups().size());
  for (size_t i = 0; i < a.optimizer->param_groups().size(); ++i) {
    const auto& oa = static_cast<const AdamWOptions&>(a.optimizer->param_groups()[i].options());
    const auto& ob = static_cast<const AdamWOptions&>(b.optimizer->param_groups()[i].options());
    EXPECT_TRUE(oa == ob) << "param group " << i << " options differ";
  }
}

// Three steps in one go equal two, a checkpoint, a load into another model and optimizer (fresh,
// or one with state of its own to overwrite) and a third step: weights and AdamW state bit-exact.
TEST(CheckpointIoTest, OptimizerStateRoundTripsExactlyByParameterName) {
  testing::TempDir dir;
  Training a(1);
  a.Step(10);
  a.Step(11);
  // A parameter with no state yet: it must come back without state, even where the loader had one.
  a.optimizer->state().erase(a.model->named_parameters()["layers.3.mlp.up_proj.weight"].unsafeGetTensorImpl());
  const std::string path = dir.File("step_2.h5");
  SaveCheckpoint(path, *a.model, *a.optimizer, SomeTrainerState(), "");
  // Keyed by name: the moments of a parameter are datasets under its name.
  EXPECT_TRUE(torch::equal(ReadTensorH5(path, "trainer/adamw/state/layers.2.self_attn.k_proj.weight/exp_avg"),
                           a.State("layers.2.self_attn.k_proj.weight")->exp_avg()));

  for (const bool fresh : {true, false}) {
    SCOPED_TRACE(fresh ? "into a fresh optimizer" : "into an optimizer with state");
    Training b(2);
    if (!fresh) b.Step(20);
    b.optimizer->param_groups()[0].options().set_lr(0.5);
    const auto state = LoadCheckpoint(path, *b.model, *b.optimizer);
    EXPECT_EQ(state.step, 2);
    EXPECT_EQ(state.tokens_seen, 48);
    ExpectSameModelAndOptimizer(a, b);
    Training c(1);  // the same two steps again, then the third on both
    c.Step(10);
    c.Step(11);
    c.optimizer->state().erase(c.model->named_parameters()["layers.3.mlp.up_proj.weight"].unsafeGetTensorImpl());
    c.Step(12);
    b.Step(12);
    ExpectSameModelAndOptimizer(c, b);
  }
}

// A checkpoint whose param groups differ from the optimizer's (another train.trainable) is an error
// naming the file and the parameter, found before anything in the optimizer changes.
TEST(CheckpointIoTest, OtherParamGroupsAreAnErrorNamingTheParameter) {
  testing::TempDir dir;
  Training a(6);
  a.Step(60);
  const std::string path = dir.File("step_1.h5");
  SaveCheckpoint(path, *a.model, *a.optimizer, SomeTrainerState(), "");
  Training b(7, /*freeze_embedding=*/false);
  b.Step(70);
  const auto before = b.State("norm.weight")->exp_avg().clone();
  try {
    LoadCheckpoint(path, *b.model, *b.optimizer);
    FAIL() << "a checkpoint of other param groups loaded";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find("'embed_tokens.weight'"), std::string::npos) << message;
  }
  EXPECT_EQ(b.State("norm.weight")->step(), 1);
  EXPECT_TRUE(torch::equal(b.State("norm.weight")->exp_avg(), before));
}

// A checkpoint is verified as it loads: a non-finite AdamW moment, a byte changed inside one, or in
// the trainer state, is an error naming the file and the dataset or attribute.
TEST(CheckpointIoTest, NonFiniteOrCorruptStateIsAnErrorNamingIt) {
  testing::TempDir dir;
  Training a(8);
  a.Step(80);
  const std::string moment = "trainer/adamw/state/layers.1.mlp.down_proj.weight/exp_avg_sq";
  const std::string good = dir.File("good.h5");
  SaveCheckpoint(good, *a.model, *a.optimizer, SomeTrainerState(), "");
  auto expect_refused = [&](const std::string& path, const std::string& wanted) {
    Training b(9);
    try {
      LoadCheckpoint(path, *b.model, *b.optimizer);
      ADD_FAILURE() << path << " loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path + ": " + wanted), std::string::npos) << e.what();
    }
  };
  const std::string flipped = dir.File("flipped.h5");
  std::filesystem::copy_file(good, flipped);
  testing::FlipByteInTensor(flipped, moment);
  expect_refused(flipped, "checksum mismatch in tensor '" + moment + "'");

  const std::string state = dir.File("state.h5");
  std::filesystem::copy_file(good, state);
  auto meta = ReadStringAttributeH5(state, "trainer_state");
  meta[meta.find("step: 2") + 6] = '9';
  testing::RewriteRootAttribute(state, "trainer_state", meta);
  expect_refused(state, "checksum mismatch in attribute 'trainer_state'");

  a.State("layers.1.mlp.down_proj.weight")->exp_avg_sq()[0][0] = std::nan("");
  const std::string nonfinite = dir.File("nonfinite.h5");
  SaveCheckpoint(nonfinite, *a.model, *a.optimizer, SomeTrainerState(), "");
  expect_refused(nonfinite, "tensor '" + moment + "' holds non-finite values (1 NaN, 0 Inf");
}

// The layout before streaming: model datasets plus "trainer/optimizer", the bytes of a
// torch::serialize archive of the whole optimizer.
void WriteLegacyCheckpoint(const std::string& path, const std::string& reference, Training& run) {
  auto tensors = ReadTensorsH5(reference);  // the root datasets: the model's weights
  torch::serialize::OutputArchive archive;
  run.optimizer->save(archive);
  std::ostringstream out;
  archive.save_to(out);
  const std::string bytes = out.str();
  auto optimizer = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  std::memcpy(optimizer.data_ptr(), bytes.data(), bytes.size());
  tensors["trainer/optimizer"] = optimizer;
  tensors["trainer/rng_cpu"] = ReadTensorH5(reference, "trainer/rng_cpu");
  std::map<std::string, std::string> attributes;
  for (const char* name : {"format", "config_yaml", "source", "trainer_state"}) {
    attributes[name] = ReadStringAttributeH5(reference, name);
  }
  WriteTensorsH5(path, tensors, attributes, {{"format_version", 1}});
}

TEST(CheckpointIoTest, CheckpointOfTheArchiveLayoutStillLoads) {
  testing::TempDir dir;
  Training a(3);
  a.Step(30);
  a.Step(31);
  const std::string current = dir.File("current.h5"), legacy = dir.File("legacy.h5");
  SaveCheckpoint(current, *a.model, *a.optimizer, SomeTrainerState(), "");
  WriteLegacyCheckpoint(legacy, current, a);
  EXPECT_THROW(ReadTensorH5(legacy, "trainer/adamw/state/norm.weight/step"), Error);
  EXPECT_EQ(ReadTensorH5(legacy, "trainer/optimizer").scalar_type(), torch::kUInt8);

  Training b(4);
  const auto state = LoadCheckpoint(legacy, *b.model, *b.optimizer);
  EXPECT_EQ(state.step, 2);
  ExpectSameModelAndOptimizer(a, b);
  a.Step(32);
  b.Step(32);
  ExpectSameModelAndOptimizer(a, b);
}

// Peak bytes LibTorch's allocator hands out while `fn` runs, net of what it frees meanwhile.
template <typename Fn>
int64_t PeakBytes(Fn&& fn) {
  auto info = std::make_shared<PeakMemory>();
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, info);
    fn();
  }
  return info->peak();
}

TEST(CheckpointIoTest, SaveAndLoadAddAtMostAboutOneTensor) {
  testing::TempDir dir;
  Training run(5);
  run.Step(50);
  int64_t tensors = 0, total = 0, largest = 0;
  auto count = [&](const torch::Tensor& t) {
    if (!t.defined()) return;
    ++tensors;
    total += t.nbytes();
    largest = std::max<int64_t>(largest, t.nbytes());
  };
  for (const auto& item : run.model->named_parameters()) count(item.value());
  for (const auto& item : run.model->named_buffers()) count(item.value());
  for (const auto& [key, state] : run.optimizer->state()) {
    const auto& s = static_cast<const AdamWParamState&>(*state);
    for (const auto& t : {s.exp_avg(), s.exp_avg_sq(), s.max_exp_avg_sq()}) count(t);
  }
  // A read that cannot go straight into its destination goes through one temporary; 1 MiB covers
  // the small fixed extras (step counters, the generator state).
  const int64_t bound = 2 * largest + (1 << 20);
  std::printf("[ checkpoint ] %lld tensors, %lld bytes in all, largest %lld bytes, bound %lld bytes (%.1fx less "
              "than all)\n",
              static_cast<long long>(tensors), static_cast<long long>(total), static_cast<long long>(largest),
              static_cast<long long>(bound), static_cast<double>(total) / bound);
  ASSERT_GE(tensors, 20);
  ASSERT_GE(total, 5 * bound) << "the model is too small for the bound to mean anything";

  const std::string checkpoint = dir.File("step_1.h5"), weights = dir.File("weights.h5");
  const int64_t save = PeakBytes([&] { SaveCheckpoint(checkpoint, *run.model, *run.optimizer, SomeTrainerState(), ""); });
  const int64_t load = PeakBytes([&] { LoadCheckpoint(checkpoint, *run.model, *run.optimizer); });
  const int64_t save_weights = PeakBytes([&] { SaveWeights(weights, *run.model); });
  const int64_t load_weights = PeakBytes([&] { LoadWeights(weights, *run.model); });
  // bf16 weights into the fp32 model: each tensor goes through one bf16 temporary.
  GemmaModel bf16(SmallConfig());
  bf16->to(torch::kBFloat16);
  const std::string bf16_weights = dir.File("weights_bf16.h5");
  SaveWeights(bf16_weights, *bf16);
  const int64_t load_cast = PeakBytes([&] { LoadWeights(bf16_weights, *run.model); });
  std::printf("[ checkpoint ] peak bytes added: checkpoint save %lld, load %lld; weights save %lld, load %lld, "
              "load from bf16 %lld (bound %lld)\n",
              static_cast<long long>(save), static_cast<long long>(load), static_cast<long long>(save_weights),
              static_cast<long long>(load_weights), static_cast<long long>(load_cast), static_cast<long long>(bound));
  EXPECT_LE(save, bound);
  EXPECT_LE(load, bound);
  EXPECT_LE(save_weights, bound);
  EXPECT_LE(load_weights, bound);
  EXPECT_LE(load_cast, bound);
  EXPECT_TRUE(torch::equal(run.model->named_parameters()["layers.0.mlp.up_proj.weight"],
                           bf16->named_parameters()["layers.0.mlp.up_proj.weight"].to(torch::kFloat32)));
}

}  // namespace
}  // namespace darkformer
