// Model configs: every shipped YAML parses and round-trips; analytic parameter counts equal a
// built model's; bad keys and values are errors naming the key path.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "model/model_spec.h"
#include "model/gemma_model.h"
#include "model/parameter_count.h"
#include "test_support.h"

namespace darkformer {
namespace {

GemmaConfig Parse(const std::string& yaml) { return GemmaConfig::FromConfig(ConfigReader(YAML::Load(yaml), "model")); }

std::string ParseError(const std::string& yaml) {
  try {
    Parse(yaml);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GemmaConfigTest, EveryShippedModelConfigRoundTrips) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(testing::SourceDir() + "/configs/model")) {
    const auto config = ReadModelSpec(entry.path().string()).model;
    const auto again = GemmaConfig::FromYamlText(config.ToYamlText(), "round trip");
    EXPECT_EQ(config.Diff(again), "") << entry.path();
    ++count;
  }
  EXPECT_GE(count, 5);
}

TEST(GemmaConfigTest, Gemma2bHasTheKnownParameterCount) {
  const auto spec = ReadModelSpec(testing::SourceDir() + "/configs/model/gemma-2b.yaml");
  EXPECT_EQ(CountParameters(spec.model).Total(), 2506172416LL);
}

TEST(GemmaConfigTest, AnalyticCountsEqualBuiltModels) {
  for (const std::string family : {"gemma", "gemma2", "gemma3"}) {
    auto config = Parse("family: " + family +
                        "\nvocab_size: 50\nhidden_size: 24\nintermediate_size: 40\nnum_hidden_layers: 6\n"
                        "num_attention_heads: 4\nnum_key_value_heads: 2\nhead_dim: 6\nsliding_window: 3\n");
    GemmaModel model(config);
    int64_t numel = 0;
    for (const auto& p : model->parameters()) numel += p.numel();
    EXPECT_EQ(CountParameters(config).Total(), numel) << family;
  }
}

TEST(GemmaConfigTest, FamilyDefaultsForLayerTypes) {
  const auto g2 = Parse("family: gemma2\nnum_hidden_layers: 4\nsliding_window: 8\n");
  EXPECT_EQ(g2.layer_types, (std::vector<std::string>{"sliding_attention", "full_attention", "sliding_attention",
                                                      "full_attention"}));
  const auto g3 = Parse("family: gemma3\nnum_hidden_layers: 7\nsliding_window: 8\n");
  EXPECT_TRUE(g3.IsSliding(4));
  EXPECT_FALSE(g3.IsSliding(5));
  EXPECT_TRUE(g3.IsSliding(6));
}

TEST(GemmaConfigTest, ErrorsNameTheKeyPath) {
  EXPECT_NE(ParseError("hidden_sise: 10\n").find("unknown config key 'model.hidden_sise'"), std::string::npos);
  EXPECT_NE(ParseError("hidden_size: big\n").find("'model.hidden_size' must be an integer"), std::string::npos);
  EXPECT_NE(ParseError("family: gemma4\n").find("model.family"), std::string::npos);
  EXPECT_NE(ParseError("num_hidden_layers: 2\nlayer_types: [full_attention]\n").find("model.layer_types"),
            std::string::npos);
  EXPECT_NE(ParseError("num_attention_heads: 8\nnum_key_value_heads: 3\n").find("model.num_key_value_heads"),
            std::string::npos);
}

// Each model key's rule is its declaration (KeySpec in VisitFields): the reader refuses a value
// with the rule and where it was written, a config built in code meets the same rule in Finalize,
// and the docs' key table shows it.
TEST(GemmaConfigTest, KeyRulesAreDeclared) {
  EXPECT_NE(ParseError("head_dim: 7\n").find("'model.head_dim' must be positive, a multiple of 2 (RoPE), got 7"),
            std::string::npos);
  EXPECT_NE(ParseError("head_dim: 7\n").find("line 1"), std::string::npos) << ParseError("head_dim: 7\n");
  EXPECT_NE(ParseError("vocab_size: 0\n").find("'model.vocab_size' must be positive, got 0"), std::string::npos);
  EXPECT_NE(ParseError("sliding_window: -1\n").find("'model.sliding_window' must be >= 0 (0 = none), got -1"),
            std::string::npos);
  EXPECT_NE(ParseError("num_hidden_layers: 2\nlayer_types: [full_attention, global]\n")
                .find("'model.layer_types' [1] must be one of full_attention, sliding_attention; got 'global'"),
            std::string::npos);
  GemmaConfig built;
  built.rms_norm_eps = 0.0;
  try {
    built.Finalize();
    ADD_FAILURE() << "a code-built config with rms_norm_eps 0 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'model.rms_norm_eps' must be positive, got 0.0"), std::string::npos) << e.what();
  }
  std::ifstream file(testing::SourceDir() + "/docs/config_keys.md");
  const std::string table((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  EXPECT_NE(table.find("| `model.head_dim` | `256` | positive, a multiple of 2 (RoPE) |"), std::string::npos);
}

}  // namespace
}  // namespace darkformer
