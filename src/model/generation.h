// Text generation with a GemmaModel: prefill the prompt in one parallel pass, then decode one
// token at a time from each layer's incremental state (KV cache for exact attention, running
// sums for random-feature kernels; AttentionKernelImpl::Decode), sampling each next token.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "model/gemma_model.h"

namespace darkformer {

struct SamplingOptions {
  int64_t max_new_tokens = 64;
  bool greedy = false;       // argmax; temperature, top_k and top_p are then ignored
  double temperature = 1.0;  // > 0
  int64_t top_k = 0;         // 0: no top-k cut
  double top_p = 1.0;        // nucleus: the smallest set of tokens whose probability reaches top_p
  uint64_t seed = 0;
  int64_t eos_id = -1;       // stop after producing it; -1: never stop early
};

// Checks the options' ranges; throws darkformer::Error naming the flag.
void ValidateSampling(const SamplingOptions& options);

// The next token from logits_V (one position's logits), by the options; `generator` draws.
int64_t SampleToken(const torch::Tensor& logits_V, const SamplingOptions& options, at::Generator& generator);

struct GenerationResult {
  std::vector<int64_t> tokens;  // the new tokens (EOS included when it ended the generation)
  double prefill_ms = 0.0, decode_ms = 0.0;
};

// Generates from one prompt (token ids, BOS included when the model wants one); on_token is called
// with each new token as soon as it is chosen. The prompt plus the new tokens must fit in the
// model's max_position_embeddings.
GenerationResult Generate(GemmaModel& model, const std::vector<int64_t>& prompt, const SamplingOptions& options,
                          const std::function<void(int64_t)>& on_token = {});

}  // namespace darkformer
