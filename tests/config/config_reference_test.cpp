// The run config's keys are declared once, where each is read (util/key_spec.h), and the
// reference config, the docs' key table and the resume rules are generated from those reads.
// Proven here: the shipped files equal the generated ones; every key read is declared with a doc
// line; a key declared in a reader and nowhere else is readable, documented, validated and
// handled by resume; and kernel options are compared on resume with their defaults filled in.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "train/config_diff.h"
#include "train/config_reference.h"
#include "train/run_config.h"

namespace darkformer {
namespace {

std::string Source() {
  const char* dir = std::getenv("DARKFORMER_SOURCE_DIR");
  return dir ? dir : DARKFORMER_TEST_SOURCE_DIR;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigReferenceTest, ShippedReferenceIsTheGeneratedOne) {
  EXPECT_EQ(ReadFile(Source() + "/configs/reference.yaml"), ReferenceYaml(DeclaredRunConfigKeys()))
      << "regenerate it: build/darkformer config --reference > configs/reference.yaml";
}

TEST(ConfigReferenceTest, ShippedKeyTableIsTheGeneratedOne) {
  EXPECT_EQ(ReadFile(Source() + "/docs/config_keys.md"), KeyTableMarkdown(DeclaredRunConfigKeys()))
      << "regenerate it: build/darkformer config --reference --markdown > docs/config_keys.md";
}

TEST(ConfigReferenceTest, EveryKeyReadIsDeclaredWithADocLine) {
  const auto reader = ConfigReader::Declaring();
  RunConfig::Read(reader);
  std::set<std::string> declared;
  for (const auto& key : reader.declarations()) {
    declared.insert(key.path);
    EXPECT_FALSE(key.doc.empty()) << key.path << " has no doc line";
    if (!key.section) EXPECT_FALSE(key.shown.empty()) << key.path << " shows no default";
  }
  // A plain Get (no KeySpec) still records the default it used: each must be declared too.
  for (const auto& [path, value] : reader.defaults_used()) EXPECT_TRUE(declared.count(path)) << path << " is read undeclared";
  // Every section and every registered kernel's options.
  for (const char* path : {"model.vocab_size", "attention.kernel", "attention.darkformer.rank", "attention.slay.nodes",
                           "attention.constant", "data.mqar.val_seed", "train.memory_check", "train.spikes.on_nonfinite",
                           "train.distributed.timeout_s", "eval.batches", "log.dir"}) {
    EXPECT_TRUE(declared.count(path)) << path;
  }
}

TEST(ConfigReferenceTest, GeneratedReferenceLoadsAsTheDefaults) {
  const auto node = YAML::Load(ReferenceYaml(DeclaredRunConfigKeys()));
  const auto config = RunConfig::FromNode(node, "generated reference");
  const TrainConfig train;
  EXPECT_EQ(config.train.memory_check, train.memory_check);
  EXPECT_EQ(config.train.lr, train.lr);
  EXPECT_EQ(config.train.no_decay, train.no_decay);
  EXPECT_EQ(config.attention.kernel, "exact");
  // Kernel options too: the performer section's draw count is the kernel's own default.
  EXPECT_EQ(node["attention"]["performer"]["num_features"].as<int64_t>(), 256);
  EXPECT_EQ(node["attention"]["slay"]["num_features"].as<int64_t>(), 16);
}

TEST(ConfigReferenceTest, ResumeRulesAreTheDeclaredOnes) {
  // op: cuda's segment_chunks, in every kernel with the operator: the same bits in any segments.
  const std::vector<std::string> expected = {
      "attention.aderf.segment_chunks",     "attention.darkformer.segment_chunks",
      "attention.gerf.segment_chunks",      "attention.lfk.segment_chunks",
      "attention.performer.segment_chunks", "attention.saderf.segment_chunks",
      "attention.sderf.segment_chunks",
      "eval.every",          "log",                      "train.activation_checkpointing", "train.checkpoint_every",
      "train.deterministic", "train.device",             "train.distributed",              "train.fault_injection",
      "train.keep_last",     "train.loss_chunk_tokens",  "train.memory_check",             "train.peak_tflops",
      "train.profile",       "train.steps",              "train.threads"};
  EXPECT_EQ(KeysThatMayChangeOnResume(), expected);
}

// A section declared by a reader alone, as a new key would be.
struct ToyConfig {
  int64_t widgets = 3;
  static ToyConfig Read(const ConfigReader& root) {
    ToyConfig t;
    const auto r = root.Child("toy", "a toy section");
    t.widgets = r.Get("widgets", t.widgets, KeySpec("widgets per gadget").Min(1).Resumable());
    r.RejectUnknown();
    return t;
  }
};

TEST(ConfigReferenceTest, AKeyDeclaredWhereItIsReadIsDocumentedValidatedAndResumable) {
  const auto declaring = ConfigReader::Declaring();
  ToyConfig::Read(declaring);
  const auto& keys = declaring.declarations();
  EXPECT_NE(ReferenceYaml(keys).find("toy:"), std::string::npos);
  EXPECT_NE(ReferenceYaml(keys).find("  widgets: 3"), std::string::npos);
  EXPECT_NE(ReferenceYaml(keys).find("# widgets per gadget"), std::string::npos);
  EXPECT_NE(KeyTableMarkdown(keys).find("| `toy.widgets` | `3` | >= 1 | may change | widgets per gadget |"),
            std::string::npos)
      << KeyTableMarkdown(keys);
  EXPECT_EQ(ResumableKeys(keys), std::vector<std::string>{"toy.widgets"});
  EXPECT_EQ(ToyConfig::Read(ConfigReader(YAML::Load("toy: {widgets: 7}"))).widgets, 7);
  const auto error = ErrorOf([] { ToyConfig::Read(ConfigReader(YAML::Load("toy: {widgets: 0}"))); });
  EXPECT_NE(error.find("config key 'toy.widgets' must be >= 1, got 0 (line 1)"), std::string::npos) << error;
  EXPECT_NE(ErrorOf([] { ToyConfig::Read(ConfigReader(YAML::Load("toy: {widget: 2}"))); }).find("did you mean 'toy.widgets'?"),
            std::string::npos);
}

TEST(ConfigReferenceTest, RulesNameTheKeyAndWhereItsValueCameFrom) {
  const auto path = Source() + "/configs/reference.yaml";
  auto error = ErrorOf([&] { RunConfig::Load(path, {"train.grad_accum=0"}); });
  EXPECT_NE(error.find("'train.grad_accum' must be >= 1, got 0 (from --set train.grad_accum=0)"), std::string::npos) << error;
  error = ErrorOf([&] { RunConfig::Load(path, {"train.min_lr_ratio=1.5"}); });
  EXPECT_NE(error.find("'train.min_lr_ratio' must be in [0, 1], got 1.5"), std::string::npos) << error;
  error = ErrorOf([&] { RunConfig::Load(path, {"attention.performer.projection=gaussian"}); });
  EXPECT_NE(error.find("'attention.performer.projection' must be one of orthogonal, iid; got 'gaussian'"), std::string::npos)
      << error;
  error = ErrorOf([&] { RunConfig::Load(path, {"train.trainable=[]"}); });
  EXPECT_NE(error.find("'train.trainable' must not be empty"), std::string::npos) << error;
}

TEST(ConfigReferenceTest, ResumeComparesKernelOptionsWithTheirDefaultsFilledIn) {
  const auto load = [](const std::string& performer) {
    return RunConfig::FromNode(YAML::Load("attention: {kernel: performer" + performer + "}\n"
                                          "data: {shards_dir: x}"),
                               "test");
  };
  const auto implicit = load(""), written = load(", performer: {num_features: 256}"),
             other = load(", performer: {num_features: 128}");
  EXPECT_FALSE(FirstDifference(FlattenConfig(written), FlattenConfig(implicit)));
  const auto difference = FirstDifference(FlattenConfig(other), FlattenConfig(implicit));
  ASSERT_TRUE(difference);
  EXPECT_EQ(difference->key, "attention.performer.num_features");
  EXPECT_EQ(difference->first, "128");
  EXPECT_EQ(difference->second, "256");
  // op: cuda's segments may change on resume (the same bits), its sub-chunk may not: as a resume
  // compares the recorded document with the command's (op: cuda loads on a GPU run only).
  const auto flat = [](const std::string& options) {
    return FlattenConfig(YAML::Load("attention: {kernel: performer, performer: {op: cuda" + options + "}}"), {});
  };
  EXPECT_FALSE(FirstDifference(flat(", segment_chunks: 4"), flat(""), KeysThatMayChangeOnResume()));
  const auto sub_difference = FirstDifference(flat(", sub_chunk: 16"), flat(""), KeysThatMayChangeOnResume());
  ASSERT_TRUE(sub_difference);
  EXPECT_EQ(sub_difference->key, "attention.performer.sub_chunk");
}


// A default is recorded as the shortest text that reads back as the same number: what `inspect
// --kernels` prints (slay's epsilon 0.1, normaliser_floor 1e-06), not yaml-cpp's 17 digits.
TEST(ConfigReferenceTest, DefaultsUsedAreTheShortestTextOfTheirNumber) {
  const ConfigReader reader(YAML::Load("{}"), "section");
  for (const double value : {1e-6, 0.1, 2.5e-4, 3.0, -0.7, 1e300, 0.30000000000000004}) {
    reader.Get("key", value);
    const auto text = reader.defaults_used().at("section.key");
    EXPECT_EQ(YAML::Load(text).as<double>(), value) << text;
    EXPECT_LE(text.size(), 22u) << text;
  }
  reader.Get("key", 1e-6);
  EXPECT_EQ(reader.defaults_used().at("section.key"), "1e-06");
  reader.Get("key", 0.1);
  EXPECT_EQ(reader.defaults_used().at("section.key"), "0.1");
  reader.Get("key", 0.1f);  // a float's own shortest text, not its double's 0.10000000149011612
  EXPECT_EQ(reader.defaults_used().at("section.key"), "0.1");
}

}  // namespace
}  // namespace darkformer
