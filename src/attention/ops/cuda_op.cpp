// op: cuda (see cuda_op.h).
#include "attention/ops/cuda_op.h"

#include <atomic>

#include "attention/ops/chunk_common.h"
#include "attention/ops/cuda_scan.h"
#include "attention/ops/raw_cpu_kernel.h"
#include "attention/ops/sub_chunk.h"
#include "util/error.h"

#ifdef DARKFORMER_CUDA_OP
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace darkformer {

namespace {

std::atomic<bool> emulate_on_host{false};

// The scan's Launch for base-2 features a (B x H x L x m), l (B x R x L x m) and v (B x K x L x Dv).
cuda_scan::Launch MakeLaunch(const torch::Tensor& a, const torch::Tensor& l, const torch::Tensor& v, int64_t sub) {
  cuda_scan::Launch x;
  x.rows = l.size(0) * l.size(1);
  x.length = a.size(2);
  x.features = a.size(3);
  x.value_dim = v.size(3);
  x.group = a.size(1) / l.size(1);
  x.sub = sub;
  // Checkpoints every ceil(m / S) sub-chunks, as the raw CPU kernel's: ~Dv + 2 floats per position.
  x.group_subs = CheckpointSubChunks(x.features, sub);
  x.value_rows_per = l.size(1) / v.size(1);
  x.a = a.data_ptr<float>();
  x.l = l.data_ptr<float>();
  x.v = v.data_ptr<float>();
  return x;
}

torch::Tensor Scratch(const cuda_scan::Launch& x, const torch::TensorOptions& options) {
  return torch::empty({x.rows, x.ScratchFloatsPerRow()}, options);
}

// The device's stream, or the host emulation.
void Run(const cuda_scan::Launch& x, const torch::Tensor& on, bool forward) {
  if (on.is_cpu()) {
    forward ? cuda_scan::ForwardOnHost(x) : cuda_scan::BackwardOnHost(x);
    return;
  }
#ifdef DARKFORMER_CUDA_OP
  const c10::cuda::CUDAGuard guard(on.device());
  void* stream = c10::cuda::getCurrentCUDAStream(on.device().index()).stream();
  forward ? cuda_scan::ForwardOnDevice(x, stream) : cuda_scan::BackwardOnDevice(x, stream);
#else
  Fail("op: cuda: this build has no CUDA kernels (CMake found no nvcc)");
#endif
}

class CudaScanFunction : public torch::autograd::Function<CudaScanFunction> {
 public:
  // lq B x H x L x m and lk B x R x L x m (natural-log features), v B x K x L x Dv, all fp32.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& lq, const torch::Tensor& lk,
                               const torch::Tensor& v, int64_t sub) {
    const auto a = (lq * causal_ops::kLog2E).contiguous(), l = (lk * causal_ops::kLog2E).contiguous();
    const auto values = v.contiguous();
    auto x = MakeLaunch(a, l, values, sub);
    const auto options = a.options();
    auto out = torch::empty({a.size(0), a.size(1), x.length, x.value_dim}, options);
    auto den = torch::empty({a.size(0), a.size(1), x.length}, options);
    auto states = torch::empty({x.rows, x.checkpoints(), x.features, x.value_dim + 1}, options);
    auto refs = torch::empty({x.rows, x.checkpoints(), x.features}, options);
    auto scratch = Scratch(x, options);
    x.out = out.data_ptr<float>();
    x.den = den.data_ptr<float>();
    x.states = states.data_ptr<float>();
    x.refs = refs.data_ptr<float>();
    x.scratch = scratch.data_ptr<float>();
    Run(x, a, /*forward=*/true);
    ctx->save_for_backward({a, l, values, out, den, states, refs});
    ctx->saved_data["sub"] = sub;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &a = saved[0], &l = saved[1], &values = saved[2], &out = saved[3], &den = saved[4];
    auto x = MakeLaunch(a, l, values, ctx->saved_data["sub"].toInt());
    const auto g = grads[0].to(torch::kFloat32).contiguous();
    const auto options = a.options();
    auto da = torch::empty_like(a), dl = torch::empty_like(l);
    auto dv_rows = torch::empty({x.rows, x.length, x.value_dim}, options);
    auto scratch = Scratch(x, options);
    x.out = out.data_ptr<float>();
    x.den = den.data_ptr<float>();
    x.states = saved[5].data_ptr<float>();
    x.refs = saved[6].data_ptr<float>();
    x.g = g.data_ptr<float>();
    x.da = da.data_ptr<float>();
    x.dl = dl.data_ptr<float>();
    x.dv = dv_rows.data_ptr<float>();
    x.scratch = scratch.data_ptr<float>();
    Run(x, a, /*forward=*/false);
    // Rows that share a value head (keys per query head) add their dv in a fixed order.
    const auto dv = dv_rows.view({values.size(0) * values.size(1), x.value_rows_per, x.length, x.value_dim})
                        .sum(1)
                        .view(values.sizes());
    return {da, dl, dv, torch::Tensor()};
  }
};

}  // namespace

void EmulateCudaOpOnHostForTesting(bool emulate) { emulate_on_host = emulate; }

bool CudaOpBuilt() { return cuda_scan::DeviceKernelsBuilt(); }

torch::Tensor CudaCausalAttention(const torch::Tensor& x_BHLD, const torch::Tensor& y_BKLD, const torch::Tensor& v_BKLD,
                                  const FeatureMap& map, int64_t chunk_size) {
  DF_CHECK(x_BHLD.is_cuda() || (x_BHLD.is_cpu() && emulate_on_host),
           "op: cuda runs on a CUDA device; got inputs on " << x_BHLD.device() << " (op: auto picks this device's form)");
  DF_CHECK(x_BHLD.is_cpu() || cuda_scan::DeviceKernelsBuilt(),
           "op: cuda: this build has no CUDA kernels (CMake found no nvcc); use op: auto");
  DF_CHECK(x_BHLD.scalar_type() != torch::kFloat64, "op: cuda computes in fp32; got fp64 inputs (op: auto takes them)");
  DF_CHECK(x_BHLD.dim() == 4 && y_BKLD.dim() == 4 && v_BKLD.dim() == 4 && x_BHLD.size(1) % y_BKLD.size(1) == 0 &&
               v_BKLD.size(1) == y_BKLD.size(1) && y_BKLD.size(2) == x_BHLD.size(2) && v_BKLD.size(2) == x_BHLD.size(2),
           "op: cuda: shapes do not match: x " << x_BHLD.sizes() << ", y " << y_BKLD.sizes() << ", v " << v_BKLD.sizes());
  const auto x = x_BHLD.to(torch::kFloat32), y = y_BKLD.to(torch::kFloat32), v = v_BKLD.to(torch::kFloat32);
  const int64_t heads = x.size(1), kv_heads = y.size(1), group = heads / kv_heads;
  // Keys once per KV head, or per query head where the map's parameters are.
  const auto y_rows = map.keys_per_query_head && group > 1 ? y.repeat_interleave(group, 1) : y;
  const auto lq = map.log_features(x, map.params, /*is_query=*/true).to(torch::kFloat32);
  const auto lk = map.log_features(y_rows, map.params, /*is_query=*/false).to(torch::kFloat32);
  const int64_t chunk = std::max<int64_t>(1, std::min(chunk_size, x.size(2)));
  return CudaScanFunction::apply(lq, lk, v, causal_ops::SubChunk(chunk));
}

}  // namespace darkformer
