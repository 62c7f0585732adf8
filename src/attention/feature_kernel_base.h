// What every random-feature kernel shares: its draw options, the registered draw state (so a
// checkpoint evaluates identically after reload), redraw policies, fp32 kernel state under
// low-precision models, and what kernel-check asks of a feature map (phi(x).phi(y) and the kernel
// value it estimates). A kernel is its feature map, of one of two families:
// - log_feature_kernel.h: positive features given as log phi (performer, darkformer, lfk, gerf,
//   saderf); they run the fused causal operator;
// - signed_feature_kernel.h: phi = exp(c) f with f signed (trig, slay, flexformer); composite path.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "attention/attention_kernel.h"
#include "attention/ops/feature_map.h"
#include "attention/random_projection.h"
#include "util/config_reader.h"

namespace darkformer {

enum class RedrawPolicy { kNever, kEveryStep, kEveryN };

// Options every feature kernel reads from its YAML section. Defaults live here.
struct FeatureKernelOptions {
  static constexpr int64_t kDefaultFeatures = 256;
  int64_t num_features = kDefaultFeatures;                 // m, random features per head
  ProjectionKind projection = ProjectionKind::kOrthogonal;  // orthogonal (chi row norms) | iid
  RedrawPolicy redraw = RedrawPolicy::kNever;              // never | every_step | every_n
  int64_t redraw_interval = 1000;                          // steps between redraws for every_n
  int64_t seed = 0;                                        // base seed; layer i draws from seed + 1000 i
  int64_t chunk_size = 64;                                 // causal linear attention chunk length
  // Causal path: the operator's form (ops/feature_map.h): auto (the device's), naive (the composite
  // reference), chunk_loop, chunk_parallel or raw_cpu. The old `fused: true|false` reads as auto|naive.
  CausalOp op = CausalOp::kAuto;
  // op: cuda's sub-chunk (cuda_op_launch.h's ChunkingFor): at most this many positions, the largest
  // divisor of the chunk; 0: causal_ops::kMaxSubChunk, as the LibTorch forms take it. Other forms
  // refuse it (their memory grows with it; the raw CPU kernel's is its own).
  int64_t sub_chunk = 0;
  // op: cuda's segment (cuda_op_launch.h's SegmentChunks): each row walked in segments of this many
  // chunks, whose states a call holds at once; 0: at most what the device runs at once, evened
  // over the row (EvenSegment). Other forms refuse it.
  int64_t segment_chunks = 0;
  // op: cuda's pairs inside a sub-chunk (`pairs`): false (products), as matrix products where they
  // factor (cuda_scan_body.h's FactoredQueries); true (exponentials), pair by pair throughout, the
  // arithmetic the products replace. Other forms refuse exponentials.
  bool exponential_pairs = false;
  // op: cuda's log-features (`precompute_features`): false, projected inside its launches one
  // sub-chunk at a time wherever the scan can (positive features, fp32 or bf16 inputs); true, by
  // one LibTorch product before each pass, held through it. Other forms refuse true.
  bool precompute_features = false;

  // Reads the keys above; `with_redraw` false (trainable W) leaves redraw keys unknown, and
  // `with_op` false (signed features: one composite path) leaves `op`, `fused`, `sub_chunk`,
  // `segment_chunks`, `pairs` and `precompute_features` unknown keys.
  // `default_features`: num_features when absent (SLAY's is smaller), recorded as the default.
  static FeatureKernelOptions Read(const ConfigReader& options, bool with_redraw, bool with_op,
                                   int64_t default_features = kDefaultFeatures);
};

// exp(x.y) per pair of rows of x_BHPD and y_BHPD, in fp64: BHP. The softmax kernel most maps estimate.
torch::Tensor SoftmaxKernelTarget(const torch::Tensor& x_BHPD, const torch::Tensor& y_BHPD);

// How a feature kernel's forward runs, as its shadow needs it (feature_kernel_shadow.cpp).
struct FeatureShadowForm {
  bool causal_operator = false;  // runs the causal operator (ops/) in the form `op` picks
  bool positive = false;         // ... the fused positive-feature form (LogFeatureKernel::PositiveForm)
  int64_t features = 0;          // m
  int64_t rank = 0;              // width of the input map's output, M q (darkformer); 0: head_dim
  int64_t map_heads = 0;         // heads of the input map: H per head, 1 shared, 0 none
  bool projection_trains = false;  // W takes a gradient (LFK): op: cuda then takes the queries' features whole
};

// What random-feature attention saves for its backward (x, y and v in fp32, the output, the
// normaliser; the raw CPU kernel's checkpoints of the state), and its backward's widest extra
// (the chunk-parallel form holds whole-sequence terms).
ShadowAttention ShadowFeatureAttention(shadow::Tape& tape, const ShadowAttentionCall& call, const shadow::Shadow& q,
                                       const shadow::Shadow& k, const shadow::Shadow& v, const FeatureShadowForm& form,
                                       const FeatureKernelOptions& options, bool parameters_train);

class FeatureKernelBase : public AttentionKernelImpl {
 public:
  void before_train_step(int64_t steps_done) override;

  // Kernel state stays at least fp32 (fp64 when asked) whatever the model's dtype, and integer
  // buffers keep their type.
  using torch::nn::Module::to;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;

  // phi(x).phi(y) with every exp(.) factor, for pairs (x_p, y_p) of x_BHPD, y_BHPD already scaled
  // by sqrt(s) (H = the kernel's heads): BHP. One draw's estimate of EstimatorTarget.
  virtual torch::Tensor PairEstimate(const torch::Tensor& x_BHPD, const torch::Tensor& y_BHPD) const = 0;
  // What PairEstimate is unbiased for (trainable maps: at their initial values), in fp64: BHP.
  // Parameters held per head are taken from head 0, so every head gets head 0's target.
  virtual torch::Tensor EstimatorTarget(const torch::Tensor& x_BHPD, const torch::Tensor& y_BHPD) const = 0;

  const FeatureKernelOptions& options() const { return options_; }
  // The current draw w_MR (undefined for kernels without a drawn projection).
  const torch::Tensor& projection() const { return projection_; }
  int64_t draw_count() const;
  // Replaces the projection by the next draw (redraw policies call this).
  void Redraw();
  // The composite path's shadow: features of q and k in fp32, no causal operator.
  ShadowAttention ShadowForward(shadow::Tape& tape, const ShadowAttentionCall& call, const shadow::Shadow& q,
                                const shadow::Shadow& k, const shadow::Shadow& v) const override;
  // Whether any of the kernel's own parameters trains (requires_grad).
  bool ParametersTrain() const;

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
