// Shared machinery of the positive-random-feature kernels (performer, darkformer, lfk): their
// draw options, the registered draw state (so a checkpoint evaluates identically after reload),
// redraw policies, fp32 kernel state under low-precision models, and the forward pass
// x = sqrt(s) q, y = sqrt(s) k -> stabilised features -> chunked linear attention.
#pragma once

#include <string>

#include "attention/attention_kernel.h"
#include "attention/random_projection.h"
#include "util/config_reader.h"

namespace darkformer {

enum class RedrawPolicy { kNever, kEveryStep, kEveryN };

// Options every feature kernel reads from its YAML section. Defaults live here.
struct FeatureKernelOptions {
  int64_t num_features = 256;                              // m, random features per head
  ProjectionKind projection = ProjectionKind::kOrthogonal;  // orthogonal (chi row norms) | iid
  RedrawPolicy redraw = RedrawPolicy::kNever;              // never | every_step | every_n
  int64_t redraw_interval = 1000;                          // steps between redraws for every_n
  int64_t seed = 0;                                        // base seed; layer i draws from seed + 1000 i
  int64_t chunk_size = 64;                                 // causal linear attention chunk length

  // Reads the keys above; `with_redraw` false (trainable W) leaves redraw keys unknown.
  static FeatureKernelOptions Read(const ConfigReader& options, bool with_redraw);
};

class FeatureKernelBase : public AttentionKernelImpl {
 public:
  torch::Tensor forward(const torch::Tensor& q_BHLD, const torch::Tensor& k_BHLD, const torch::Tensor& v_BHLD,
                        const AttentionCall& call) override;
  void on_train_step(int64_t step) override;

  // Kernel state stays at least fp32 (fp64 when asked) whatever the model's dtype, and integer
  // buffers keep their type.
  using torch::nn::Module::to;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;

  // log phi(x) for x_BHLD already scaled by sqrt(s) (features in fp32 / fp64).
  virtual torch::Tensor LogFeatures(const torch::Tensor& x_BHLD) const = 0;
  double MaxLogFeature(const torch::Tensor& x_BHLD) const override {
    return LogFeatures(x_BHLD).max().item<double>();
  }

  const FeatureKernelOptions& options() const { return options_; }
  // The current draw w_MR (undefined for kernels without a drawn projection).
  const torch::Tensor& projection() const { return projection_; }
  int64_t draw_count() const;
  // Replaces the projection by the next draw (redraw policies call this).
  void Redraw();

 protected:
  FeatureKernelBase(const KernelShape& shape, FeatureKernelOptions options);
  // Registers `projection` (m x dim, fp32), `draw_seed` and `draw_count` (int64) and makes draw 0.
  void RegisterDraw(int64_t dim);

  KernelShape shape_;
  FeatureKernelOptions options_;
  torch::Tensor projection_, draw_seed_, draw_count_;

 private:
  void ConvertState(const std::optional<torch::Device>& device, torch::Dtype dtype, bool non_blocking);
};

}  // namespace darkformer
