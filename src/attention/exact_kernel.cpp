// Exact softmax attention (see exact_kernel.h).
#include "attention/exact_kernel.h"

#include "attention/document_mask.h"
#include "attention/kernel_registry.h"

namespace darkformer {

torch::Tensor MakeAllowedMask(int64_t length, bool causal, int64_t sliding_window, const torch::Device& device) {
  const auto idx = torch::arange(length, torch::TensorOptions().dtype(torch::kLong).device(device));
  const auto diff_LL = idx.unsqueeze(1) - idx.unsqueeze(0);  // i - j
  auto allowed = torch::ones({length, length}, torch::TensorOptions().dtype(torch::kBool).device(device));
  if (causal) allowed = allowed & (diff_LL >= 0);
  // HF semantics: a sliding layer sees keys with i - j < window (the current token included).
  if (sliding_window > 0) allowed = allowed & (diff_LL < sliding_window) & (diff_LL > -sliding_window);
  return allowed;
}

ExactKernelImpl::Options ExactKernelImpl::Options::Read(const ConfigReader& reader) {
  Options o;
  o.explicit_softmax = reader.Get<bool>("explicit_softmax", o.explicit_softmax, "always the fp32 masked softmax instead of SDPA");
  o.documents = reader.GetEnum("documents", o.documents,
                               {{"auto", Documents::kAuto}, {"mask", Documents::kMask}, {"per_document", Documents::kPerDocument}},
                               "data.document_masking: one masked call, or one call per document (auto: per_document)");
  reader.RejectUnknown();
  return o;
}

ExactKernelImpl::ExactKernelImpl(const KernelShape& /*shape*/, const Options& options)
    : force_explicit_(options.explicit_softmax), documents_(options.documents) {}

torch::Tensor ExactKernelImpl::forward(const torch::Tensor& q_BHLD, const torch::Tensor& k_BKLD,
                                       const torch::Tensor& v_BKLD, const AttentionCall& call) {
  const auto k_BHLD = RepeatKvHeads(k_BKLD, q_BHLD.size(1));
  const auto v_BHLD = RepeatKvHeads(v_BKLD, q_BHLD.size(1));
  const int64_t length = q_BHLD.size(2);
  const bool documents = call.document_ids_BL.defined();
  // Allowed pairs: L x L, or B x 1 x L x L with packed documents (block-diagonal).
  auto allowed_mask = [&] {
    const auto allowed = MakeAllowedMask(length, call.causal, call.sliding_window, q_BHLD.device());
    return documents ? SameDocument(call.document_ids_BL.to(q_BHLD.device())) & allowed : allowed;
  };
  if (call.softcap <= 0.0 && !force_explicit_) {
    if (!documents && (call.sliding_window <= 0 || call.sliding_window >= length)) {
      return at::scaled_dot_product_attention(q_BHLD, k_BHLD, v_BHLD, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                              /*is_causal=*/call.causal, /*scale=*/call.scale);
    }
    return at::scaled_dot_product_attention(q_BHLD, k_BHLD, v_BHLD, allowed_mask(), 0.0, false, call.scale);
  }
  // Soft-capped logits (Gemma 2): softcap * tanh(s q.k / softcap), softmax in fp32.
  auto logits_BHLL = torch::matmul(q_BHLD.to(torch::kFloat32), k_BHLD.to(torch::kFloat32).transpose(-1, -2)) * call.scale;
  if (call.softcap > 0.0) logits_BHLL = torch::tanh(logits_BHLL / call.softcap) * call.softcap;
  logits_BHLL = logits_BHLL.masked_fill(allowed_mask().logical_not(), -std::numeric_limits<float>::infinity());
  const auto weights_BHLL = torch::softmax(logits_BHLL, -1).to(v_BHLD.scalar_type());
  return torch::matmul(weights_BHLL, v_BHLD);
}

ShadowAttention ShadowSdpa(shadow::Tape& tape, const ShadowAttentionCall& c, const shadow::Shadow& q,
                           const shadow::Shadow& key, const shadow::Shadow& v, bool saves_mask) {
  using shadow::kBf16;
  using shadow::kF32;
  using shadow::Shadow;
  const int64_t B = c.batch, L = c.length, T = B * L, H = c.heads, D = c.head_dim;
  ShadowAttention r;
  r.backward_bytes = 3 * T * H * D * kF32;  // dq, dk, dv
  // SDPA under the caller's autocast; k, v repeated to H heads for grouped / multi-query.
  const Shadow kr = c.key_heads == H ? key : tape.New(T * H * D, key.esz, key.rg);
  const Shadow vr = c.key_heads == H ? v : tape.New(T * H * D, v.esz, v.rg);
  const bool rg = q.rg || kr.rg || vr.rg;
  if (c.softcap > 0) {  // the explicit path: B H L L logits and weights
    const Shadow logits = tape.New(B * H * L * L, kF32, rg);
    const Shadow weights = tape.New(B * H * L * L, kF32, rg);
    if (rg) {
      tape.Save(tape.To(q, kF32));
      tape.Save(tape.To(kr, kF32));
      tape.Save(logits);
      tape.Save(weights);
      tape.Save(vr);
      if (tape.bf16()) tape.Save(tape.New(B * H * L * L, kBf16, true));
    }
    r.out = tape.New(T * H * D, v.esz, rg);
    return r;
  }
  r.out = tape.New(T * H * D, q.esz, rg);
  if (rg) {
    tape.Save(q);
    tape.Save(kr);
    tape.Save(vr);
    tape.Save(r.out);
    tape.Save(tape.New(T * H, kF32, true));  // logsumexp
    if (saves_mask) {
      // The block-diagonal mask (bool), and SDPA's additive copy of it in q's dtype, both saved.
      tape.Save(tape.New(B * L * L, 1, true));
      tape.Save(tape.New(B * L * L, q.esz, true));
    }
  }
  return r;
}

ShadowAttention ExactKernelImpl::ShadowForward(shadow::Tape& tape, const ShadowAttentionCall& call,
                                               const shadow::Shadow& q, const shadow::Shadow& k,
                                               const shadow::Shadow& v) const {
  // Packed documents: one masked call (`mask`); auto and per_document call once per document.
  return ShadowSdpa(tape, call, q, k, v, call.documents && documents_ == Documents::kMask);
}

namespace {

struct KvCache : DecodeState {
  torch::Tensor k_BKSD, v_BKSD;  // the cached tokens: positions tokens - S ... tokens - 1
  int64_t Bytes() const override { return NbytesOrZero(k_BKSD) + NbytesOrZero(v_BKSD); }
};

}  // namespace

torch::Tensor ExactKernelImpl::Decode(std::unique_ptr<DecodeState>& state, const torch::Tensor& q_BHTD,
                                      const torch::Tensor& k_BKTD, const torch::Tensor& v_BKTD,
                                      const AttentionCall& call) {
  if (!state) state = std::make_unique<KvCache>();
  auto& cache = dynamic_cast<KvCache&>(*state);
  if (cache.tokens == 0 && q_BHTD.size(2) > 1) {
    // Prompt: forward()'s own path (SDPA where it applies: no T x T logits held), then the cache.
    AttentionCall causal = call;
    causal.causal = true;
    const auto out_BHTD = forward(q_BHTD, k_BKTD, v_BKTD, causal);
    const int64_t length = k_BKTD.size(2);
    const int64_t keep = call.sliding_window > 0 ? std::min(length, call.sliding_window - 1) : length;
    cache.k_BKSD = k_BKTD.narrow(2, length - keep, keep).contiguous();
    cache.v_BKSD = v_BKTD.narrow(2, length - keep, keep).contiguous();
    cache.tokens = length;
    return out_BHTD;
  }
  const int64_t batch = q_BHTD.size(0), heads = q_BHTD.size(1), new_tokens = q_BHTD.size(2), d = q_BHTD.size(3);
  const int64_t kv_heads = k_BKTD.size(1), group = heads / kv_heads;
  const auto k_BKSD = cache.k_BKSD.defined() ? torch::cat({cache.k_BKSD, k_BKTD}, 2) : k_BKTD;
  const auto v_BKSD = cache.v_BKSD.defined() ? torch::cat({cache.v_BKSD, v_BKTD}, 2) : v_BKTD;
  const int64_t keys = k_BKSD.size(2), first_key = cache.tokens + new_tokens - keys;
  // Query head h reads KV head h / G: group the queries instead of repeating the cache.
  const auto q_BKGTD = q_BHTD.to(torch::kFloat32).view({batch, kv_heads, group, new_tokens, d});
  auto logits_BKGTS = torch::matmul(q_BKGTD, k_BKSD.to(torch::kFloat32).unsqueeze(2).transpose(-1, -2)) * call.scale;
  if (call.softcap > 0.0) logits_BKGTS = torch::tanh(logits_BKGTS / call.softcap) * call.softcap;
  const auto opts = torch::TensorOptions().dtype(torch::kLong).device(q_BHTD.device());
  const auto query_pos_T1 = torch::arange(cache.tokens, cache.tokens + new_tokens, opts).unsqueeze(1);
  const auto diff_TS = query_pos_T1 - torch::arange(first_key, first_key + keys, opts).unsqueeze(0);  // i - j
  auto allowed_TS = diff_TS >= 0;
  if (call.sliding_window > 0) allowed_TS = allowed_TS & (diff_TS < call.sliding_window);
  logits_BKGTS = logits_BKGTS.masked_fill(allowed_TS.logical_not(), -std::numeric_limits<float>::infinity());
  const auto weights_BKGTS = torch::softmax(logits_BKGTS, -1);
  const auto out_BKGTD = torch::matmul(weights_BKGTS, v_BKSD.to(torch::kFloat32).unsqueeze(2));
  // A later token at position p sees keys p - window + 1 ... p: the last window - 1 cached ones.
  const int64_t keep = call.sliding_window > 0 ? std::min(keys, call.sliding_window - 1) : keys;
  cache.k_BKSD = k_BKSD.narrow(2, keys - keep, keep);
  cache.v_BKSD = v_BKSD.narrow(2, keys - keep, keep);
  if (keep < keys) {  // drop the storage of the trimmed tokens
    cache.k_BKSD = cache.k_BKSD.contiguous();
    cache.v_BKSD = cache.v_BKSD.contiguous();
  }
  cache.tokens += new_tokens;
  return out_BKGTD.reshape({batch, heads, new_tokens, d}).to(v_BKTD.scalar_type());
}

// Its registration (kernel_registry.h): the name, the row in the tables, the config section's doc.
namespace {
[[maybe_unused]] const bool kRegistered = RegisterKernel<ExactKernel>(
    "exact", 0, "softmax attention (SDPA, or the fp32 masked softmax)");
}  // namespace

}  // namespace darkformer
