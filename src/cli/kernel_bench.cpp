// Kernel benchmark (see kernel_bench.h).
#include "cli/kernel_bench.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <set>
#include <iostream>
#include <map>
#include <optional>
#include <random>

#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include "attention/document_mask.h"
#include "attention/kernel_registry.h"
#include "attention/log_feature_kernel.h"
#include "attention/ops/cuda_op.h"
#include "attention/ops/cuda_op_launch.h"
#include "attention/ops/dtype_probe.h"
#include "train/size_terms.h"
#include "util/error.h"
#include "util/json.h"
#include "util/json_lines.h"
#include "util/mixed_precision.h"
#include "util/op_count.h"
#include "util/peak_memory.h"
#include "util/host_syncs.h"
#include "util/profile_table.h"

namespace darkformer {

namespace {

struct Sample {
  double ms = 0, peak_mib = 0;
};

// Inputs of one timed call: q B x H x L x D, k and v B x K x L x D, all needing gradients.
struct Inputs {
  torch::Tensor q, k, v;
};
torch::Device bench_device = torch::kCPU;         // --device, set once by RunKernelBench
torch::ScalarType bench_dtype = torch::kFloat32;  // --dtype, likewise
double bench_norm = 0.0;                          // --bench-norm, likewise

// How a timed call treats the row's documents (--bench-documents).
enum class Documents { kNone, kMasked, kPerDocument };
torch::Tensor bench_documents;  // B x L ids of the current length, on the device

// Document ids of B rows of L positions: exponential lengths of mean `mean` (at least 1), seeded.
torch::Tensor PackedDocuments(int64_t batch, int64_t length, int64_t mean) {
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
  return ids.to(bench_device);
}

torch::Tensor Call(AttentionKernel& kernel, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                   AttentionCall call, Documents documents) {
  // A bf16 user's forward runs under autocast (the backward, as autograd runs it, outside).
  AutocastScope autocast(bench_device.type(), bench_dtype == torch::kBFloat16);
  if (documents == Documents::kNone) return kernel->forward(q, k, v, call);
  if (documents == Documents::kMasked) {
    call.document_ids_BL = bench_documents;
    return kernel->Attend(q, k, v, call);
  }
  return PerDocument(q, k, v, bench_documents, [&](const torch::Tensor& qd, const torch::Tensor& kd, const torch::Tensor& vd) {
    return kernel->forward(qd, kd, vd, call);
  });
}

Inputs MakeInputs(int64_t batch, int64_t heads, int64_t kv_heads, int64_t length, int64_t d) {
  const auto options = torch::TensorOptions().device(bench_device);
  auto q = torch::randn({batch, heads, length, d}, options), k = torch::randn({batch, kv_heads, length, d}, options);
  if (bench_norm > 0) {  // the kernels see x = q / d^(1/4): rows of q of norm bench_norm d^(1/4)
    auto unit = [](const torch::Tensor& t) { return t / t.norm(2, -1, true); };
    const auto u = unit(torch::randn({d}, options));
    const double s = bench_norm * std::pow(static_cast<double>(d), 0.25);
    q = s * unit(u + 0.1 * q);
    k = -s * unit(u + 0.1 * k);
  }
  auto v = torch::randn({batch, kv_heads, length, d}, options);
  return {q.to(bench_dtype).requires_grad_(), k.to(bench_dtype).requires_grad_(), v.to(bench_dtype).requires_grad_()};
}

// What an implementation computes in: SDPA's backend for these inputs (flash, efficient, cudnn or
// math), or the dtypes our causal operator recorded for its features and running state (what
// autocast left of the inputs aside). Empty for a path that records nothing (the composite one).
std::string ComputesIn(AttentionKernel& kernel, bool exact, int64_t batch, int64_t heads, int64_t kv_heads,
                       int64_t length, int64_t d) {
  const auto in = MakeInputs(batch, heads, kv_heads, length, d);
  AttentionCall call;
  call.scale = 1.0 / std::sqrt(static_cast<double>(d));
  if (exact) {
    AutocastScope autocast(bench_device.type(), bench_dtype == torch::kBFloat16);
    const auto k = RepeatKvHeads(in.k, heads), v = RepeatKvHeads(in.v, heads);
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
  Call(kernel, in.q, in.k, in.v, call, Documents::kNone);
  const auto dtypes = LastFusedCausalDtypes();
  if (dtypes.state == c10::ScalarType::Undefined) return "";
  return fmt::format("features {}, state {}", c10::toString(dtypes.features), c10::toString(dtypes.state));
}

// Work queued on the GPU is done (a no-op on the CPU).
void Synchronize() {
  if (bench_device.is_cuda()) torch::cuda::synchronize();
}

Sample TimeOnce(AttentionKernel& kernel, int64_t batch, int64_t heads, int64_t kv_heads, int64_t length, int64_t d,
                Documents documents = Documents::kNone) {
  AttentionCall call;
  call.scale = 1.0 / std::sqrt(static_cast<double>(d));
  auto info = std::make_shared<PeakMemory>(bench_device.type());
  c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, info);
  const auto in = MakeInputs(batch, heads, kv_heads, length, d);
  Synchronize();
  const auto start = std::chrono::steady_clock::now();
  Call(kernel, in.q, in.k, in.v, call, documents).sum().backward();
  Synchronize();
  return {std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count(),
          info->peak() / (1024.0 * 1024.0)};
}

// Ops dispatched by one attention-layer call: its forward, then its backward alone (the incoming
// gradient made beforehand); and on a CUDA device the host syncs of one forward + backward.
struct LayerOps {
  OpCount forward, backward;
  std::optional<int64_t> host_syncs;
};
LayerOps CountLayerOps(AttentionKernel& kernel, int64_t batch, int64_t heads, int64_t kv_heads, int64_t length,
                       int64_t d, Documents documents) {
  AttentionCall call;
  call.scale = 1.0 / std::sqrt(static_cast<double>(d));
  const auto in = MakeInputs(batch, heads, kv_heads, length, d);
  torch::Tensor out;
  LayerOps ops;
  ops.forward = CountDispatchedOps([&] { out = Call(kernel, in.q, in.k, in.v, call, documents); });
  const auto grad = torch::randn_like(out);
  ops.backward = CountDispatchedOps([&] { out.backward(grad); });
  ops.host_syncs = CountHostSyncs([&] { Call(kernel, in.q, in.k, in.v, call, documents).backward(grad); });
  return ops;
}

// One forward+backward of implementation `name` under LibTorch's profiler (on CUDA with the
// device's activity: each kernel launch's own device time): self time (own time minus the ops it
// called) and call count per op, summed over threads, top rows printed.
void ProfileOnce(const std::string& name, AttentionKernel& kernel, int64_t batch, int64_t heads, int64_t kv_heads,
                 int64_t length, int64_t d) {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  using torch::profiler::impl::ProfilerConfig;
  using torch::profiler::impl::ProfilerState;
  AttentionCall call;
  call.scale = 1.0 / std::sqrt(static_cast<double>(d));
  const auto in = MakeInputs(batch, heads, kv_heads, length, d);
  std::set<ActivityType> activities = {ActivityType::CPU};
  if (bench_device.is_cuda()) activities.insert(ActivityType::CUDA);
  prof::prepareProfiler(ProfilerConfig(ProfilerState::KINETO), activities);
  prof::enableProfiler(ProfilerConfig(ProfilerState::KINETO), activities);
  const auto start = std::chrono::steady_clock::now();
  Call(kernel, in.q, in.k, in.v, call, Documents::kNone).sum().backward();
  Synchronize();
  const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const auto result = prof::disableProfiler();
  PrintSelfTimeTable(*result, fmt::format("profile {}, L={} D={}: {:.1f} ms wall (profiled)", name, length, d, wall_ms));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? NAN : v[v.size() / 2];
}

// Model FLOPs of forward+backward (backward counted as twice the forward, the usual convention).
// Exact causal: QK^T and PV over the lower triangle, 2 L^2 D per head forward.
double ExactFlops(int64_t heads, int64_t length, int64_t d) { return 3.0 * 2.0 * heads * double(length) * length * d; }
// Feature kernel, chunk C, m features, V = D + 1: query features 2 L D m per query head, key
// features once per KV head, intra-chunk products 2 L C (m + V), state read and update 4 L m V.
double FeatureFlops(int64_t heads, int64_t kv_heads, int64_t length, int64_t d, int64_t m, int64_t chunk) {
  const double l = double(length), v = double(d + 1);
  const double forward = heads * (2 * l * d * m + 2 * l * chunk * (m + v) + 4 * l * m * v) + kv_heads * (2 * l * d * m);
  return 3.0 * forward;
}

AttentionKernel Build(const std::string& name, const YAML::Node& options, int64_t heads, int64_t d) {
  KernelShape shape;
  shape.num_heads = heads;
  shape.head_dim = d;
  CheckKernelOptionsFit(name, options, d);
  auto kernel = MakeAttentionKernel(name, shape, ConfigReader(YAML::Clone(options), "attention." + name));
  kernel->to(bench_device);
  return kernel;
}

}  // namespace

void RunKernelBench(const KernelBenchOptions& o) {
  const int64_t kv_heads = o.kv_heads > 0 ? o.kv_heads : o.heads;
  DF_CHECK(o.heads % kv_heads == 0, "--kv-heads " << kv_heads << " must divide --heads " << o.heads);
  DF_CHECK(o.batch > 0, "--bench-batch must be positive, got " << o.batch);
  DF_CHECK(o.repeats > 0, "--repeats must be positive, got " << o.repeats);
  bench_device = torch::Device(o.device);
  bench_norm = o.norm;
  DF_CHECK(o.dtype == "fp32" || o.dtype == "bf16", "--dtype must be fp32 or bf16, got '" << o.dtype << "'");
  bench_dtype = o.dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  DF_CHECK(!bench_device.is_cuda() || torch::cuda::is_available(), "--device " << o.device << ": no CUDA device here");
  DF_CHECK(o.tf32 == "auto" || o.tf32 == "true" || o.tf32 == "false", "--tf32 must be auto, true or false, got '" << o.tf32 << "'");
  DF_CHECK(o.tf32 != "true" || bench_device.is_cuda(), "--tf32 true: the CPU has no TF32 (use auto or false)");
  // As a training run sets it (train.tf32, ApplyTf32), for every call of this process.
  const bool tf32 = bench_device.is_cuda() && o.tf32 != "false";
  if (bench_device.is_cuda()) {
    at::globalContext().setAllowTF32CuBLAS(tf32);
    at::globalContext().setAllowTF32CuDNN(tf32);
  }
  auto fused_options = YAML::Load(o.options);
  DF_CHECK(!fused_options["op"] && !fused_options["fused"],
           "--options: give the operator's form with --op, not as op/fused in the kernel options");
  // Sizes first: nothing is allocated for a call that cannot fit (the probe below builds the kernel).
  for (const int64_t d : o.lengths.empty() ? std::vector<int64_t>{} : o.head_dims) {
    CheckKernelOptionsFit(o.kernel, fused_options, d, o.batch, o.heads, *std::max_element(o.lengths.begin(), o.lengths.end()),
                          bench_device);
  }
  // Log-form kernels take the operator's form; signed ones have their composite path only. The
  // probe is built as `op: auto`, which takes none of op: cuda's keys (checked below).
  const std::vector<std::string> cuda_keys = {"sub_chunk", "segment_chunks", "pairs", "precompute_features"};
  auto probe_options = YAML::Clone(fused_options);
  for (const auto& key : cuda_keys) probe_options.remove(key);
  const bool log_form = std::dynamic_pointer_cast<LogFeatureKernel>(Build(o.kernel, probe_options, o.heads, 8).ptr()) != nullptr;
  DF_CHECK(!o.ops.empty(), "--op: give at least one form");
  for (const auto& key : cuda_keys) {
    DF_CHECK(!fused_options[key] || (o.ops == std::vector<std::string>{"cuda"} && !o.naive),
             "--options: " << key << " is op: cuda's, and the forms timed here are --op " << fmt::format("{}", fmt::join(o.ops, ","))
                 << (o.naive ? " and --naive" : "") << ": give --op cuda alone, or drop " << key);
  }
  // As a run's config is (run_config.cpp), before anything is timed or printed.
  if (std::find(o.ops.begin(), o.ops.end(), "cuda") != o.ops.end()) {
    DF_CHECK(bench_device.is_cuda(), "--op cuda: op: cuda runs on a CUDA device; this bench runs on --device " << o.device);
    DF_CHECK(CudaOpBuilt(), "--op cuda: op: cuda: this build has no CUDA kernels (CMake found no nvcc)");
  }
  DF_CHECK(log_form || (o.ops == std::vector<std::string>{"auto"} && !o.naive),
           "--op / --naive: kernel '" << o.kernel << "' has no causal operator (only log-form kernels do)");
  auto naive_options = YAML::Clone(fused_options);
  if (log_form) naive_options["op"] = "naive";
  const int64_t m = fused_options["num_features"] ? fused_options["num_features"].as<int64_t>() : 256;
  const int64_t chunk = fused_options["chunk_size"] ? fused_options["chunk_size"].as<int64_t>() : 64;
  const int64_t sub_chunk = fused_options["sub_chunk"] ? fused_options["sub_chunk"].as<int64_t>() : 0;
  const int64_t segment_chunks = fused_options["segment_chunks"] ? fused_options["segment_chunks"].as<int64_t>() : 0;
  const std::string pairs = fused_options["pairs"] ? fused_options["pairs"].as<std::string>() : "products";
  const bool precompute = fused_options["precompute_features"] && fused_options["precompute_features"].as<bool>();
  // Opened before anything is timed; each row lands as it is done (a stage limit keeps the rows so far).
  JsonLinesFile json(o.json);
  std::cout << fmt::format("forward+backward, {} {}, B={}, H={} query heads, {} KV heads, {} {} op {} vs exact (SDPA); "
                           "median of {} alternating repeats after a warm-up; {} intra-op threads; TF32 {}\n",
                           o.device, o.dtype, o.batch, o.heads, kv_heads, o.kernel, o.options, fmt::join(o.ops, ","), o.repeats,
                           torch::get_num_threads(), tf32 ? "on" : "off");
  std::cout << fmt::format("{:>4} {:>6} {:>14} {:>10} {:>9} {:>8} {:>10} {:>9}\n", "D", "L", "impl", "ms", "MiB",
                           "GFLOP/s", "vs exact", "mem/exact");
  for (const int64_t d : o.head_dims) {
    for (const int64_t length : o.lengths) {
      struct Impl {
        std::string name;
        AttentionKernel kernel;
        double flops;
        std::vector<double> ms, mib;
        LayerOps ops;
        Documents documents = Documents::kNone;
        int64_t twin = -1;  // the same implementation without documents (--bench-documents)
        std::string computes_in;
      };
      std::vector<Impl> impls;
      const double flops = o.batch * FeatureFlops(o.heads, kv_heads, length, d, m, chunk);
      for (std::string op : o.ops) {
        std::replace(op.begin(), op.end(), '-', '_');  // chunk-parallel = chunk_parallel
        auto options = YAML::Clone(fused_options);
        if (log_form) options["op"] = op;
        impls.push_back({op, Build(o.kernel, options, o.heads, d), flops});
      }
      if (o.naive) impls.push_back({"naive", Build(o.kernel, naive_options, o.heads, d), flops});
      if (length <= o.exact_max_length) impls.push_back({"exact", Build("exact", YAML::Load("{}"), o.heads, d), o.batch * ExactFlops(o.heads, length, d)});
      if (o.document_mean > 0) {
        bench_documents = PackedDocuments(o.batch, length, o.document_mean);
        const int64_t plain = static_cast<int64_t>(impls.size());
        for (int64_t i = 0; i < plain; ++i) {
          auto masked = impls[i];
          masked.name += "+mask";
          // Exact: the block-diagonal mask itself (its `auto` calls per document on a CPU).
          if (impls[i].name == "exact") masked.kernel = Build("exact", YAML::Load("{documents: mask}"), o.heads, d);
          masked.documents = Documents::kMasked;
          masked.twin = i;
          impls.push_back(masked);
          if (impls[i].name == "exact") {
            auto per_document = impls[i];
            per_document.name += "+perdoc";
            per_document.documents = Documents::kPerDocument;
            per_document.twin = i;
            impls.push_back(per_document);
          }
        }
        const auto spans = DocumentSpans(bench_documents);
        int64_t count = 0;
        for (const auto& row : spans) count += static_cast<int64_t>(row.size());
        std::cout << fmt::format("L={}: {} documents in {} rows (mean length {:.0f})\n", length, count, o.batch,
                                 double(o.batch * length) / count);
      }
      for (auto& impl : impls) {
        TimeOnce(impl.kernel, o.batch, o.heads, kv_heads, length, d, impl.documents);  // warm-up
        // Without documents: a masked row computes as its twin does (SDPA with a mask aside).
        if (impl.twin < 0) impl.computes_in = ComputesIn(impl.kernel, impl.name == "exact", o.batch, o.heads, kv_heads, length, d);
      }
      if (o.profile) {
        for (auto& impl : impls) {  // every form, exact too: where each one's device time goes
          if (impl.twin < 0) ProfileOnce(impl.name, impl.kernel, o.batch, o.heads, kv_heads, length, d);
        }
        for (auto& impl : impls) impl.ops = CountLayerOps(impl.kernel, o.batch, o.heads, kv_heads, length, d, impl.documents);
      }
      for (int64_t r = 0; r < o.repeats; ++r) {
        for (auto& impl : impls) {  // alternate: each repeat times every implementation once
          const auto s = TimeOnce(impl.kernel, o.batch, o.heads, kv_heads, length, d, impl.documents);
          impl.ms.push_back(s.ms);
          impl.mib.push_back(s.peak_mib);
        }
      }
      const Impl* exact = nullptr;
      for (const auto& impl : impls) {
        if (impl.name == "exact") exact = &impl;
      }
      for (const auto& impl : impls) {
        const double ms = Median(impl.ms), mib = Median(impl.mib);
        const double gflops = impl.flops / (ms * 1e6);
        const double speedup = exact ? Median(exact->ms) / ms : NAN, mem_ratio = exact ? mib / Median(exact->mib) : NAN;
        std::cout << fmt::format("{:>4} {:>6} {:>14} {:>10.1f} {:>9.1f} {:>8.1f} {:>9.2f}x {:>9.2f}", d, length,
                                 impl.name, ms, mib, gflops, speedup, mem_ratio);
        const double vs_unmasked = impl.twin >= 0 ? ms / Median(impls[impl.twin].ms) : NAN;
        if (impl.twin >= 0) std::cout << fmt::format("  {:.2f}x its unmasked time", vs_unmasked);
        if (o.profile) {
          std::cout << fmt::format("  ops fwd {} bwd {} (all aten events {} / {})", impl.ops.forward.compute,
                                   impl.ops.backward.compute, impl.ops.forward.all, impl.ops.backward.all);
          if (impl.ops.host_syncs) std::cout << fmt::format("  host syncs {}", *impl.ops.host_syncs);
        }
        std::cout << "\n";
        Json line = {{"kernel", o.kernel}, {"impl", impl.name}, {"head_dim", d}, {"length", length},
                     {"batch", o.batch}, {"heads", o.heads}, {"kv_heads", kv_heads}, {"num_features", m}, {"chunk_size", chunk},
                     {"threads", torch::get_num_threads()}, {"ms_median", ms}, {"ms_all", impl.ms},
                     {"peak_mib", mib}, {"gflops", gflops}};
        line["device"] = o.device;
        line["dtype"] = o.dtype;
        line["tf32"] = tf32;  // CUDA's fp32 products on TF32 operands (--tf32)
        // op: cuda's sub-chunk as it ran (its sub_chunk key, or the default) at this length.
        if (impl.name == "cuda") {
          line["sub_chunk"] = cuda_op_launch::ChunkingFor(std::min(chunk, length), sub_chunk).sub;
          line["segment_chunks"] = segment_chunks;  // its key: 0, at most what the device runs at once, evened
          line["pairs"] = pairs;                    // its key: products where they factor, or exponentials
          line["precompute_features"] = precompute;  // its key: the log-features by LibTorch before each pass
        }
        line["computes_in"] = impl.twin < 0 ? impl.computes_in : impls[impl.twin].computes_in;
        line["bench_norm"] = o.norm;  // 0: ordinary rows
        if (impl.twin >= 0) {
          line["documents_mean_length"] = o.document_mean;
          line["time_vs_unmasked"] = vs_unmasked;
        }
        if (o.profile) {
          line["ops_forward"] = impl.ops.forward.compute;
          line["ops_backward"] = impl.ops.backward.compute;
          line["aten_events_forward"] = impl.ops.forward.all;
          line["aten_events_backward"] = impl.ops.backward.all;
          if (impl.ops.host_syncs) line["host_syncs"] = *impl.ops.host_syncs;
        }
        if (exact) {
          line["speedup_vs_exact"] = speedup;
          line["memory_vs_exact"] = mem_ratio;
        }
        json.Write(line);
      }
      std::cout << std::flush;
    }
  }
  if (!o.json.empty()) std::cout << fmt::format("wrote {} JSON lines to {}\n", json.lines(), json.path());
}

}  // namespace darkformer
