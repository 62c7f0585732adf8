// Kernel benchmark (see kernel_bench.h).
#include "cli/kernel_bench.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <iostream>

#include <ATen/Context.h>
#include <torch/cuda.h>

#include "attention/attention_flops.h"
#include "attention/document_mask.h"
#include "attention/kernel_registry.h"
#include "attention/log_feature_kernel.h"
#include "attention/ops/cuda_op.h"
#include "attention/ops/cuda_op_launch.h"
#include "cli/kernel_bench_call.h"
#include "train/size_terms.h"
#include "util/error.h"
#include "util/json.h"
#include "util/json_lines.h"

namespace darkformer {

namespace {

using namespace kernel_bench;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? NAN : v[v.size() / 2];
}

// Model FLOPs of one forward+backward: the forward as attention/attention_flops.h counts it, the
// backward twice that (the usual convention). Exact attention counts the lower triangle only, half
// the square the trainer's MFU counts: causal SDPA skips the rest, and the bench reports work done.
double CallFlops(const AttentionKernelImpl& kernel, bool exact, int64_t batch, int64_t heads, int64_t kv_heads,
                 int64_t length, int64_t d) {
  const double forward = double(batch) * length * AttentionForwardFlopsPerToken(kernel, heads, kv_heads, d, length);
  return 3.0 * (exact ? forward / 2 : forward);
}

AttentionKernel Build(const std::string& name, const YAML::Node& options, int64_t heads, int64_t d,
                      const torch::Device& device) {
  KernelShape shape;
  shape.num_heads = heads;
  shape.head_dim = d;
  CheckKernelOptionsFit(name, options, d);
  auto kernel = MakeAttentionKernel(name, shape, ConfigReader(YAML::Clone(options), "attention." + name));
  kernel->to(device);
  return kernel;
}

}  // namespace

void RunKernelBench(const KernelBenchOptions& o) {
  const int64_t kv_heads = o.kv_heads > 0 ? o.kv_heads : o.heads;
  DF_CHECK(o.heads % kv_heads == 0, "--kv-heads " << kv_heads << " must divide --heads " << o.heads);
  DF_CHECK(o.batch > 0, "--bench-batch must be positive, got " << o.batch);
  DF_CHECK(o.repeats > 0, "--repeats must be positive, got " << o.repeats);
  const torch::Device device(o.device);
  DF_CHECK(o.dtype == "fp32" || o.dtype == "bf16", "--dtype must be fp32 or bf16, got '" << o.dtype << "'");
  const auto dtype = o.dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  DF_CHECK(!device.is_cuda() || torch::cuda::is_available(), "--device " << o.device << ": no CUDA device here");
  DF_CHECK(o.tf32 == "auto" || o.tf32 == "true" || o.tf32 == "false", "--tf32 must be auto, true or false, got '" << o.tf32 << "'");
  DF_CHECK(o.tf32 != "true" || device.is_cuda(), "--tf32 true: the CPU has no TF32 (use auto or false)");
  // As a training run sets it (train.tf32, ApplyTf32), for every call of this process.
  const bool tf32 = device.is_cuda() && o.tf32 != "false";
  if (device.is_cuda()) {
    at::globalContext().setAllowTF32CuBLAS(tf32);
    at::globalContext().setAllowTF32CuDNN(tf32);
  }
  auto fused_options = YAML::Load(o.options);
  DF_CHECK(!fused_options["op"] && !fused_options["fused"],
           "--options: give the operator's form with --op, not as op/fused in the kernel options");
  // Sizes first: nothing is allocated for a call that cannot fit (the probe below builds the kernel).
  for (const int64_t d : o.lengths.empty() ? std::vector<int64_t>{} : o.head_dims) {
    CheckKernelOptionsFit(o.kernel, fused_options, d, o.batch, o.heads, *std::max_element(o.lengths.begin(), o.lengths.end()),
                          device);
  }
  // Log-form kernels take the operator's form; signed ones have their composite path only. The
  // probe is built as `op: auto`, which takes none of op: cuda's keys (checked below).
  const std::vector<std::string> cuda_keys = {"sub_chunk", "segment_chunks", "pairs", "precompute_features"};
  auto probe_options = YAML::Clone(fused_options);
  for (const auto& key : cuda_keys) probe_options.remove(key);
  const bool log_form = std::dynamic_pointer_cast<LogFeatureKernel>(Build(o.kernel, probe_options, o.heads, 8, device).ptr()) != nullptr;
  DF_CHECK(!o.ops.empty(), "--op: give at least one form");
  for (const auto& key : cuda_keys) {
    DF_CHECK(!fused_options[key] || (o.ops == std::vector<std::string>{"cuda"} && !o.naive),
             "--options: " << key << " is op: cuda's, and the forms timed here are --op " << fmt::format("{}", fmt::join(o.ops, ","))
                 << (o.naive ? " and --naive" : "") << ": give --op cuda alone, or drop " << key);
  }
  // As a run's config is (run_config.cpp), before anything is timed or printed.
  if (std::find(o.ops.begin(), o.ops.end(), "cuda") != o.ops.end()) {
    DF_CHECK(device.is_cuda(), "--op cuda: op: cuda runs on a CUDA device; this bench runs on --device " << o.device);
    DF_CHECK(CudaOpBuilt(), "--op cuda: op: cuda: this build has no CUDA kernels (CMake found no nvcc)");
  }
  DF_CHECK(log_form || (o.ops == std::vector<std::string>{"auto"} && !o.naive),
           "--op / --naive: kernel '" << o.kernel << "' has no causal operator (only log-form kernels do)");
  auto naive_options = YAML::Clone(fused_options);
  if (log_form) naive_options["op"] = "naive";
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
      CallSetting setting{device, dtype, o.norm, o.batch, o.heads, kv_heads, length, d};
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
      const auto add = [&](const std::string& name, const std::string& kernel, const YAML::Node& options) {
        auto built = Build(kernel, options, o.heads, d, device);
        const double flops = CallFlops(*built, name == "exact", o.batch, o.heads, kv_heads, length, d);
        impls.push_back({name, std::move(built), flops});
      };
      for (std::string op : o.ops) {
        std::replace(op.begin(), op.end(), '-', '_');  // chunk-parallel = chunk_parallel
        auto options = YAML::Clone(fused_options);
        if (log_form) options["op"] = op;
        add(op, o.kernel, options);
      }
      if (o.naive) add("naive", o.kernel, naive_options);
      if (length <= o.exact_max_length) add("exact", "exact", YAML::Load("{}"));
      if (o.document_mean > 0) {
        setting.documents = PackedDocuments(o.batch, length, o.document_mean, device);
        const int64_t plain = static_cast<int64_t>(impls.size());
        for (int64_t i = 0; i < plain; ++i) {
          auto masked = impls[i];
          masked.name += "+mask";
          // Exact: the block-diagonal mask itself (its `auto` calls per document on a CPU).
          if (impls[i].name == "exact") masked.kernel = Build("exact", YAML::Load("{documents: mask}"), o.heads, d, device);
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
        const auto spans = DocumentSpans(setting.documents);
        int64_t count = 0;
        for (const auto& row : spans) count += static_cast<int64_t>(row.size());
        std::cout << fmt::format("L={}: {} documents in {} rows (mean length {:.0f})\n", length, count, o.batch,
                                 double(o.batch * length) / count);
      }
      for (auto& impl : impls) {
        TimeOnce(setting, impl.kernel, impl.documents);  // warm-up
        // Without documents: a masked row computes as its twin does (SDPA with a mask aside).
        if (impl.twin < 0) impl.computes_in = ComputesIn(setting, impl.kernel, impl.name == "exact");
      }
      if (o.profile) {
        for (auto& impl : impls) {  // every form, exact too: where each one's device time goes
          if (impl.twin < 0) ProfileOnce(setting, impl.name, impl.kernel);
        }
        for (auto& impl : impls) impl.ops = CountLayerOps(setting, impl.kernel, impl.documents);
      }
      for (int64_t r = 0; r < o.repeats; ++r) {
        for (auto& impl : impls) {  // alternate: each repeat times every implementation once
          const auto s = TimeOnce(setting, impl.kernel, impl.documents);
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
                     {"batch", o.batch}, {"heads", o.heads}, {"kv_heads", kv_heads},
                     {"threads", torch::get_num_threads()}, {"ms_median", ms}, {"ms_all", impl.ms},
                     {"peak_mib", mib}, {"gflops", gflops}};
        line["device"] = o.device;
        line["dtype"] = o.dtype;
        line["tf32"] = tf32;  // CUDA's fp32 products on TF32 operands (--tf32)
        // The feature map's options as the kernel read them (its defaults where the keys are absent);
        // op: cuda's cut as it ran: its sub-chunk at this length, and its own keys.
        if (const auto* features = dynamic_cast<const FeatureKernelBase*>(impl.kernel.get())) {
          const auto& read = features->options();
          line["num_features"] = read.num_features;
          line["chunk_size"] = read.chunk_size;
          if (impl.name == "cuda") {
            line["sub_chunk"] = cuda_op_launch::ChunkingFor(std::min(read.chunk_size, length), read.sub_chunk).sub;
            line["segment_chunks"] = read.segment_chunks;  // 0: at most what the device runs at once, evened
            line["pairs"] = read.exponential_pairs ? "exponentials" : "products";
            line["precompute_features"] = read.precompute_features;
          }
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
