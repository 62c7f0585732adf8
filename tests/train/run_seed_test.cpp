// train.seed is the run's seed: it offsets the data order and every kernel's draws (so a sweep
// over seeds varies all of a finetune's randomness), and seed 0 leaves them as configured.
#include <gtest/gtest.h>

#include "attention/kernel_registry.h"
#include "data/data_test_util.h"
#include "model/gemma_model.h"
#include "train/tiny_run.h"

namespace darkformer {
namespace {

torch::Tensor Projection(const RunConfig& config) {
  GemmaModel model(config.model, config.attention);
  return model->named_buffers()["layers.0.self_attn.kernel.projection"].clone();
}

TEST(RunSeedTest, TrainSeedOffsetsDataOrderAndKernelDrawsAndZeroKeepsThem) {
  testing::TempDir dir;
  const auto seed0 = testing::TinyRunConfig(dir.File("a"), "performer", {"train.seed=0", "data.seed=5"});
  const auto seed1 = testing::TinyRunConfig(dir.File("b"), "performer", {"train.seed=1", "data.seed=5"});
  const auto seed2 = testing::TinyRunConfig(dir.File("c"), "performer", {"train.seed=2", "data.seed=5"});
  EXPECT_EQ(seed0.data.seed, 5u);
  EXPECT_NE(seed1.data.seed, seed0.data.seed);
  EXPECT_NE(seed2.data.seed, seed1.data.seed);

  // Seed 0: the draw of a kernel built straight from its options (layer 0, option seed 0).
  KernelShape shape;
  shape.num_heads = seed0.model.num_attention_heads;
  shape.head_dim = seed0.model.head_dim;
  const auto direct = MakeAttentionKernel("performer", shape, seed0.attention.OptionsFor("performer"));
  EXPECT_TRUE(torch::equal(Projection(seed0), direct->named_buffers()["projection"]));
  // Other seeds draw other features, and the same seed the same ones.
  EXPECT_FALSE(torch::equal(Projection(seed0), Projection(seed1)));
  EXPECT_FALSE(torch::equal(Projection(seed1), Projection(seed2)));
  EXPECT_TRUE(torch::equal(Projection(seed1), Projection(testing::TinyRunConfig(dir.File("d"), "performer",
                                                                               {"train.seed=1", "data.seed=5"}))));
}

}  // namespace
}  // namespace darkformer
