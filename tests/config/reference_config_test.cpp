// configs/reference.yaml documents every run-config key with its default: it must load, and its
// values must be the defaults the code uses. Every shipped run config must load too.
#include <gtest/gtest.h>

#include <filesystem>

#include "train/run_config.h"

namespace darkformer {
namespace {

std::string Source() {
  const char* dir = std::getenv("DARKFORMER_SOURCE_DIR");
  return dir ? dir : DARKFORMER_TEST_SOURCE_DIR;
}

TEST(ReferenceConfigTest, LoadsAndStatesTheDefaults) {
  const auto config = RunConfig::Load(Source() + "/configs/reference.yaml");
  const TrainConfig train_defaults;
  EXPECT_EQ(config.train.lr, train_defaults.lr);
  EXPECT_EQ(config.train.steps, train_defaults.steps);
  EXPECT_EQ(config.train.schedule, train_defaults.schedule);
  EXPECT_EQ(config.train.no_decay, train_defaults.no_decay);
  EXPECT_EQ(config.train.spikes.loss_z, train_defaults.spikes.loss_z);
  const EvalConfig eval_defaults;
  EXPECT_EQ(config.eval.every, eval_defaults.every);
  const GemmaConfig model_defaults;
  EXPECT_EQ(config.model.Diff(GemmaConfig::FromYamlText(model_defaults.ToYamlText(), "defaults")), "");
  EXPECT_EQ(config.attention.kernel, "exact");
}

TEST(ReferenceConfigTest, EveryShippedRunConfigLoads) {
  int loaded = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(Source() + "/configs")) {
    const auto path = entry.path();
    if (path.extension() != ".yaml" || path.parent_path().filename() == "model") continue;
    const auto text = YAML::LoadFile(path.string());
    if (text["grid"]) continue;  // a sweep file: tests/sweep checks those
    if (!text["model"] && !text["base"]) continue;
    EXPECT_NO_THROW(RunConfig::Load(path.string())) << path;
    ++loaded;
  }
  EXPECT_GE(loaded, 3);
}

TEST(ReferenceConfigTest, OverridesAndErrorsNameTheKeyPath) {
  const auto config = RunConfig::Load(Source() + "/configs/reference.yaml",
                                      {"train.lr=0.5", "attention.kernel=performer", "train.trainable=[\"*q_proj*\"]"});
  EXPECT_EQ(config.train.lr, 0.5);
  EXPECT_EQ(config.attention.kernel, "performer");
  EXPECT_EQ(config.train.trainable, std::vector<std::string>{"*q_proj*"});
  auto error = [](const std::vector<std::string>& overrides) {
    try {
      RunConfig::Load(Source() + "/configs/reference.yaml", overrides);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error({"train.lrr=1"}).find("'train.lrr'"), std::string::npos);
  EXPECT_NE(error({"train.lr=fast"}).find("'train.lr' must be a number"), std::string::npos);
  EXPECT_NE(error({"attention.kernel=softmax"}).find("valid kernels: aderf, constant, darkformer, exact, flexformer, gerf, lfk, performer, random, saderf, sderf, slay, trig"),
            std::string::npos);
  EXPECT_NE(error({"data.packing=zip"}).find("data.packing"), std::string::npos);
}

}  // namespace
}  // namespace darkformer
