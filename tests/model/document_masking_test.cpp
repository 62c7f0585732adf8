// The model with data.document_masking: in a packed row [document A, EOS, document B], B's logits
// equal those of B run alone when RoPE positions restart per document (and differ from the
// unmasked row's), for exact and feature kernels, with and without activation checkpointing; A's
// logits never depend on B (causal anyway) and B's never on A. Masking off leaves the model as it was.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tiny_gemma.h"

namespace darkformer {
namespace {

constexpr int64_t kEos = 1;

double RelativeError(const torch::Tensor& a, const torch::Tensor& b) {
  const auto b64 = b.to(torch::kFloat64);
  return ((a.to(torch::kFloat64) - b64).abs().max() / b64.abs().max().clamp_min(1e-30)).item<double>();
}

GemmaModel Tiny(const std::string& kernel) {
  torch::manual_seed(3);
  GemmaModel model(testing::TinyGemmaConfig(2), testing::TinyAttentionConfig(kernel, 2));
  model->InitializeWeights(0.2, 4);
  return model;
}

struct Rows {
  torch::Tensor packed, b_alone;
  int64_t b_start;
};
Rows MakeRows() {
  torch::manual_seed(9);
  const auto a = torch::randint(2, 96, {1, 13}, torch::kLong), b = torch::randint(2, 96, {1, 19}, torch::kLong);
  return {torch::cat({a, torch::full({1, 1}, kEos, torch::kLong), b}, 1), b, 14};
}

class DocumentMaskingModelTest : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(Kernels, DocumentMaskingModelTest, ::testing::Values("exact", "performer", "darkformer"),
                         [](const auto& info) { return info.param; });

TEST_P(DocumentMaskingModelTest, TheSecondDocumentSeesOnlyItselfWithRestartedPositions) {
  auto model = Tiny(GetParam());
  const auto rows = MakeRows();
  torch::NoGradGuard no_grad;
  const auto alone = model->forward(rows.b_alone);
  const auto unmasked = model->forward(rows.packed);
  for (const bool checkpointing : {false, true}) {
    model->SetActivationCheckpointing(checkpointing);
    model->SetDocumentMasking({kEos, /*restart_positions=*/true});
    const auto masked = model->forward(rows.packed);
    model->SetDocumentMasking({});
    const auto b = masked.narrow(1, rows.b_start, rows.b_alone.size(1));
    EXPECT_LE(RelativeError(b, alone), 1e-5) << GetParam() << " checkpointing " << checkpointing;
    EXPECT_GT(RelativeError(unmasked.narrow(1, rows.b_start, rows.b_alone.size(1)), alone), 1e-3) << GetParam();
    // Before B nothing changes: the masked and unmasked rows agree on A and its EOS.
    EXPECT_LE(RelativeError(masked.narrow(1, 0, rows.b_start), unmasked.narrow(1, 0, rows.b_start)), 1e-6);
  }
}

// Gradients through the packed row equal those of the documents run alone (restarted positions):
// a loss on B's positions only; A's positions then feed nothing it reads (the tied embedding's
// gradient comes from the LM head and B's own tokens, as alone).
TEST_P(DocumentMaskingModelTest, GradientsOfThePackedRowEqualThoseOfTheDocumentAlone) {
  auto model = Tiny(GetParam());
  const auto rows = MakeRows();
  auto grads = [&](const torch::Tensor& ids, int64_t first) {
    model->zero_grad();
    const auto logits = model->forward(ids);
    logits.narrow(1, first, rows.b_alone.size(1)).pow(2).mean().backward();
    std::vector<torch::Tensor> g;
    for (const auto& p : model->parameters()) g.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
    return g;
  };
  const auto alone = grads(rows.b_alone, 0);
  model->SetDocumentMasking({kEos, true});
  const auto packed = grads(rows.packed, rows.b_start);
  ASSERT_EQ(alone.size(), packed.size());
  for (size_t i = 0; i < alone.size(); ++i) {
    if (alone[i].abs().max().item<double>() == 0.0) continue;
    EXPECT_LE(RelativeError(packed[i], alone[i]), 1e-5) << GetParam() << " parameter " << i;
  }
}

// Continued positions: the masked row's B equals B alone shifted by 14 positions for exact
// attention (RoPE is relative in softmax's logits), to fp32 rounding.
TEST(DocumentMaskingModel, ExactAttentionWithContinuedPositionsIsShiftInvariant) {
  auto model = Tiny("exact");
  const auto rows = MakeRows();
  torch::NoGradGuard no_grad;
  const auto alone = model->forward(rows.b_alone);
  model->SetDocumentMasking({kEos, /*restart_positions=*/false});
  const auto b = model->forward(rows.packed).narrow(1, rows.b_start, rows.b_alone.size(1));
  EXPECT_LE(RelativeError(b, alone), 1e-4);
}

}  // namespace
}  // namespace darkformer
