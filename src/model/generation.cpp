// Prefill, then token-by-token decoding and sampling (see generation.h).
#include "model/generation.h"

#include <chrono>
#include <cmath>
#include <limits>

#include "util/error.h"

namespace darkformer {

void ValidateSampling(const SamplingOptions& o) {
  DF_CHECK(o.max_new_tokens > 0, "--max-new-tokens must be positive, got " << o.max_new_tokens);
  // As transformers' TemperatureLogitsWarper: 0 is refused; greedy decoding is its own option.
  DF_CHECK(std::isfinite(o.temperature) && o.temperature > 0,
           "--temperature must be a positive finite number, got " << o.temperature << " (for greedy decoding: --greedy)");
  DF_CHECK(o.top_k >= 0, "--top-k must be >= 0 (0 = off), got " << o.top_k);
  DF_CHECK(o.top_p > 0 && o.top_p <= 1, "--top-p must be in (0, 1], got " << o.top_p);
}

int64_t SampleToken(const torch::Tensor& logits_V, const SamplingOptions& o, at::Generator& generator) {
  const auto logits = logits_V.to(torch::kFloat64).cpu();
  if (o.greedy) return logits.argmax().item<int64_t>();
  // Shifted so the largest logit is 0 before dividing, in fp64: a tiny temperature (down to the
  // smallest positive double) sends every other logit to -inf and never overflows, so sampling
  // reaches its limit, greedy, instead of a softmax of inf - inf.
  auto scaled = (logits - logits.max()) / o.temperature;
  if (o.top_k > 0 && o.top_k < scaled.size(0)) {
    const auto kth = std::get<0>(scaled.topk(o.top_k)).min();
    scaled = scaled.masked_fill(scaled < kth, -std::numeric_limits<float>::infinity());
  }
  if (o.top_p < 1.0) {
    // Keep the most probable tokens until their mass reaches top_p (the first always stays).
    const auto [sorted, order] = scaled.sort(/*dim=*/0, /*descending=*/true);
    const auto cumulative = sorted.softmax(0).cumsum(0);
    const auto drop_sorted = (cumulative - sorted.softmax(0)) >= o.top_p;  // mass before it already enough
    scaled = scaled.index_fill(0, order.masked_select(drop_sorted), -std::numeric_limits<float>::infinity());
  }
  return at::multinomial(scaled.softmax(0), 1, /*replacement=*/false, generator).item<int64_t>();
}

GenerationResult Generate(GemmaModel& model, const std::vector<int64_t>& prompt, const SamplingOptions& o,
                          const std::function<void(int64_t)>& on_token) {
  ValidateSampling(o);
  DF_CHECK(!prompt.empty(), "generate: the prompt is empty (no tokens)");
  const int64_t limit = model->config().max_position_embeddings;
  DF_CHECK(static_cast<int64_t>(prompt.size()) < limit,
           "generate: the prompt has " << prompt.size() << " tokens; the model's max_position_embeddings is " << limit);
  torch::NoGradGuard no_grad;
  const auto device = model->embed_tokens->weight.device();
  // Checked: prompt + max_new_tokens may not fit int64 (--max-new-tokens near its maximum).
  const int64_t room = limit - static_cast<int64_t>(prompt.size());
  const int64_t capacity = static_cast<int64_t>(prompt.size()) + std::min(room, o.max_new_tokens);
  auto cache = model->NewDecodeCache(capacity, device);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  using Clock = std::chrono::steady_clock;
  auto ms_since = [](Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); };

  GenerationResult result;
  auto start = Clock::now();
  auto ids = torch::tensor(prompt, torch::kLong).unsqueeze(0).to(device);
  auto logits_BTV = model->ForwardDecode(ids, cache);
  result.prefill_ms = ms_since(start);
  start = Clock::now();
  while (true) {
    const int64_t token = SampleToken(logits_BTV[0][-1], o, generator);
    result.tokens.push_back(token);
    if (on_token) on_token(token);
    const bool done = token == o.eos_id || static_cast<int64_t>(result.tokens.size()) >= o.max_new_tokens ||
                      cache.tokens >= capacity;
    if (done) break;
    logits_BTV = model->ForwardDecode(torch::tensor({token}, torch::kLong).view({1, 1}).to(device), cache);
  }
  result.decode_ms = ms_since(start);
  return result;
}

}  // namespace darkformer
