// The baselines of 000 sec. 6: `random` (attention weights drawn uniformly at random over the
// allowed positions, then normalised; no dependence on q or k) and `constant` (equal weights over
// the allowed positions: the running mean of v).
#pragma once

#include "attention/attention_kernel.h"
#include "util/config_reader.h"

namespace darkformer {

class RandomKernelImpl : public AttentionKernelImpl {
 public:
  struct Options {
    int64_t seed = 0;
    static Options Read(const ConfigReader& reader);  // and refuses unknown keys
  };
  RandomKernelImpl(const KernelShape& shape, const Options& options);
  // Fresh weights each call: u_ij ~ U(0, 1) for allowed j, out_i = sum_j u_ij v_j / sum_j u_ij.
  // Row i uses only its own draws and v_{j <= i} (causal), but the B x H x L x L draw is O(L^2)
  // memory: acceptable for a baseline, not for long contexts.
  torch::Tensor forward(const torch::Tensor& q_BHLD, const torch::Tensor& k_BKLD, const torch::Tensor& v_BKLD,
                        const AttentionCall& call) override;
  std::vector<at::Generator> forward_generators() const override { return {generator_}; }
  // Packed documents: weights outside the query's document are zeroed before normalising.
  bool HandlesDocuments(const AttentionCall& /*call*/) const override { return true; }
  // Fresh weights over every earlier token for each new one, so the state is every v so far
  // (O(L) memory, like a KV cache): the definition needs them all.
  torch::Tensor Decode(std::unique_ptr<DecodeState>& state, const torch::Tensor& q_BHTD, const torch::Tensor& k_BKTD,
                       const torch::Tensor& v_BKTD, const AttentionCall& call) override;

 private:
  at::Generator generator_;  // CPU draws from options.seed (seed + 1000 * layer); CUDA uses its default
};
TORCH_MODULE(RandomKernel);

class ConstantKernelImpl : public AttentionKernelImpl {
 public:
  struct Options {  // none
    static Options Read(const ConfigReader& reader);  // refuses every key
  };
  ConstantKernelImpl(const KernelShape& shape, const Options& options);
  torch::Tensor forward(const torch::Tensor& q_BHLD, const torch::Tensor& k_BKLD, const torch::Tensor& v_BKLD,
                        const AttentionCall& call) override;
  // Packed documents: the running mean restarts per document (Attend runs one call per document).
  // The running sum of v (fp32) and the token count.
  torch::Tensor Decode(std::unique_ptr<DecodeState>& state, const torch::Tensor& q_BHTD, const torch::Tensor& k_BKTD,
                       const torch::Tensor& v_BKTD, const AttentionCall& call) override;
};
TORCH_MODULE(ConstantKernel);

}  // namespace darkformer
