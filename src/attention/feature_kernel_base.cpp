// What every random-feature kernel shares (see feature_kernel_base.h).
#include "attention/feature_kernel_base.h"

namespace darkformer {

FeatureKernelOptions FeatureKernelOptions::Read(const ConfigReader& reader, bool with_redraw, bool with_op,
                                                int64_t default_features) {
  FeatureKernelOptions o;
  o.num_features = reader.Get<int64_t>("num_features", default_features,
                                      KeySpec("m, random features (trig and flexformer use 2m, slay n P m)").Above(0));
  o.projection = ParseProjectionKind(
      reader.Get<std::string>("projection", "orthogonal",
                              KeySpec("rows of W: orthogonal blocks with chi(d) row norms, or iid N(0, I)").OneOf({"orthogonal", "iid"})),
      reader.KeyPath("projection"));
  o.seed = reader.Get<int64_t>("seed", o.seed, "layer i draws from seed + 1000 i (+ 1000003 train.seed)");
  o.chunk_size = reader.Get<int64_t>("chunk_size", o.chunk_size, KeySpec("causal linear attention's chunk length").Above(0));
  // Without an operator (signed maps) neither key is read: RejectUnknown refuses them.
  if (with_op) {
    DF_CHECK(!(reader.Has("fused") && reader.Has("op")),
             "config keys '" << reader.KeyPath("fused") << "' and '" << reader.KeyPath("op")
                             << "' both set: `op` replaces `fused` (fused: false is op: naive); keep one");
    if (reader.Has("fused")) o.op = reader.Get<bool>("fused", true) ? CausalOp::kAuto : CausalOp::kNaive;
    o.op = ParseCausalOp(
        reader.Get<std::string>("op", CausalOpName(o.op),
                                KeySpec("causal form: auto = ops/causal_form.h (CPU: raw_cpu where it applies, else chunk_loop; CUDA: chunk_parallel)")
                                    .OneOf(CausalOpNames())),
        reader.KeyPath("op"));
    // op: cuda's own keys: another form would not read them, so a value there is refused.
    auto cuda_only = [&](const std::string& key, int64_t value, const std::string& otherwise) {
      DF_CHECK(value == 0 || o.op == CausalOp::kCuda,
               "config key '" << reader.KeyPath(key) << "' = " << value << ValueOrigin(reader.KeyPath(key), reader.node()[key])
                              << " applies to op: cuda only, and '" << reader.KeyPath("op") << "' is " << CausalOpName(o.op)
                              << ": set op: cuda, or drop " << key << " (" << otherwise << ")");
    };
    o.sub_chunk = reader.Get<int64_t>(
        "sub_chunk", o.sub_chunk,
        KeySpec("op: cuda's sub-chunk: the largest divisor of the chunk up to this many positions (pairs inside one: matrix products where they factor, see pairs); other forms refuse it")
            .Min(0, "0 = 8, the LibTorch forms' own"));
    cuda_only("sub_chunk", o.sub_chunk, "the LibTorch forms take 8, the raw CPU kernel 16");
    o.segment_chunks = reader.Get<int64_t>(
        "segment_chunks", o.segment_chunks,
        KeySpec("op: cuda's segment: each row walked in segments of this many chunks, whose states a call holds at once (more: fewer launches, more memory; at least a row's chunks: whole rows); other forms refuse it")
            .Min(0, "0 = what the device runs at once, evened over the row")
            .Resumable());  // the same bits in any segments (cuda_op_segment_test.cpp)
    cuda_only("segment_chunks", o.segment_chunks, "the other forms take no segments");
    const std::string pairs = reader.Get<std::string>(
        "pairs", "products",
        KeySpec("op: cuda's pairs inside a sub-chunk: products (matrix products on tensor cores where they factor: up to where a feature's max grows by 2^64 or a document starts) or exponentials (pair by pair throughout, the arithmetic the products replace); other forms refuse exponentials")
            .OneOf({"products", "exponentials"}));
    o.exponential_pairs = pairs == "exponentials";
    DF_CHECK(!o.exponential_pairs || o.op == CausalOp::kCuda,
             "config key '" << reader.KeyPath("pairs") << "' = exponentials" << ValueOrigin(reader.KeyPath("pairs"), reader.node()["pairs"])
                            << " applies to op: cuda only, and '" << reader.KeyPath("op") << "' is " << CausalOpName(o.op)
                            << ": set op: cuda, or drop pairs (the other forms take theirs their own way)");
    o.precompute_features = reader.Get<bool>(
        "precompute_features", false,
        "op: cuda's log-features: false, projected inside its launches where the scan can (positive features: O(L D) memory); true, one LibTorch product before each pass, held through it (about m fp32 more per position, query head and key row at D = m); other forms refuse true");
    DF_CHECK(!o.precompute_features || o.op == CausalOp::kCuda,
             "config key '" << reader.KeyPath("precompute_features") << "' = true"
                            << ValueOrigin(reader.KeyPath("precompute_features"), reader.node()["precompute_features"])
                            << " applies to op: cuda only, and '" << reader.KeyPath("op") << "' is " << CausalOpName(o.op)
                            << ": set op: cuda, or drop precompute_features (the other forms compute theirs up front)");
  }
  if (!with_redraw) return o;
  o.redraw = reader.GetEnum("redraw", o.redraw,
                             {{"never", RedrawPolicy::kNever},
                              {"every_step", RedrawPolicy::kEveryStep},
                              {"every_n", RedrawPolicy::kEveryN}},
                             "when the projections are drawn again (before a training step)");
  o.redraw_interval = reader.Get<int64_t>("redraw_interval", o.redraw_interval,
                                          KeySpec("steps each draw serves under every_n").Above(0));
  return o;
}

torch::Tensor SoftmaxKernelTarget(const torch::Tensor& x_BHPD, const torch::Tensor& y_BHPD) {
  return torch::exp((x_BHPD * y_BHPD).sum(-1).to(torch::kFloat64));
}

FeatureKernelBase::FeatureKernelBase(const KernelShape& shape, FeatureKernelOptions options)
    : shape_(shape), options_(options) {}

void FeatureKernelBase::RegisterDraw(int64_t dim) {
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  // Per-layer seeds differ so layers do not share draws.
  draw_seed_ = register_buffer("draw_seed", torch::tensor({KernelSeed(options_.seed, shape_)}, i64));
  draw_count_ = register_buffer("draw_count", torch::zeros({1}, i64));
  projection_ = register_buffer(
      "projection", DrawProjection(options_.projection, options_.num_features, dim, DrawSeed(KernelSeed(options_.seed, shape_), 0)));
}

int64_t FeatureKernelBase::draw_count() const { return draw_count_.defined() ? draw_count_.item<int64_t>() : 0; }

void FeatureKernelBase::Redraw() {
  if (!projection_.defined()) return;
  torch::NoGradGuard no_grad;
  // The draw is made on the host (the same values on every device): the seed and count come down
  // in one copy, the draw goes up from pinned memory without waiting, so a redraw on a GPU waits
  // for the device once.
  const auto seed_and_count = torch::cat({draw_seed_, draw_count_}).cpu();
  const auto seed = static_cast<uint64_t>(seed_and_count[0].item<int64_t>());
  const int64_t next = seed_and_count[1].item<int64_t>() + 1;
  auto w = DrawProjection(options_.projection, projection_.size(0), projection_.size(1), DrawSeed(seed, next))
               .to(projection_.scalar_type());
  if (projection_.is_cuda()) w = w.pin_memory();
  projection_.copy_(w, /*non_blocking=*/true);
  draw_count_.fill_(next);
}

void FeatureKernelBase::before_train_step(int64_t steps_done) {
  // The first step trains on the initial draw; every_n's draws then serve redraw_interval steps each.
  if (steps_done == 0) return;
  if (options_.redraw == RedrawPolicy::kEveryStep) Redraw();
  if (options_.redraw == RedrawPolicy::kEveryN && steps_done % options_.redraw_interval == 0) Redraw();
}

void FeatureKernelBase::to(torch::Dtype dtype, bool non_blocking) { ConvertState(std::nullopt, dtype, non_blocking); }

void FeatureKernelBase::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  ConvertState(device, dtype, non_blocking);
}

void FeatureKernelBase::ConvertState(const std::optional<torch::Device>& device, torch::Dtype dtype, bool non_blocking) {
  const auto target = dtype == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  auto convert = [&](const torch::Tensor& t) {
    const auto type = t.is_floating_point() ? target : t.scalar_type();
    return device ? t.to(*device, type, non_blocking) : t.to(type, non_blocking);
  };
  for (auto& p : named_parameters(/*recurse=*/false)) p->set_data(convert(*p));
  for (auto& b : named_buffers(/*recurse=*/false)) b->set_data(convert(*b));
}

}  // namespace darkformer
