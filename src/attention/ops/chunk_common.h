// What the chunked forms of the causal operator share (chunk loop, raw CPU kernel, recurrent
// step): the head layout, log-features of query and key blocks, [v, 1].
// Internal to src/attention/ops.
#pragma once

#include <torch/torch.h>

#include <limits>
#include <vector>

#include "attention/ops/feature_map.h"
#include "attention/positive_features.h"
#include "util/error.h"

namespace darkformer::causal_ops {

constexpr double kLog2E = 1.4426950408889634;  // log2(e)

struct Layout {
  int64_t batch, heads, kv_heads, group, key_heads, length, value_dim;
};

inline Layout MakeLayout(const torch::Tensor& x_BHLD, const torch::Tensor& y_BKLD, const torch::Tensor& v_BKLD,
                  const FeatureMap& map) {
  DF_CHECK(x_BHLD.dim() == 4 && y_BKLD.dim() == 4 && v_BKLD.dim() == 4,
           "FusedCausalLinearAttention: x, y, v must be 4-D, got " << x_BHLD.sizes() << ", " << y_BKLD.sizes()
                                                                   << ", " << v_BKLD.sizes());
  Layout l{x_BHLD.size(0), x_BHLD.size(1), y_BKLD.size(1), 1, 1, x_BHLD.size(2), v_BKLD.size(3)};
  DF_CHECK(l.heads % l.kv_heads == 0, "FusedCausalLinearAttention: " << l.heads << " query heads are not a multiple of "
                                                                     << l.kv_heads << " KV heads");
  DF_CHECK(y_BKLD.size(0) == l.batch && v_BKLD.size(0) == l.batch && v_BKLD.size(1) == l.kv_heads &&
               y_BKLD.size(2) == l.length && v_BKLD.size(2) == l.length && y_BKLD.size(3) == x_BHLD.size(3),
           "FusedCausalLinearAttention: shapes do not match: x " << x_BHLD.sizes() << ", y " << y_BKLD.sizes()
                                                                 << ", v " << v_BKLD.sizes());
  l.group = l.heads / l.kv_heads;
  l.key_heads = map.keys_per_query_head ? l.group : 1;
  return l;
}

// log phi of a query block x_BHCD, laid out per KV head: BKGCM.
inline torch::Tensor QueryLogFeatures(const FeatureMap& map, const std::vector<torch::Tensor>& params,
                               const torch::Tensor& x_BHCD, const Layout& l) {
  const auto lq_BHCM = map.log_features(x_BHCD, params, /*is_query=*/true);
  return lq_BHCM.view({l.batch, l.kv_heads, l.group, x_BHCD.size(2), lq_BHCM.size(-1)});
}

// log phi of a key block y_BKCD: BKFCM, computed once per KV head unless the map's parameters
// are per query head.
inline torch::Tensor KeyLogFeatures(const FeatureMap& map, const std::vector<torch::Tensor>& params,
                             const torch::Tensor& y_BKCD, const Layout& l) {
  if (l.key_heads == 1) return map.log_features(y_BKCD, params, /*is_query=*/false).unsqueeze(2);
  const int64_t c = y_BKCD.size(2), d = y_BKCD.size(3);
  const auto y_BHCD = y_BKCD.unsqueeze(2).expand({l.batch, l.kv_heads, l.group, c, d}).reshape({l.batch, l.heads, c, d});
  const auto lk_BHCM = map.log_features(y_BHCD, params, /*is_query=*/false);
  return lk_BHCM.view({l.batch, l.kv_heads, l.group, c, lk_BHCM.size(-1)});
}

// [v, 1] per KV head, broadcastable over the group: BK1CV.
inline torch::Tensor WithOnes(const torch::Tensor& v_BKCD) {
  return torch::cat({v_BKCD, torch::ones_like(v_BKCD.narrow(-1, 0, 1))}, -1).unsqueeze(2);
}

}  // namespace darkformer::causal_ops
