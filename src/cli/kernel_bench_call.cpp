// One timed attention call of the kernel benchmark (see kernel_bench_call.h).
#include "cli/kernel_bench_call.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <set>

#include <ATen/SDPBackend.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include "attention/document_mask.h"
#include "attention/ops/dtype_probe.h"
#include "util/host_syncs.h"
#include "util/mixed_precision.h"
#include "util/peak_memory.h"
#include "util/profile_table.h"

namespace darkformer::kernel_bench {

namespace {

// Inputs of one call: q B x H x L x D, k and v B x K x L x D, all needing gradients.
struct Inputs {
  torch::Tensor q, k, v;
};

Inputs MakeInputs(const CallSetting& s) {
  const auto options = torch::TensorOptions().device(s.device);
  const int64_t d = s.head_dim;
  auto q = torch::randn({s.batch, s.heads, s.length, d}, options), k = torch::randn({s.batch, s.kv_heads, s.length, d}, options);
  if (s.norm > 0) {  // the kernels see x = q / d^(1/4): rows of q of norm s.norm d^(1/4)
    auto unit = [](const torch::Tensor& t) { return t / t.norm(2, -1, true); };
    const auto u = unit(torch::randn({d}, options));
    const double scale = s.norm * std::pow(static_cast<double>(d), 0.25);
    q = scale * unit(u + 0.1 * q);
    k = -scale * unit(u + 0.1 * k);
  }
  auto v = torch::randn({s.batch, s.kv_heads, s.length, d}, options);
  return {q.to(s.dtype).requires_grad_(), k.to(s.dtype).requires_grad_(), v.to(s.dtype).requires_grad_()};
}

AttentionCall ScaledCall(const CallSetting& s) {
  AttentionCall call;
  call.scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  return call;
}

torch::Tensor Call(const CallSetting& s, AttentionKernel& kernel, const Inputs& in, AttentionCall call, Documents documents) {
  // A bf16 user's forward runs under autocast (the backward, as autograd runs it, outside).
  AutocastScope autocast(s.device.type(), s.dtype == torch::kBFloat16);
  if (documents == Documents::kNone) return kernel->forward(in.q, in.k, in.v, call);
  if (documents == Documents::kMasked) {
    call.document_ids_BL = s.documents;
    return kernel->Attend(in.q, in.k, in.v, call);
  }
  return PerDocument(in.q, in.k, in.v, s.documents, [&](const torch::Tensor& qd, const torch::Tensor& kd, const torch::Tensor& vd) {
    return kernel->forward(qd, kd, vd, call);
  });
}

// Work queued on the GPU is done (a no-op on the CPU).
void Synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

}  // namespace

torch::Tensor PackedDocuments(int64_t batch, int64_t length, int64_t mean, const torch::Device& device) {
  std::mt19937_64 engine(1234);
  std::exponential_distribution<double> lengths(1.0 / static_cast<double>(mean));
  auto ids = torch::zeros({batch, length}, torch::kLong);
  auto* p = ids.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    int64_t doc = 0, left = 0;
    for (int64_t t = 0; t < length; ++t, --left) {
      if (left == 0) {
        left = std::max<int64_t>(1, std::llround(lengths(engine)));
        doc += t > 0 ? 1 : 0;
      }
      p[b * length + t] = doc;
    }
  }
  return ids.to(device);
}

std::string ComputesIn(const CallSetting& s, AttentionKernel& kernel, bool exact) {
  const auto in = MakeInputs(s);
  const auto call = ScaledCall(s);
  if (exact) {
    AutocastScope autocast(s.device.type(), s.dtype == torch::kBFloat16);
    const auto k = RepeatKvHeads(in.k, s.heads), v = RepeatKvHeads(in.v, s.heads);
    switch (static_cast<at::SDPBackend>(at::_fused_sdp_choice(in.q, k, v, {}, 0.0, true, call.scale))) {
      case at::SDPBackend::flash_attention: return "sdpa flash";
      case at::SDPBackend::efficient_attention: return "sdpa efficient";
      case at::SDPBackend::cudnn_attention: return "sdpa cudnn";
      case at::SDPBackend::math: return "sdpa math";
      default: return "sdpa other";
    }
  }
  torch::NoGradGuard no_grad;
  ResetForwardDtypes();
  Call(s, kernel, in, call, Documents::kNone);
  const auto dtypes = LastFusedCausalDtypes();
  if (dtypes.state == c10::ScalarType::Undefined) return "";
  return fmt::format("features {}, state {}", c10::toString(dtypes.features), c10::toString(dtypes.state));
}

Sample TimeOnce(const CallSetting& s, AttentionKernel& kernel, Documents documents) {
  auto info = std::make_shared<PeakMemory>(s.device.type());
  c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, info);
  const auto in = MakeInputs(s);
  const auto call = ScaledCall(s);
  Synchronize(s.device);
  const auto start = std::chrono::steady_clock::now();
  Call(s, kernel, in, call, documents).sum().backward();
  Synchronize(s.device);
  return {std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count(),
          info->peak() / (1024.0 * 1024.0)};
}

LayerOps CountLayerOps(const CallSetting& s, AttentionKernel& kernel, Documents documents) {
  const auto in = MakeInputs(s);
  const auto call = ScaledCall(s);
  torch::Tensor out;
  LayerOps ops;
  ops.forward = CountDispatchedOps([&] { out = Call(s, kernel, in, call, documents); });
  const auto grad = torch::randn_like(out);
  ops.backward = CountDispatchedOps([&] { out.backward(grad); });
  ops.host_syncs = CountHostSyncs([&] { Call(s, kernel, in, call, documents).backward(grad); });
  return ops;
}

void ProfileOnce(const CallSetting& s, const std::string& name, AttentionKernel& kernel) {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  using torch::profiler::impl::ProfilerConfig;
  using torch::profiler::impl::ProfilerState;
  const auto in = MakeInputs(s);
  const auto call = ScaledCall(s);
  std::set<ActivityType> activities = {ActivityType::CPU};
  if (s.device.is_cuda()) activities.insert(ActivityType::CUDA);
  prof::prepareProfiler(ProfilerConfig(ProfilerState::KINETO), activities);
  prof::enableProfiler(ProfilerConfig(ProfilerState::KINETO), activities);
  const auto start = std::chrono::steady_clock::now();
  Call(s, kernel, in, call, Documents::kNone).sum().backward();
  Synchronize(s.device);
  const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const auto result = prof::disableProfiler();
  PrintSelfTimeTable(*result, fmt::format("profile {}, L={} D={}: {:.1f} ms wall (profiled)", name, s.length, s.head_dim, wall_ms));
}

}  // namespace darkformer::kernel_bench
