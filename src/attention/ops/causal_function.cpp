// The causal operator's autograd function and its entry point (see causal_function.h): the batch
// folded into the heads, key rows split into units among threads, each unit through the chunk
// loop or the raw CPU kernel; the chunk-parallel form is its own function (chunk_parallel.h).
#include "attention/ops/causal_function.h"

#include "attention/document_mask.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include <algorithm>

#include "attention/ops/causal_form.h"
#include "attention/ops/chunk_loop.h"
#include "attention/ops/chunk_parallel.h"
#include "attention/ops/dtype_probe.h"
#include "attention/ops/cuda_op.h"
#include "attention/ops/feature_gradients.h"
#include "attention/ops/fp32_products.h"
#include "attention/ops/raw_cpu.h"
#include "attention/ops/raw_cpu_kernel.h"
#include "attention/ops/saved_bytes.h"
#include "attention/positive_features.h"
#include "util/mixed_precision.h"

namespace darkformer {

namespace {

using namespace causal_ops;

// Units of work. The batch is folded into the heads (FoldBatch below), so a key row is a KV head
// of one sequence whose key features the group shares, or a query head when key features are per
// query head (then y and v are repeated per query head and each row's group is that one head).
// Rows are independent: a unit is a block of rows scanned by one thread, each op of it covering
// all its rows at once (per-op overhead dominates at chunk scale). On the CPU there are at least
// as many blocks as intra-op threads, and at most kMaxUnitHeads query heads per block: a chunk's
// query features (8 x 64 x 256 floats = 512 KiB at C = 64, m = 256) then stay in a core's L2.
// With fewer rows than threads (multi-query, one sequence) a row's query heads are split into
// parts too; each part recomputes the row's key side and adds its share of dk, dv (a part's own
// buffer). On other devices one unit covers every row: each op is one launch for the whole batch.
constexpr int64_t kMaxUnitHeads = 8;

struct Unit {
  int64_t row0, rows, part, g0, gn;  // rows [row0, row0 + rows), query heads [g0, g0 + gn) of each
};

struct Units {
  int64_t rows, group, blocks, block_rows, parts, part_group;  // query heads per row
  int64_t count() const { return blocks * parts; }
  Unit operator()(int64_t i) const {
    const int64_t block = i / parts, part = i % parts;
    const int64_t row0 = block * block_rows, g0 = part * part_group;
    return {row0, std::min(block_rows, rows - row0), part, g0, std::min(part_group, group - g0)};
  }
  Layout layout(const Layout& l, const Unit& u) const {
    return {1, u.rows * u.gn, u.rows, u.gn, 1, l.length, l.value_dim};
  }
  // The unit's query heads are contiguous: a part covers one row (parts > 1 only with one row per block).
  int64_t head0(const Unit& u) const { return u.row0 * group + u.g0; }
  int64_t heads(const Unit& u) const { return u.rows * u.gn; }
};

Units MakeUnits(const Layout& l, const c10::Device& device) {
  const int64_t rows = l.key_heads == 1 ? l.kv_heads : l.heads, group = l.key_heads == 1 ? l.group : 1;
  if (!device.is_cpu()) return {rows, group, 1, rows, 1, group};
  const int64_t threads = at::get_num_threads();
  const int64_t by_size = (rows * group + kMaxUnitHeads - 1) / kMaxUnitHeads;
  const int64_t blocks = std::clamp<int64_t>(std::max(threads, by_size), 1, rows);
  const int64_t block_rows = (rows + blocks - 1) / blocks;
  int64_t parts = 1;
  if (block_rows == 1 && rows < threads) parts = std::min(group, (threads + rows - 1) / rows);
  const int64_t part_group = (group + parts - 1) / parts;
  return {rows, group, (rows + block_rows - 1) / block_rows, block_rows, (group + part_group - 1) / part_group, part_group};
}

// Keys and values per row: as given, or repeated per query head.
torch::Tensor PerRow(const torch::Tensor& t_BKLD, const Layout& l) {
  return l.key_heads == 1 ? t_BKLD : t_BKLD.repeat_interleave(l.group, 1);
}

// The unit's slice of a 1N... tensor: heads [h, h + n).
torch::Tensor Take(const torch::Tensor& t, int64_t h, int64_t n) { return t.narrow(1, h, n); }
// The unit's query-side slice of a 1N... tensor, laid out per row: 1 x rows x group x ...
torch::Tensor TakeGrouped(const torch::Tensor& t, const Units& units, const Unit& u) {
  auto sizes = t.sizes().vec();
  sizes.erase(sizes.begin(), sizes.begin() + 2);
  sizes.insert(sizes.begin(), {1, u.rows, u.gn});
  return Take(t, units.head0(u), units.heads(u)).view(sizes);
}

bool PerHead(const FeatureMap& map, size_t i) { return i < map.params_per_head.size() && map.params_per_head[i]; }

// The unit's parameters: per-head ones narrowed to its query heads.
std::vector<torch::Tensor> UnitParams(const FeatureMap& map, const std::vector<torch::Tensor>& params,
                                      const Units& units, const Unit& u) {
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < params.size(); ++i) {
    out.push_back(PerHead(map, i) ? params[i].narrow(0, units.head0(u), units.heads(u)) : params[i]);
  }
  return out;
}

// Runs fn(unit) for every unit on LibTorch's intra-op threads, each unit single-threaded inside
// (a chunk's ops are too small for two threads to share). Grad mode and the rest of the caller's
// thread-local state travel with the work.
template <typename Fn>
void ForEachUnit(int64_t count, const Fn& fn) {
  const at::ThreadLocalState caller_state;
  at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    at::ThreadLocalStateGuard guard(caller_state);
    for (int64_t i = begin; i < end; ++i) fn(i);
  });
}

// The batch folds into the heads (B x N x L x D -> 1 x BN x L x D, a view when the layout allows):
// the units then split all B K key rows among the threads, and each op of a unit covers several
// sequences instead of one unit per sequence (fewer, larger ops on the CPU; fewer launches on a GPU).
torch::Tensor FoldBatch(const torch::Tensor& t_BNLD) {
  return t_BNLD.reshape({1, t_BNLD.size(0) * t_BNLD.size(1), t_BNLD.size(2), t_BNLD.size(3)});
}
torch::Tensor UnfoldBatch(const torch::Tensor& t_1NLD, int64_t batch) {
  return t_1NLD.view({batch, t_1NLD.size(1) / batch, t_1NLD.size(2), t_1NLD.size(3)});
}
// Per-head parameters repeated per sequence to match the folded heads (b, h) -> b H + h.
std::vector<torch::Tensor> FoldParams(const FeatureMap& map, const std::vector<torch::Tensor>& params, int64_t batch) {
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!PerHead(map, i) || batch == 1) {
      out.push_back(params[i]);
      continue;
    }
    std::vector<int64_t> times(params[i].dim(), 1);
    times[0] = batch;
    // A leaf that keeps the flag: the backward differentiates w.r.t. its slices (ParamLeaves).
    out.push_back(params[i].detach().repeat(times).requires_grad_(params[i].requires_grad()));
  }
  return out;
}

class FusedCausalFunction : public torch::autograd::Function<FusedCausalFunction> {
 public:
  // Packed documents for the raw kernel (it scans each alone); a non-tensor argument, since an
  // undefined tensor cannot be an autograd input.
  struct Documents {
    torch::Tensor ids_BL;
  };

  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x_BHLD,
                               const torch::Tensor& y_BKLD, const torch::Tensor& v_BKLD, at::TensorList params,
                               const FeatureMap& feature_map, int64_t chunk_size, const Documents& documents) {
    MakeLayout(x_BHLD, y_BKLD, v_BKLD, feature_map);  // checks the unfolded shapes
    const int64_t batch = x_BHLD.size(0);
    // The CPU kernel reads per-head blocks of contiguous rows (a no-op for the usual layouts).
    const bool raw = CpuKernelApplies(feature_map, x_BHLD);
    const auto x_1NLD = FoldBatch(raw ? x_BHLD.contiguous() : x_BHLD);
    const auto y_1NLD = FoldBatch(raw ? y_BKLD.contiguous() : y_BKLD);
    const auto v_1NLD = FoldBatch(raw ? v_BKLD.contiguous() : v_BKLD);
    const std::vector<torch::Tensor> original(params.begin(), params.end());
    const auto p = FoldParams(feature_map, original, batch);
    const auto l = MakeLayout(x_1NLD, y_1NLD, v_1NLD, feature_map);
    const auto units = MakeUnits(l, x_1NLD.device());
    // Outputs go straight into preallocated tensors, each unit writing its own slices.
    const auto options = x_BHLD.options().dtype(FeatureDtype(x_BHLD.scalar_type()));
    auto out_BHLD = torch::empty({batch, x_BHLD.size(1), l.length, l.value_dim}, options);
    const auto out_1NLD = FoldBatch(out_BHLD);
    auto den_1NL = torch::empty({1, l.heads, l.length}, options);
    const auto y_1RLD = PerRow(y_1NLD, l), v_1RLD = PerRow(v_1NLD, l);
    // The raw kernel's checkpoints of the key state per row (raw_cpu_kernel.h); parts of a row
    // after the first write theirs into scratch copies, dropped after the forward.
    torch::Tensor states_1RS, refs_1RN, extra_states_P1RS, extra_refs_P1RN;
    DF_CHECK(raw || !documents.ids_BL.defined(), "FusedCausalLinearAttention: documents reach the raw kernel only");
    RowDocuments row_documents;
    if (raw) {
      const int64_t m = p.at(0).size(0);
      row_documents = MakeRowDocuments(documents.ids_BL, units.rows, l.length, m, chunk_size);
      const int64_t count = row_documents.checkpoints;
      states_1RS = torch::empty({1, units.rows, count * m * (l.value_dim + 1)}, options);
      refs_1RN = torch::empty({1, units.rows, count * m}, options);
      if (units.parts > 1) {
        extra_states_P1RS = torch::empty({units.parts - 1, 1, units.rows, states_1RS.size(2)}, options);
        extra_refs_P1RN = torch::empty({units.parts - 1, 1, units.rows, count * m}, options);
      }
    }
    ForEachUnit(units.count(), [&](int64_t i) {
      const auto u = units(i);
      const auto unit_params = UnitParams(feature_map, p, units, u);
      const auto x = Take(x_1NLD, units.head0(u), units.heads(u)), y = Take(y_1RLD, u.row0, u.rows),
                 v = Take(v_1RLD, u.row0, u.rows), out = TakeGrouped(out_1NLD, units, u),
                 den = TakeGrouped(den_1NL, units, u);
      if (raw) {
        const auto& states = u.part == 0 ? states_1RS : extra_states_P1RS[u.part - 1];
        const auto& refs = u.part == 0 ? refs_1RN : extra_refs_P1RN[u.part - 1];
        ForwardUnitRaw(unit_params, units.layout(l, u), x, y, v, chunk_size, out, den,
                       Take(states, u.row0, u.rows), Take(refs, u.row0, u.rows), row_documents, u.row0);
      } else {
        ForwardUnit(feature_map, unit_params, units.layout(l, u), x, y, v, chunk_size, out, den);
      }
    });
    RecordDtype(ProbeField::kInputs, x_1NLD);
    RecordDtype(ProbeField::kNormaliser, den_1NL);
    if (raw) {  // the raw kernel computes features and state in fp32 (float buffers) by construction
      RecordDtype(ProbeField::kFeatures, states_1RS);
      RecordDtype(ProbeField::kState, states_1RS);
    }
    std::vector<torch::Tensor> saved = {x_1NLD,
                                        y_1NLD,
                                        v_1NLD,
                                        out_BHLD,
                                        den_1NL,
                                        states_1RS,
                                        refs_1RN};
    saved.insert(saved.end(), original.begin(), original.end());
    ctx->save_for_backward(saved);
    SaveFeatureMap(ctx, feature_map);
    ctx->saved_data["chunk"] = chunk_size;
    ctx->saved_data["batch"] = batch;
    if (documents.ids_BL.defined()) ctx->saved_data["documents"] = documents.ids_BL;
    return out_BHLD;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    // A backward called inside an autocast scope must not turn the scans' products bf16; nor a
    // run's TF32 take their operands (FusedCausalLinearAttention).
    NoAutocastGuard no_autocast;
    NoTf32Scope fp32_products;
    const auto saved = ctx->get_saved_variables();
    const auto &x_1NLD = saved[0], &y_1NLD = saved[1], &v_1NLD = saved[2];
    const auto &den_1NL = saved[4], &states_1RS = saved[5], &refs_1RN = saved[6];
    const auto out_1NLD = FoldBatch(saved[3]);
    const std::vector<torch::Tensor> original(saved.begin() + 7, saved.end());
    const FeatureMap& map = SavedFeatureMap(ctx);
    const int64_t chunk_size = ctx->saved_data["chunk"].toInt(), batch = ctx->saved_data["batch"].toInt();
    const auto params = FoldParams(map, original, batch);
    const auto l = MakeLayout(x_1NLD, y_1NLD, v_1NLD, map);
    const auto units = MakeUnits(l, x_1NLD.device());
    const auto g_1NLD = FoldBatch(grad_outputs[0].to(out_1NLD.scalar_type()).contiguous());
    const auto y_1RLD = PerRow(y_1NLD, l), v_1RLD = PerRow(v_1NLD, l);

    const auto saved_documents = ctx->saved_data.find("documents");
    const auto row_documents =
        states_1RS.defined()
            ? MakeRowDocuments(saved_documents != ctx->saved_data.end() ? saved_documents->second.toTensor() : torch::Tensor(),
                               units.rows, l.length, params.at(0).size(0), chunk_size)
            : RowDocuments{};
    auto dx_1NLD = torch::empty_like(x_1NLD);
    // dy, dv per part of a row's query heads (summed below when a row is split).
    auto dy_P1RLD = torch::empty({units.parts, 1, units.rows, l.length, y_1RLD.size(3)}, y_1RLD.options());
    auto dv_P1RLD = torch::empty({units.parts, 1, units.rows, l.length, v_1RLD.size(3)}, v_1RLD.options());
    const int64_t count = units.count();
    std::vector<std::vector<torch::Tensor>> unit_param_grads(count);
    ForEachUnit(count, [&](int64_t i) {
      const auto u = units(i);
      const int64_t h0 = units.head0(u), nh = units.heads(u);
      const UnitSaved s{Take(x_1NLD, h0, nh), Take(y_1RLD, u.row0, u.rows), Take(v_1RLD, u.row0, u.rows),
                        TakeGrouped(out_1NLD, units, u), TakeGrouped(den_1NL, units, u), TakeGrouped(g_1NLD, units, u)};
      const auto unit_params = UnitParams(map, params, units, u);
      const auto dx = Take(dx_1NLD, h0, nh), dy = Take(dy_P1RLD[u.part], u.row0, u.rows),
                 dv = Take(dv_P1RLD[u.part], u.row0, u.rows);
      // The raw kernel's forward left checkpoints: its backward reads them.
      unit_param_grads[i] = states_1RS.defined()
                                ? BackwardUnitRaw(unit_params, units.layout(l, u), s, Take(states_1RS, u.row0, u.rows),
                                                  Take(refs_1RN, u.row0, u.rows), chunk_size, dx, dy, dv,
                                                  row_documents, u.row0)
                                : BackwardUnit(map, unit_params, units.layout(l, u), s, chunk_size, dx, dy, dv);
    });
    const auto dy_1RLD = units.parts == 1 ? dy_P1RLD[0] : dy_P1RLD.sum(0);
    const auto dv_1RLD = units.parts == 1 ? dv_P1RLD[0] : dv_P1RLD.sum(0);
    // Rows per query head: sum each KV head's group.
    auto per_kv_head = [&](const torch::Tensor& d_1RLD) {
      const auto d_1NLD = l.key_heads == 1
                              ? d_1RLD
                              : d_1RLD.view({1, l.kv_heads, l.group, l.length, d_1RLD.size(3)}).sum(2);
      return UnfoldBatch(d_1NLD, batch);
    };
    RecordDtype(ProbeField::kGradients, dx_1NLD);
    torch::autograd::variable_list grads = {UnfoldBatch(dx_1NLD, batch), per_kv_head(dy_1RLD), per_kv_head(dv_1RLD)};
    // Parameter gradients: summed over units, per-head ones into their heads' rows (serially),
    // then over the sequences that share them.
    for (size_t n = 0; n < params.size(); ++n) {
      const bool per_head = PerHead(map, n);
      torch::Tensor total;
      for (int64_t i = 0; i < count; ++i) {
        const auto& g = unit_param_grads[i][n];
        if (!g.defined()) continue;
        if (!total.defined()) total = torch::zeros_like(params[n], g.options());
        const auto u = units(i);
        (per_head ? total.narrow(0, units.head0(u), units.heads(u)) : total).add_(g);
      }
      if (total.defined() && per_head && batch > 1) {
        auto sizes = original[n].sizes().vec();
        sizes.insert(sizes.begin(), batch);
        total = total.view(sizes).sum(0);
      }
      grads.push_back(total);
    }
    grads.push_back({});  // map
    grads.push_back({});  // chunk_size
    grads.push_back({});  // documents
    return grads;
  }
};

}  // namespace

torch::Tensor FusedCausalLinearAttention(const torch::Tensor& x_BHLD, const torch::Tensor& y_BKLD,
                                         const torch::Tensor& v_BKLD, const FeatureMap& map, int64_t chunk_size,
                                         const torch::Tensor& document_ids_BL) {
  DF_CHECK(chunk_size > 0, "FusedCausalLinearAttention: chunk_size must be positive, got " << chunk_size);
  // Features, running sums and the normaliser in fp32 (fp64 for fp64 inputs) whatever the inputs'
  // dtype, and no op inside autocast (a bf16 product folded into an fp32 state fails, or silently
  // loses the state's precision).
  NoAutocastGuard no_autocast;
  const auto dtype = FeatureDtype(x_BHLD.scalar_type());
  DF_CHECK(map.op != CausalOp::kNaive, "FusedCausalLinearAttention: op 'naive' is the kernel's composite path, not an operator form");
  const bool documents = document_ids_BL.defined();
  const auto x = x_BHLD.to(dtype), y = y_BKLD.to(dtype), v = v_BKLD.to(dtype);
  const auto form = ResolveCausalForm(map.op, x.is_cpu(), causal_ops::RawKernelRuns(map, x), documents);
  const bool parallel = form == CausalForm::kChunkParallel;
  // Packed documents: the raw kernel scans each alone inside one call, the chunk-parallel form
  // masks inside its operator, and the chunk loop runs once per document.
  const bool raw_documents = documents && form == CausalForm::kRawCpu;
  // op: cuda takes the inputs as given: it saves them so (a bf16 input is the caller's tensor, not
  // an fp32 copy) and computes in fp32.
  if (form == CausalForm::kCuda) return CudaCausalAttention(x_BHLD, y_BKLD, v_BKLD, map, chunk_size, document_ids_BL);
  // The LibTorch forms' products in full fp32 under a run's TF32 (fp32_products.h: the backward's
  // g . v_j and g . out cancel on sharp rows); their backwards take the same scope.
  NoTf32Scope fp32_products;
  if (causal_ops::MapsInputs(map)) {
    // The other forms read the mapped inputs, mapped here under autograd; keys per query head
    // (A per head) take H KV heads, values with them.
    const int64_t rows = map.keys_per_query_head ? x.size(1) : y.size(1);
    const auto [xm, ym] = causal_ops::MappedInputs(map, map.params, x, causal_ops::PerRow(y, rows));
    auto plain = causal_ops::WithoutInputMap(map);
    plain.keys_per_query_head = false;
    return FusedCausalLinearAttention(xm, ym, causal_ops::PerRow(v, rows), plain, chunk_size, document_ids_BL);
  }
  if (documents && form == CausalForm::kChunkLoop) {
    return PerDocument(x, y, v, document_ids_BL, [&](const torch::Tensor& xd, const torch::Tensor& yd, const torch::Tensor& vd) {
      return FusedCausalLinearAttention(xd, yd, vd, map, chunk_size);
    });
  }
  ResetForwardDtypes();
  return parallel ? ChunkParallelCausalAttention(x, y, v, map, chunk_size, document_ids_BL)
                  : FusedCausalFunction::apply(x, y, v, at::TensorList(map.params), map, chunk_size,
                                               FusedCausalFunction::Documents{raw_documents ? document_ids_BL : torch::Tensor()});
}

int64_t FusedCausalSavedBytes(const torch::Tensor& out) {
  return causal_ops::SavedBytesOf<FusedCausalFunction>(out) + ChunkParallelSavedBytes(out) + CudaOpSavedBytes(out);
}

}  // namespace darkformer
