// Shared machinery of the positive-random-feature kernels (performer, darkformer, lfk): their
// draw options, the registered draw state (so a checkpoint evaluates identically after reload),
// redraw policies, fp32 kernel state under low-precision models, and the forward pass
// x = sqrt(s) q, y = sqrt(s) k -> stabilised features -> chunked linear attention.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "attention/attention_kernel.h"
#include "attention/fused_causal_attention.h"
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
  // Causal path: the operator's form (ops/feature_map.h): auto (the device's), naive (the composite
  // reference), chunk_loop, chunk_parallel or raw_cpu. The old `fused: true|false` reads as auto|naive.
  CausalOp op = CausalOp::kAuto;

  // Reads the keys above; `with_redraw` false (trainable W) leaves redraw keys unknown.
  static FeatureKernelOptions Read(const ConfigReader& options, bool with_redraw);
};

class FeatureKernelBase : public AttentionKernelImpl {
 public:
  torch::Tensor forward(const torch::Tensor& q_BHLD, const torch::Tensor& k_BKLD, const torch::Tensor& v_BKLD,
                        const AttentionCall& call) override;
  void on_train_step(int64_t step) override;
  // The recurrent form (fused_causal_attention.h): running sums of phi(k) [v, 1]^T per KV head
  // with the causal-safe reference, fp32, no per-position storage. A first call with several
  // tokens (the prompt) runs forward()'s parallel path and keeps its final state.
  torch::Tensor Decode(std::unique_ptr<DecodeState>& state, const torch::Tensor& q_BHTD, const torch::Tensor& k_BKTD,
                       const torch::Tensor& v_BKTD, const AttentionCall& call) override;

  // Kernel state stays at least fp32 (fp64 when asked) whatever the model's dtype, and integer
  // buffers keep their type.
  using torch::nn::Module::to;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;

  // log phi(x) for x_BNLD already scaled by sqrt(s) (features in fp32 / fp64), computed from
  // `params` (the tensors FeatureParams() returns, or leaf copies of them): the kernel's gradient
  // path. N is the number of query heads, or of KV heads when the parameters are shared across
  // heads. is_query tells the two sides apart for kernels whose maps differ.
  virtual torch::Tensor LogFeaturesWith(const torch::Tensor& x_BNLD, const std::vector<torch::Tensor>& params,
                                        bool is_query) const = 0;
  virtual std::vector<torch::Tensor> FeatureParams() const = 0;
  // Whether key features depend on the query head (parameters per query head).
  virtual bool KeysPerQueryHead() const { return false; }
  // Which of FeatureParams() have one slice per query head along their first dimension.
  virtual std::vector<bool> FeatureParamsPerHead() const { return {}; }
  torch::Tensor LogFeatures(const torch::Tensor& x_BHLD, bool is_query = true) const {
    return LogFeaturesWith(x_BHLD, FeatureParams(), is_query);
  }
  // The map the fused operator and the recurrent step use.
  FeatureMap MakeFeatureMap() const;
  // Kernels whose log phi(x) is LogPositiveFeatures(x A^T, W) (performer, lfk: A = I; darkformer:
  // A = M) say so here; the causal path then applies A outside the fused operator (autograd
  // carries M's gradient) and the operator differentiates the features in closed form.
  struct PositiveFeatureForm {
    torch::Tensor input_map_NRD;  // A per query head (N = H) or shared (N = 1); undefined: identity
    torch::Tensor w_MR;           // W, shared across heads
  };
  virtual std::optional<PositiveFeatureForm> PositiveForm() const { return std::nullopt; }
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
  // The causal fused path of a PositiveForm() kernel.
  torch::Tensor ForwardPositiveFused(const PositiveFeatureForm& form, const torch::Tensor& q_BHLD,
                                     const torch::Tensor& k_BKLD, const torch::Tensor& v_BKLD, double root_scale) const;
  void ConvertState(const std::optional<torch::Device>& device, torch::Dtype dtype, bool non_blocking);
};

}  // namespace darkformer
