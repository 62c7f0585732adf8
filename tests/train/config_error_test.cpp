// Config errors name the key path: unknown keys, wrong types and bad kernel options, in any
// section (kernel options are checked at load, by building each kernel in use once).
#include <gtest/gtest.h>

#include "data/data_test_util.h"
#include "train/tiny_run.h"
#include "train/trainer.h"
#include "util/error.h"

namespace darkformer {
namespace {

struct BadConfig {
  std::string name;
  std::string kernel;
  std::string assignment;  // --set style, applied to a valid tiny config
  std::string key_path;    // the error must name it
};

class ConfigErrorTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(ConfigErrorTest, MessageNamesTheKeyPath) {
  const auto& bad = GetParam();
  testing::TempDir dir;
  try {
    testing::TinyRunConfig(dir.path(), bad.kernel, {bad.assignment});
    FAIL() << "no error for " << bad.assignment;
  } catch (const Error& e) {
    const std::string message = e.what();
    std::printf("[ %s ] %s\n", bad.name.c_str(), message.c_str());
    EXPECT_NE(message.find(bad.key_path), std::string::npos) << message;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ConfigErrorTest,
    ::testing::Values(
        BadConfig{"UnknownTrainKey", "exact", "train.learning_rate=0.1", "train.learning_rate"},
        BadConfig{"UnknownNestedKey", "exact", "train.spikes.windw=5", "train.spikes.windw"},
        BadConfig{"UnknownTopLevelSection", "exact", "trian.steps=5", "trian"},
        BadConfig{"WrongTypeInteger", "exact", "train.steps=many", "train.steps"},
        BadConfig{"WrongTypeBoolean", "exact", "train.deterministic=sometimes", "train.deterministic"},
        BadConfig{"WrongTypeList", "exact", "train.trainable={a: 1}", "train.trainable"},
        BadConfig{"BadEnumValue", "exact", "train.spikes.on_nonfinite=ignore", "train.spikes.on_nonfinite"},
        BadConfig{"UnknownKernel", "exact", "attention.kernel=softmax2", "attention.kernel"},
        BadConfig{"UnknownKernelOption", "performer", "attention.performer.num_featurs=8",
                  "attention.performer.num_featurs"},
        BadConfig{"KernelOptionWrongType", "performer", "attention.performer.num_features=lots",
                  "attention.performer.num_features"},
        BadConfig{"KernelOptionBadValue", "darkformer", "attention.darkformer.projection=gaussianish",
                  "attention.darkformer.projection"},
        BadConfig{"ModelWrongType", "exact", "model.hidden_size=wide", "model.hidden_size"},
        BadConfig{"DataUnknownKey", "exact", "data.seqlen=16", "data.seqlen"},
        BadConfig{"FaultInjectionUnknownKey", "exact", "train.fault_injection.nan_at=3",
                  "train.fault_injection.nan_at"},
        BadConfig{"FaultInjectionWrongType", "exact", "train.fault_injection.lr_multiplier_at_step={step: x}",
                  "train.fault_injection.lr_multiplier_at_step.step"},
        BadConfig{"Tf32BadValue", "exact", "train.tf32=sometimes", "train.tf32"},
        BadConfig{"NegativeLossChunk", "exact", "train.loss_chunk_tokens=-1", "train.loss_chunk_tokens"},
        BadConfig{"CheckpointingWrongType", "exact", "train.activation_checkpointing=often",
                  "train.activation_checkpointing"},
        BadConfig{"PrecisionBadValue", "exact", "train.precision=fp16", "train.precision"}),
    [](const auto& info) { return info.param.name; });

// train.tf32: true on a CPU run would do nothing (no TF32 there): refused when the run starts.
TEST(ConfigErrorTest, Tf32TrueOnTheCpuIsRefused) {
  testing::TempDir dir;
  const auto config = testing::TinyRunConfig(dir.path(), "exact", {"train.tf32=true"});
  try {
    Trainer trainer(config);
    FAIL() << "train.tf32: true accepted on the CPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.tf32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace darkformer
