// DARKFormer `init: whitening` calibrates on each layer's real attention inputs (000 App. C):
// after the trainer's calibration, M whitens the calibration batch's scaled queries and keys,
// x = sqrt(s) q and y = sqrt(s) k after input_layernorm, norms and RoPE: Cov(M x) = I per head.
#include <gtest/gtest.h>

#include "attention/darkformer_kernel.h"
#include "data/data_test_util.h"
#include "train/tiny_run.h"
#include "train/trainer.h"

namespace darkformer {
namespace {

TEST(CalibrationTest, WhiteningMakesTheCalibrationBatchsScaledQueriesAndKeysIsotropic) {
  testing::TempDir dir;
  // One step at lr 1e-12 leaves every weight (M included) where calibration put it, to ~1e-12.
  const auto config = testing::TinyRunConfig(dir.path(), "darkformer",
                                             {"attention.darkformer.init=whitening", "train.steps=1",
                                              "train.lr=1.0e-12", "train.warmup_steps=0", "train.schedule=constant"});
  Trainer trainer(config);
  ASSERT_EQ(trainer.Run(), kExitOk);
  auto model = trainer.model();
  model->eval();
  torch::NoGradGuard no_grad;
  // The batch the trainer calibrated on: the first batch of a fresh training loader.
  PackedLoader loader(config.data, "train");
  const auto ids_BL = loader.Next().input_ids_BL;
  int64_t layers_checked = 0;
  model->ForEachAttentionInput(ids_BL, [&](const GemmaModelImpl::AttentionInput& in) {
    const auto* kernel = dynamic_cast<DarkformerKernelImpl*>(in.attention.kernel().get());
    ASSERT_NE(kernel, nullptr);
    const auto [q_BHLD, k_BHLD] = in.attention.QueriesKeys(in.h_BLE, in.rope);
    const double root = std::sqrt(in.attention.call().scale);
    const int64_t heads = q_BHLD.size(1), d = q_BHLD.size(3);
    const auto samples_HND = torch::cat({q_BHLD * root, k_BHLD * root}, 2).transpose(0, 1).reshape({heads, -1, d})
                                 .to(torch::kFloat64);
    const auto centred_HND = samples_HND - samples_HND.mean(1, true);
    const auto m_HRD = kernel->M.detach().to(torch::kFloat64);
    const auto white_HNR = torch::matmul(centred_HND, m_HRD.transpose(1, 2));
    const auto cov_HRR = torch::matmul(white_HNR.transpose(1, 2), white_HNR) / (samples_HND.size(1) - 1);
    const auto identity = torch::eye(m_HRD.size(1), torch::kFloat64).expand_as(cov_HRR);
    const double off = (cov_HRR - identity).abs().max().item<double>();
    EXPECT_LT(off, 1e-3) << "layer " << in.layer << ": Cov(M x) differs from I by " << off;
    // And M is not the identity it started as: these inputs are far from isotropic.
    EXPECT_GT((m_HRD - torch::eye(d, torch::kFloat64)).abs().max().item<double>(), 0.1) << "layer " << in.layer;
    ++layers_checked;
  });
  EXPECT_EQ(layers_checked, config.model.num_hidden_layers);
}

}  // namespace
}  // namespace darkformer
