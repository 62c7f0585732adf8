// The one rule of `op: auto` (ops/causal_form.h), which the operator and the memory estimate ask.
#include <gtest/gtest.h>

#include "attention/ops/causal_form.h"

namespace darkformer {
namespace {

TEST(CausalForm, NamedFormsAreThemselves) {
  for (const bool cpu : {true, false}) {
    for (const bool raw : {true, false}) {
      for (const bool documents : {true, false}) {
        EXPECT_EQ(ResolveCausalForm(CausalOp::kChunkParallel, cpu, raw, documents), CausalForm::kChunkParallel);
        EXPECT_EQ(ResolveCausalForm(CausalOp::kChunkLoop, cpu, raw, documents), CausalForm::kChunkLoop);
        EXPECT_EQ(ResolveCausalForm(CausalOp::kRawCpu, cpu, raw, documents), CausalForm::kRawCpu);
      }
    }
  }
}

TEST(CausalForm, AutoByDeviceFeaturesAndDocuments) {
  const auto autoform = [](bool cpu, bool raw, bool documents) { return ResolveCausalForm(CausalOp::kAuto, cpu, raw, documents); };
  EXPECT_EQ(autoform(false, false, false), CausalForm::kChunkParallel);  // a GPU
  EXPECT_EQ(autoform(false, false, true), CausalForm::kChunkParallel);
  EXPECT_EQ(autoform(true, true, false), CausalForm::kRawCpu);           // positive features in fp32 on a CPU
  EXPECT_EQ(autoform(true, true, true), CausalForm::kRawCpu);            // it scans each document alone
  EXPECT_EQ(autoform(true, false, false), CausalForm::kChunkLoop);       // e.g. bf16 or fp64 on a CPU
  EXPECT_EQ(autoform(true, false, true), CausalForm::kChunkParallel);    // masked in one call, not a loop per document
}

}  // namespace
}  // namespace darkformer
