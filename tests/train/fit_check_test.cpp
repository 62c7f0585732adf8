// The fit check's lower bound sizes one micro-batch as the loader and the memory estimate do:
// data.batch_size / devices rows, train.grad_accum of them one after another per step (issue 50).
#include <gtest/gtest.h>

#include "data/data_test_util.h"
#include "train/fit_check.h"
#include "train/memory_estimate.h"
#include "train/tiny_run.h"
#include "util/error.h"

namespace darkformer {
namespace {

long double ActivationBytes(const std::vector<SizeTerm>& terms) {
  long double bytes = 0;
  for (const auto& t : terms) bytes += t.activation ? t.Bytes() : 0;
  return bytes;
}

int64_t BatchFactor(const std::vector<SizeTerm>& terms) {
  for (const auto& t : terms) {
    for (const auto& [key, value] : t.factors) {
      if (key == "data.batch_size") return value;
    }
  }
  return 0;
}

TEST(FitCheck, GradAccumDoesNotShrinkTheMicroBatch) {
  testing::TempDir dir;
  constexpr int64_t kDevices = 2;
  const auto one = testing::TinyRunConfig(dir.File("run"), "darkformer", {"data.batch_size=8", "train.grad_accum=1"});
  const auto four = testing::TinyRunConfig(dir.File("run"), "darkformer", {"data.batch_size=8", "train.grad_accum=4"});
  const auto terms_one = LowerBoundTerms(one, Workload::kTrain, kDevices);
  const auto terms_four = LowerBoundTerms(four, Workload::kTrain, kDevices);
  // The activations and logits of one micro-batch: the same whatever grad_accum.
  EXPECT_GT(ActivationBytes(terms_one), 0);
  EXPECT_EQ(ActivationBytes(terms_four), ActivationBytes(terms_one));
  // The rows are the loader's (one rank of two) and the memory estimate's.
  auto rank = four.data;
  rank.world_size = kDevices;
  EXPECT_EQ(BatchFactor(terms_four), rank.LocalBatchSize());
  EXPECT_EQ(BatchFactor(terms_four), 4);
  EXPECT_EQ(BatchFactor(terms_four), EstimateTrainingMemory(four, {.devices = kDevices}).micro_batch_rows);
  // Ranks that cannot split the batch are refused naming the key, as the loader refuses them.
  try {
    LowerBoundTerms(four, Workload::kTrain, 3);
    FAIL() << "8 rows over 3 ranks were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.batch_size"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace darkformer
