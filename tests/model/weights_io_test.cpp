// The strict weights loader: missing, mis-shaped and unexpected tensors, config mismatches,
// non-finite values and bytes changed on disk are errors that name the culprit; our own save/load
// round-trips exactly in fp32 and bf16.
#include <gtest/gtest.h>

#include "model/gemma_model.h"
#include "model/h5_corruption.h"
#include "model/weights_io.h"
#include "test_support.h"

namespace darkformer {
namespace {

using testing::TempDir;

GemmaConfig TinyConfig() {
  GemmaConfig c;
  c.family = "gemma2";
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.sliding_window = 4;
  c.attn_logit_softcapping = 10.0;
  c.final_logit_softcapping = 5.0;
  c.Finalize();
  return c;
}

GemmaModel RandomModel(uint64_t seed) {
  GemmaModel model(TinyConfig());
  model->InitializeWeights(0.2, seed);
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters()) {
    if (p.dim() == 1) p.uniform_(-0.5, 0.5);  // non-zero norms, so a lost norm would show
  }
  return model;
}

std::string ExpectLoadError(const std::string& path) {
  GemmaModel target(TinyConfig());
  try {
    LoadWeights(path, *target);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "loading " << path << " did not fail";
  return "";
}

// Rewrites a saved file with `edit` applied to its tensors, keeping its attributes.
std::string EditedCopy(const std::string& source, const TempDir& dir, const std::string& name,
                       const std::function<void(std::map<std::string, torch::Tensor>&)>& edit) {
  auto tensors = ReadTensorsH5(source);
  edit(tensors);
  const std::string out = dir.File(name);
  WriteTensorsH5(out, tensors,
                 {{"format", "darkformer-weights"}, {"config_yaml", ReadStringAttributeH5(source, "config_yaml")}});
  return out;
}

TEST(WeightsIoTest, RoundTripIsExactInFloat32AndBfloat16) {
  TempDir dir("roundtrip");
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    auto model = RandomModel(7);
    model->to(dtype);
    const std::string path = dir.File("w.h5");
    SaveWeights(path, *model);
    GemmaModel loaded(ReadWeightsConfig(path));
    loaded->to(dtype);
    LoadWeights(path, *loaded);
    const auto params = model->named_parameters();
    for (const auto& item : loaded->named_parameters()) {
      EXPECT_TRUE(torch::equal(item.value(), params[item.key()])) << item.key() << " dtype " << dtype;
    }
    const auto ids = torch::randint(64, {2, 10}, torch::kLong);
    EXPECT_TRUE(torch::equal(model->forward(ids), loaded->forward(ids)));
  }
}

TEST(WeightsIoTest, MissingTensorIsNamed) {
  TempDir dir("missing");
  auto model = RandomModel(1);
  const std::string good = dir.File("good.h5");
  SaveWeights(good, *model);
  const auto bad = EditedCopy(good, dir, "missing.h5", [](auto& t) { t.erase("layers.1.mlp.up_proj.weight"); });
  const auto message = ExpectLoadError(bad);
  EXPECT_NE(message.find("missing tensor"), std::string::npos) << message;
  EXPECT_NE(message.find("layers.1.mlp.up_proj.weight"), std::string::npos) << message;
}

TEST(WeightsIoTest, WrongShapeIsNamed) {
  TempDir dir("shape");
  auto model = RandomModel(1);
  const std::string good = dir.File("good.h5");
  SaveWeights(good, *model);
  const auto bad = EditedCopy(good, dir, "shape.h5",
                              [](auto& t) { t["layers.0.self_attn.k_proj.weight"] = torch::zeros({15, 32}); });
  const auto message = ExpectLoadError(bad);
  EXPECT_NE(message.find("layers.0.self_attn.k_proj.weight"), std::string::npos) << message;
  EXPECT_NE(message.find("[15, 32]"), std::string::npos) << message;
  EXPECT_NE(message.find("[16, 32]"), std::string::npos) << message;
}

TEST(WeightsIoTest, ExtraTensorIsNamed) {
  TempDir dir("extra");
  auto model = RandomModel(1);
  const std::string good = dir.File("good.h5");
  SaveWeights(good, *model);
  const auto bad = EditedCopy(good, dir, "extra.h5", [](auto& t) { t["layers.0.mlp.bias"] = torch::zeros({32}); });
  const auto message = ExpectLoadError(bad);
  EXPECT_NE(message.find("unexpected tensor 'layers.0.mlp.bias'"), std::string::npos) << message;
}

TEST(WeightsIoTest, ConfigMismatchNamesTheField) {
  TempDir dir("config");
  auto model = RandomModel(1);
  const std::string path = dir.File("w.h5");
  SaveWeights(path, *model);
  auto other = TinyConfig();
  other.sliding_window = 6;
  GemmaModel target(other);
  try {
    LoadWeights(path, *target);
    FAIL() << "config mismatch accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sliding_window: 6 vs 4"), std::string::npos) << e.what();
  }
}

TEST(WeightsIoTest, NotAWeightsFileIsAClearError) {
  TempDir dir("notweights");
  const std::string path = dir.File("plain.h5");
  WriteTensorsH5(path, {{"x", torch::zeros({2})}}, {});
  try {
    ReadWeightsConfig(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a darkformer weights file"), std::string::npos) << e.what();
  }
  try {
    ReadWeightsConfig(dir.File("absent.h5"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("absent.h5"), std::string::npos) << e.what();
  }
}

TEST(WeightsIoTest, NonFiniteWeightIsRefusedNamingTensorAndFile) {
  TempDir dir("nonfinite");
  auto model = RandomModel(1);
  const std::string good = dir.File("good.h5");
  SaveWeights(good, *model);
  for (const double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL}) {
    const auto path = EditedCopy(good, dir, "nonfinite.h5", [&](auto& t) {
      t["layers.1.self_attn.v_proj.weight"][3][5] = bad;
    });
    const auto message = ExpectLoadError(path);
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find("tensor 'layers.1.self_attn.v_proj.weight' holds non-finite values"), std::string::npos)
        << message;
    EXPECT_NE(message.find(std::isnan(bad) ? "1 NaN, 0 Inf" : "0 NaN, 1 Inf"), std::string::npos) << message;
  }
}

// The check sums each slice first; finite values whose sum overflows take the exact test and load.
TEST(WeightsIoTest, HugeFiniteWeightsLoad) {
  TempDir dir("hugefinite");
  auto model = RandomModel(2);
  {
    torch::NoGradGuard no_grad;
    model->named_parameters()["layers.0.mlp.up_proj.weight"].fill_(3.0e38f);  // sums to inf in fp32
  }
  const std::string path = dir.File("huge.h5");
  SaveWeights(path, *model);
  GemmaModel loaded(TinyConfig());
  LoadWeights(path, *loaded);
  EXPECT_TRUE(torch::equal(loaded->named_parameters()["layers.0.mlp.up_proj.weight"],
                           model->named_parameters()["layers.0.mlp.up_proj.weight"]));
}

TEST(WeightsIoTest, EveryTensorIsStoredWithAChecksum) {
  TempDir dir("fletcher");
  auto model = RandomModel(1);
  const std::string path = dir.File("w.h5");
  SaveWeights(path, *model);
  for (const auto& item : model->named_parameters()) EXPECT_TRUE(testing::HasFletcher32(path, item.key())) << item.key();
}

TEST(WeightsIoTest, AFlippedByteInATensorIsAChecksumMismatchNamingIt) {
  TempDir dir("flipped");
  auto model = RandomModel(1);
  const std::string path = dir.File("w.h5");
  SaveWeights(path, *model);
  for (const std::string name : {"layers.0.mlp.up_proj.weight", "norm.weight", "embed_tokens.weight"}) {
    const std::string copy = dir.File("flipped.h5");
    std::filesystem::copy_file(path, copy, std::filesystem::copy_options::overwrite_existing);
    testing::FlipByteInTensor(copy, name);
    const auto message = ExpectLoadError(copy);
    EXPECT_NE(message.find(copy + ": checksum mismatch in tensor '" + name + "'"), std::string::npos) << message;
  }
}

TEST(WeightsIoTest, AnAttributeChangedWithoutItsChecksumIsAMismatchNamingIt) {
  TempDir dir("attribute");
  auto model = RandomModel(1);
  const std::string path = dir.File("w.h5");
  SaveWeights(path, *model);
  auto yaml = ReadStringAttributeH5(path, "config_yaml");
  yaml[yaml.find("hidden_size: 32") + 14] = '1';  // still a valid config: hidden_size 31
  testing::RewriteRootAttribute(path, "config_yaml", yaml);
  try {
    ReadWeightsConfig(path);
    FAIL() << "an edited config_yaml was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path + ": checksum mismatch in attribute 'config_yaml'"), std::string::npos)
        << e.what();
  }
}

TEST(WeightsIoTest, AFileWrittenBeforeChecksumsStillLoads) {
  TempDir dir("legacy");
  auto model = RandomModel(3);
  const std::string path = dir.File("legacy.h5");
  std::map<std::string, torch::Tensor> state;
  for (const auto& item : model->named_parameters()) state[item.key()] = item.value();
  for (const auto& item : model->named_buffers()) state[item.key()] = item.value();
  WriteTensorsH5(path, state,
                 {{"format", "darkformer-weights"}, {"config_yaml", model->config().ToYamlText()}},
                 {{"format_version", 1}}, H5WriteOptions{.checksums = false});
  EXPECT_FALSE(H5Reader(path).has_checksums());
  EXPECT_FALSE(testing::HasFletcher32(path, "norm.weight"));
  GemmaModel loaded(ReadWeightsConfig(path));
  LoadWeights(path, *loaded);
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), loaded->named_parameters()[item.key()])) << item.key();
  }
}

}  // namespace
}  // namespace darkformer
