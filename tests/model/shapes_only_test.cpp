// Building for shapes alone (util/shapes_only.h), as the memory estimate builds a run's model:
// every family with every registered kernel gets a real build's parameter and buffer names, sizes
// and dtypes (the kernels' draws themselves, being built for real), and a Gemma-2B build allocates
// none of its 10 GB. Outside the scope, tensors are real again.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <map>
#include <unistd.h>

#include "attention/kernel_registry.h"
#include "model/gemma_model.h"
#include "tiny_gemma.h"
#include "util/shapes_only.h"

namespace darkformer {
namespace {

struct Described {
  std::map<std::string, std::string> parameters, buffers;
};

std::string SizeAndType(const torch::Tensor& t) {
  return c10::str(t.sizes()) + " " + c10::toString(t.scalar_type()) + (t.requires_grad() ? " grad" : "");
}

Described Describe(GemmaModelImpl& model) {
  Described d;
  for (const auto& p : model.named_parameters()) d.parameters[p.key()] = SizeAndType(p.value());
  for (const auto& b : model.named_buffers()) d.buffers[b.key()] = SizeAndType(b.value());
  return d;
}

GemmaConfig Small(const std::string& family) {
  auto c = testing::TinyGemmaConfig(2);
  c.family = family;
  return c;
}

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

TEST(ShapesOnlyTest, EveryFamilyAndKernelBuildsAsTheRealModel) {
  for (const std::string family : {"gemma", "gemma2", "gemma3"}) {
    for (const auto& kernel : KernelNames()) {
      AttentionConfig attention;
      attention.kernel = kernel;
      GemmaModel real(Small(family), attention);
      GemmaModel shapes{nullptr};
      {
        ShapesOnlyScope scope;
        shapes = GemmaModel(Small(family), attention);
      }
      const auto a = Describe(*real), b = Describe(*shapes);
      EXPECT_EQ(b.parameters, a.parameters) << family << " " << kernel;
      EXPECT_EQ(b.buffers, a.buffers) << family << " " << kernel;
      // The kernels are built for real: their draws are the real build's.
      const auto real_buffers = real->named_buffers(), shape_buffers = shapes->named_buffers();
      for (const auto& item : real_buffers) {
        EXPECT_TRUE(torch::equal(item.value(), shape_buffers[item.key()])) << family << " " << kernel << " " << item.key();
      }
      for (const auto& p : shapes->named_parameters()) {
        // Meta tensors, except the kernels' own (built for real).
        const bool kernel = p.key().find(".kernel.") != std::string::npos;
        EXPECT_EQ(p.value().is_meta(), !kernel) << family << " " << kernel << " " << p.key();
      }
    }
  }
}

TEST(ShapesOnlyTest, Gemma2BAllocatesNothingAndTensorsAreRealAfter) {
  const int64_t before = ResidentBytes();
  int64_t parameters = 0;
  {
    ShapesOnlyScope scope;
    AttentionConfig attention;
    attention.kernel = "darkformer";
    GemmaModel model(GemmaConfig{}, attention);  // the defaults are Gemma 2B's
    for (const auto& p : model->parameters()) parameters += p.numel();
    // Conversions stay shapes only (train.frozen_weights_bf16 in the estimate).
    EXPECT_TRUE(model->embed_tokens->weight.is_meta());
    const auto half = model->embed_tokens->weight.to(torch::kBFloat16);
    EXPECT_EQ(half.scalar_type(), torch::kBFloat16);
    EXPECT_EQ(half.sizes(), model->embed_tokens->weight.sizes());
  }
  EXPECT_GT(parameters, 2'500'000'000);  // 10 GB in fp32
  EXPECT_LT(ResidentBytes() - before, 256LL << 20) << "a shapes-only Gemma-2B must not allocate its weights";
  const auto after = torch::ones({3});
  EXPECT_FALSE(after.is_meta());
  EXPECT_EQ(after.sum().item<float>(), 3.0f);
}

TEST(ShapesOnlyTest, RealTensorsScopeOutsideOneDoesNothing) {
  RealTensorsScope real;
  EXPECT_EQ(torch::full({2}, 2.0).sum().item<float>(), 4.0f);
}

}  // namespace
}  // namespace darkformer
