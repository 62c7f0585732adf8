// Exact softmax attention: LibTorch's scaled_dot_product_attention where the layer allows it
// (no soft-cap), otherwise an explicit masked softmax in fp32.
#pragma once

#include "attention/attention_kernel.h"
#include "util/config_reader.h"

namespace darkformer {

// Boolean mask_LL (true = may attend) for causal and/or sliding-window attention.
torch::Tensor MakeAllowedMask(int64_t length, bool causal, int64_t sliding_window, const torch::Device& device);

class ExactKernelImpl : public AttentionKernelImpl {
 public:
  enum class Documents { kAuto, kMask, kPerDocument };
  struct Options {
    bool explicit_softmax = false;  // always take the fp32 path
    Documents documents = Documents::kAuto;
    static Options Read(const ConfigReader& reader);  // and refuses unknown keys
  };
  ExactKernelImpl(const KernelShape& shape, const Options& options);
  torch::Tensor forward(const torch::Tensor& q_BHLD, const torch::Tensor& k_BKLD,
                        const torch::Tensor& v_BKLD, const AttentionCall& call) override;
  // A KV cache of the KV heads (not repeated); sliding-window layers keep only the last
  // window - 1 tokens (all a later token can see); logits in fp32, soft-capped as in forward.
  torch::Tensor Decode(std::unique_ptr<DecodeState>& state, const torch::Tensor& q_BHTD, const torch::Tensor& k_BKTD,
                       const torch::Tensor& v_BKTD, const AttentionCall& call) override;
  bool supports_softcap() const override { return true; }
  bool supports_sliding_window() const override { return true; }
  bool autocast_inside() const override { return true; }
  // Packed documents (options.documents): a block-diagonal causal mask in one call (`mask`), or
  // one call per document (`per_document`, Attend). `auto` calls per document on every device:
  // the masked SDPA costs about 2x the unmasked one on a CPU and on an H200, per-document calls
  // 0.4-1.0x (kernel-check --bench-documents; docs/data.md).
  bool HandlesDocuments(const AttentionCall&) const override { return documents_ == Documents::kMask; }
  ShadowAttention ShadowForward(shadow::Tape& tape, const ShadowAttentionCall& call, const shadow::Shadow& q,
                                const shadow::Shadow& k, const shadow::Shadow& v) const override;

  // Largest |logit| of the last forward (for spike diagnostics); -1 when not tracked.
  double last_max_logit = -1.0;

 private:
  bool force_explicit_;  // options.explicit_softmax
  Documents documents_;
};
TORCH_MODULE(ExactKernel);

}  // namespace darkformer
