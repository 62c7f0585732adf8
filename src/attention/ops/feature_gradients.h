// The features' side of the whole-sequence forms (chunk_parallel.h, cuda_op.h): key rows, the
// log-features of queries and keys up to what cancels, and the gradients through the map given
// d log phi.
#pragma once

#include <torch/torch.h>

#include <utility>
#include <vector>

#include "attention/ops/feature_map.h"

namespace darkformer::causal_ops {

// Keys (and values) B x K x L x X per key row: as given (rows = K), or repeated per query head.
torch::Tensor PerRow(const torch::Tensor& t_BKLX, int64_t rows);
// A gradient per key row back to the K heads it was repeated from: each KV head's is its group's sum.
torch::Tensor PerKvHead(const torch::Tensor& t_BRLX, int64_t kv_heads);

// Whether the features read mapped inputs (FeatureMap::input_map, input_scale).
bool MapsInputs(const FeatureMap& map);
// The input the features read, in `dtype`: x A, or input_scale x (FeatureMap); x where the map maps
// nothing. Under autograd when grad mode is on.
torch::Tensor MappedInput(const FeatureMap& map, const std::vector<torch::Tensor>& p, const torch::Tensor& x,
                          torch::ScalarType dtype);
// Both sides, queries x (B x H x L x D) and key rows y, each in its own dtype.
std::pair<torch::Tensor, torch::Tensor> MappedInputs(const FeatureMap& map, const std::vector<torch::Tensor>& p,
                                                     const torch::Tensor& x, const torch::Tensor& y);
// The map that reads the mapped inputs themselves: params[0] only, nothing mapped.
FeatureMap WithoutInputMap(const FeatureMap& map);

// log phi of queries x (B x H x L x D) and key rows y (B x R x L x D), up to what cancels, the
// inputs mapped first (MappedInput). Positive features (x W^T - |x|^2/2 - log(m)/2) skip the
// query's -|x|^2/2 (a shift of all of a query's arguments, s_t's included) and everyone's
// -log(m)/2 (every key's: R and s shift with it).
std::pair<torch::Tensor, torch::Tensor> LogFeatures(const FeatureMap& map, const std::vector<torch::Tensor>& p,
                                                    const torch::Tensor& x, const torch::Tensor& y);
// One side of it (queries or key rows), computed in `dtype` from the input as given: its converted
// and mapped copies are freed on return.
torch::Tensor SideLogFeatures(const FeatureMap& map, const std::vector<torch::Tensor>& p, const torch::Tensor& in,
                              torch::ScalarType dtype, bool is_query);

// dL/dx, dL/dy and the parameter gradients through the features (and the inputs' map), given
// d log phi of every query and key position: in closed form for positive features, else the map's
// own backward over the whole sequence. x and y may come in another dtype than the gradients
// (op: cuda passes the bf16 inputs it saved): they are converted to it.
struct FeatureGrads {
  torch::Tensor dx, dy;
  std::vector<torch::Tensor> params;
};
// The feature gradients come by value: a caller that moves them in has them freed as soon as
// they are used.
FeatureGrads FeatureBackward(const FeatureMap& map, const std::vector<torch::Tensor>& p, const torch::Tensor& x,
                             const torch::Tensor& y, torch::Tensor dlq_BHLM, torch::Tensor dlk_BRLM);
// The same where the queries' gradient comes at their mapped input x' (x A, or input_scale x;
// B x H x L x R): op: cuda projects the queries' features itself (cuda_scan_queries.h). Positive
// features whose W takes no gradient only. y may be the keys as given (B x K x L x D) where the key
// rows repeat them per query head: dy then comes per KV head, without repeating them. dx comes in
// x's dtype (autograd's conversion, the same bits), made so before the keys' side runs: a 16-bit
// x's fp32 dx is not held through it.
FeatureGrads FeatureBackwardFromMappedQueries(const FeatureMap& map, const std::vector<torch::Tensor>& p,
                                              const torch::Tensor& x, const torch::Tensor& y, torch::Tensor dxq_BHLR,
                                              torch::Tensor dlk_BRLM);

}  // namespace darkformer::causal_ops
