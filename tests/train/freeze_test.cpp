// q/k/v-only finetuning (train.trainable globs): after 10 steps every other parameter is
// bit-identical to the initial weights and every q/k/v projection has changed; frozen parameters
// have no gradient and no optimizer state.
#include <gtest/gtest.h>

#include <set>

#include "data/data_test_util.h"
#include "model/weights_io.h"
#include "train/tiny_run.h"
#include "train/trainable_set.h"
#include "train/trainer.h"

namespace darkformer {
namespace {

bool IsQkv(const std::string& name) {
  return MatchesAny(name, {"*.q_proj.*", "*.k_proj.*", "*.v_proj.*"});
}

TEST(FreezeTest, QkvOnlyFinetuningLeavesEveryOtherParameterBitIdentical) {
  testing::TempDir dir;
  const std::string run_dir = dir.File("run"), init = dir.File("init.h5");
  // The initial weights, as a finetune would start from them.
  const auto base = testing::TinyRunConfig(run_dir, "darkformer");
  GemmaModel initial(base.model, base.attention);
  initial->InitializeWeights(0.02, 3);
  SaveWeights(init, *initial);

  const auto config = testing::TinyRunConfig(
      run_dir, "darkformer",
      {"train.steps=10", "train.init_from=" + init, "train.trainable=['*.q_proj.*', '*.k_proj.*', '*.v_proj.*']",
       "train.weight_decay=0.1", "train.lr=1.0e-3", "train.warmup_steps=0"});
  Trainer trainer(config);
  ASSERT_EQ(trainer.Run(), kExitOk);

  auto trained = trainer.model();
  std::map<std::string, torch::Tensor> before;
  for (const auto& item : initial->named_parameters()) before[item.key()] = item.value();
  int64_t changed = 0, frozen = 0;
  std::set<const void*> trainable_ptrs;
  for (const auto& item : trained->named_parameters()) {
    const auto& name = item.key();
    const auto& param = item.value();
    if (IsQkv(name)) {
      EXPECT_TRUE(param.requires_grad()) << name;
      EXPECT_FALSE(torch::equal(param, before.at(name))) << name << " did not change";
      trainable_ptrs.insert(param.unsafeGetTensorImpl());
      ++changed;
    } else {
      EXPECT_FALSE(param.requires_grad()) << name;
      EXPECT_FALSE(param.grad().defined()) << name << " has a gradient";
      EXPECT_TRUE(torch::equal(param, before.at(name))) << name << " changed although frozen";
      ++frozen;
    }
  }
  EXPECT_EQ(changed, 3 * config.model.num_hidden_layers);
  EXPECT_GT(frozen, 0);
  // The optimizer holds the q/k/v tensors only, and state for exactly those.
  std::set<const void*> in_optimizer;
  for (const auto& group : trainer.optimizer().param_groups()) {
    for (const auto& p : group.params()) in_optimizer.insert(p.unsafeGetTensorImpl());
  }
  EXPECT_EQ(in_optimizer, trainable_ptrs);
  EXPECT_EQ(trainer.optimizer().state().size(), trainable_ptrs.size());
  for (const auto& [key, state] : trainer.optimizer().state()) {
    EXPECT_TRUE(trainable_ptrs.count(key)) << "optimizer state for a frozen tensor";
  }
  std::printf("[ qkv finetune ] %lld tensors trained and changed, %lld frozen tensors bit-identical\n",
              static_cast<long long>(changed), static_cast<long long>(frozen));
}

}  // namespace
}  // namespace darkformer
