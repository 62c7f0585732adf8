// A new kernel added in one file, the way docs/extending.md describes: its class, its option
// (declared where it is read) and its registration. Nothing else in the project names it, and yet
// the config reader accepts `attention.kernel: toy` and validates its section, the declarations
// (reference.yaml, the key table) list it, the traits describe it, the trainer trains and resumes
// it, the memory estimate sizes it (FeatureKernelBase's shadow), and this binary's suites that
// instantiate over the registry run it too (Kernels/Bf16TracksFp32Test.TwentyStepsWithinBf16Tolerance/toy_*).
#include <gtest/gtest.h>

#include <cmath>

#include "attention/kernel_registry.h"
#include "attention/kernel_traits.h"
#include "attention/log_feature_kernel.h"
#include "attention/positive_features.h"
#include "data/data_test_util.h"
#include "train/config_reference.h"
#include "train/memory_estimate.h"
#include "train/tiny_run.h"
#include "train/trainer.h"
#include "util/error.h"

namespace darkformer {
namespace {

// Performer features at a temperature t: phi(x) = exp(W x / sqrt(t) - |x|^2 / 2t) / sqrt(m),
// unbiased for exp(x.y / t) (000 Lemma 2.1 applied to x / sqrt(t)).
class ToyKernelImpl : public LogFeatureKernel {
 public:
  // Its options, read by their declarations (the config check) and built from (the factory).
  struct Options {
    FeatureKernelOptions features;
    double temperature = 2.0;
    static Options Read(const ConfigReader& reader) {
      Options o{FeatureKernelOptions::Read(reader, /*with_redraw=*/true, /*with_op=*/true)};
      o.temperature = reader.Get("temperature", o.temperature, KeySpec("t: the features estimate exp(x.y / t)").Above(0));
      reader.RejectUnknown();
      return o;
    }
  };
  ToyKernelImpl(const KernelShape& shape, const Options& options)
      : LogFeatureKernel(shape, options.features), temperature_(options.temperature) {
    RegisterDraw(shape.head_dim);
    ++built;
  }
  static inline int built = 0;  // kernels constructed so far
  torch::Tensor LogFeaturesWith(const torch::Tensor& x_BNLD, const std::vector<torch::Tensor>& params,
                                bool /*is_query*/) const override {
    return LogPositiveFeatures(x_BNLD / std::sqrt(temperature_), params.at(0));
  }
  std::vector<torch::Tensor> FeatureParams() const override { return {projection_}; }
  torch::Tensor EstimatorTarget(const torch::Tensor& x_BHPD, const torch::Tensor& y_BHPD) const override {
    return SoftmaxKernelTarget(x_BHPD / std::sqrt(temperature_), y_BHPD / std::sqrt(temperature_));
  }

 private:
  double temperature_;
};
TORCH_MODULE(ToyKernel);

// The registration, as a built-in kernel ends its .cpp (with no row: after the built-in kernels).
const bool kToyRegistered = RegisterKernel<ToyKernel>(
    "toy", kTableRowAfterBuiltIns, "a test's toy: Performer features at a temperature t, unbiased for exp(x.y / t)");

TEST(ToyKernelTest, TheRegistryDescribesIt) {
  ASSERT_TRUE(kToyRegistered);
  const auto& t = TraitsOf("toy");
  EXPECT_EQ(t.family, KernelFamily::kPositive);
  EXPECT_TRUE(t.log_form);
  EXPECT_TRUE(t.learns.empty());
  EXPECT_EQ(std::stod(t.option_defaults.at("temperature")), 2.0);
  EXPECT_EQ(t.option_defaults.at("num_features"), "256");
  const auto positive = KernelNames(KernelFamily::kPositive);
  EXPECT_NE(std::find(positive.begin(), positive.end(), "toy"), positive.end());
  // Its name is written once, in the registration: the kernel built under it carries it, and it
  // follows the built-in kernels in the tables' order.
  const auto kernel = MakeAttentionKernel("toy", KernelShape{2, 8, 0}, ConfigReader(YAML::Load("{}"), "attention.toy"));
  EXPECT_EQ(kernel->kernel_name(), "toy");
  const auto order = KernelNamesInTableOrder();
  EXPECT_EQ(order.back(), "toy");
  EXPECT_EQ(std::vector<std::string>(order.begin(), order.begin() + 3), (std::vector<std::string>{"exact", "darkformer", "performer"}));
  EXPECT_THROW(RegisterAttentionKernel("toy", FactoryOf<ToyKernel>(), OptionsCheckOf<ToyKernel>(), ""), Error);
  EXPECT_THROW(RegisterAttentionKernel("Bad-Name", FactoryOf<ToyKernel>(), OptionsCheckOf<ToyKernel>(), ""), Error);
  EXPECT_THROW(RegisterAttentionKernel("toy_without_check", FactoryOf<ToyKernel>(), nullptr, ""), Error);
}

TEST(ToyKernelTest, ItsOptionIsDeclaredDocumentedAndValidated) {
  const auto keys = DeclaredRunConfigKeys();
  bool section = false, option = false;
  for (const auto& k : keys) {
    if (k.path == "attention.toy") section = k.section && k.doc.find("toy") != std::string::npos;
    if (k.path == "attention.toy.temperature") option = k.shown == "2.0" && k.rule == "positive";
  }
  EXPECT_TRUE(section);
  EXPECT_TRUE(option);
  EXPECT_NE(ReferenceYaml(keys).find("  toy:"), std::string::npos);
  EXPECT_NE(ReferenceYaml(keys).find("| toy |"), std::string::npos) << "attention.kernel lists it";
  EXPECT_NE(KeyTableMarkdown(keys).find("attention.toy.temperature"), std::string::npos);

  testing::TempDir dir;
  // A run config's kernel options are read by their declarations: reading one builds no kernel.
  const int built_before = ToyKernelImpl::built;
  const auto config = testing::TinyRunConfig(dir.path(), "toy", {"attention.toy.temperature=3"});
  EXPECT_EQ(ToyKernelImpl::built, built_before);
  EXPECT_EQ(config.resolved["attention"]["toy"]["temperature"].as<double>(), 3.0);
  try {
    Trainer(testing::TinyRunConfig(dir.path(), "toy", {"attention.toy.temperature=0"}));
    FAIL() << "temperature 0 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attention.toy.temperature"), std::string::npos) << e.what();
  }
  try {
    Trainer(testing::TinyRunConfig(dir.path(), "toy", {"attention.toy.temprature=3"}));
    FAIL() << "a misspelt option was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("temperature"), std::string::npos) << e.what();
  }
}

TEST(ToyKernelTest, TrainsResumesAndIsSized) {
  testing::TempDir whole, split;
  const std::vector<std::string> options = {"attention.toy.num_features=32", "attention.toy.chunk_size=8",
                                            "train.checkpoint_every=5"};
  ASSERT_EQ(Trainer(testing::TinyRunConfig(whole.path(), "toy", options)).Run(), kExitOk);
  const auto lines = testing::TrainLines(whole.path());
  ASSERT_EQ(lines.size(), 20u);
  EXPECT_LT(lines.back()["loss"].as<double>(), lines.front()["loss"].as<double>());

  auto interrupted = options;
  interrupted.push_back("train.fault_injection.stop_at_step=10");
  const auto config = testing::TinyRunConfig(split.path(), "toy", interrupted);
  ASSERT_EQ(Trainer(config).Run(), kExitInterrupted);
  ASSERT_EQ(Trainer(config).Run(), kExitOk);  // resumes from the step-10 checkpoint
  const auto resumed = testing::TrainLines(split.path());
  ASSERT_EQ(resumed.size(), lines.size());
  EXPECT_EQ(resumed.back()["loss"].as<double>(), lines.back()["loss"].as<double>()) << "bit-exact resume";

  const auto estimate = EstimateTrainingMemory(testing::TinyRunConfig(whole.path(), "toy", options), {.cpu = true});
  EXPECT_GT(estimate.activations_full, 0);
  EXPECT_GT(estimate.peak, estimate.weights);
}

}  // namespace
}  // namespace darkformer
