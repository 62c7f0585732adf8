// The c10d process group, gradient Reducer and collectives (see data_parallel.h). This file alone
// includes c10d's backend headers: they need USE_C10D_GLOO (and USE_C10D_NCCL) defined, and
// Gloo's own headers (Debian's libgloo-dev; the torch wheel does not ship them).
#include "distributed/data_parallel.h"

#include <c10/util/Logging.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#ifdef DARKFORMER_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "util/hashing.h"

namespace darkformer {

struct DataParallel::Group {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> process_group;
  std::shared_ptr<c10d::Reducer> reducer;
};

namespace {

std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

std::string CauseOf(const std::exception& e) {
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) return FirstLine(c10->what_without_backtrace());
  return FirstLine(e.what());
}

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// Gloo's network device: loopback for a single-machine group on 127.0.0.1; GLOO_SOCKET_IFNAME
// when set (as in PyTorch); otherwise the interface this host's name resolves to.
std::shared_ptr<::gloo::transport::Device> GlooDevice(const std::string& master_addr) {
  if (IsLoopback(master_addr)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname != '\0') {
    std::string first(ifname);
    return c10d::ProcessGroupGloo::createDeviceForInterface(first.substr(0, first.find(',')));
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// Raises c10's log threshold to FATAL for its lifetime (c10d's ERROR and WARNING lines included).
class QuietC10Logging {
 public:
  QuietC10Logging() : previous_(FLAGS_caffe2_log_level) { FLAGS_caffe2_log_level = 3; }
  ~QuietC10Logging() { FLAGS_caffe2_log_level = previous_; }

 private:
  int previous_;
};

}  // namespace

std::unique_ptr<DataParallel> DataParallel::Join(const DistributedConfig& config, const LaunchEnvironment& env,
                                                 torch::Device device, bool even_alone) {
  if (env.world_size <= 1 && !even_alone) return nullptr;
  auto backend = config.backend;
  if (backend == DistributedBackend::kAuto) backend = device.is_cuda() ? DistributedBackend::kNccl : DistributedBackend::kGloo;
  DF_CHECK(backend != DistributedBackend::kNccl || device.is_cuda(),
           "config key 'train.distributed.backend' is nccl, which needs CUDA, but this run trains on the CPU "
           "(use gloo, or auto)");
  const auto timeout = std::chrono::milliseconds(config.timeout_s * 1000);
  const int rank = static_cast<int>(env.rank), size = static_cast<int>(env.world_size);
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  auto group = std::make_unique<Group>();
  std::string backend_name;
  // c10d logs each failed connect with a C++ stack dump (17 frames) before it gives up; our one
  // error line below names the address, the key and c10d's reason, so its log is quiet meanwhile.
  const QuietC10Logging quiet;
  try {
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(env.master_port);
    options.isServer = rank == 0 && !env.agent_hosts_store;
    // Every rank checks in (as Python's TCPStore with wait_for_workers): the host returns once all have.
    options.numWorkers = static_cast<size_t>(size);
    options.waitWorkers = true;
    options.timeout = timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
    // A restarted attempt (torchrun --max-restarts) must not read the keys of the one before.
    group->store = c10::make_intrusive<c10d::PrefixStore>(
        "darkformer/attempt_" + std::to_string(env.restart_count), tcp);
    group->process_group = c10::make_intrusive<c10d::ProcessGroup>(group->store, rank, size);
    if (backend == DistributedBackend::kGloo) {
      auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout);
      gloo_options->devices.push_back(GlooDevice(env.master_addr));
      auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(
          c10::make_intrusive<c10d::PrefixStore>("gloo", group->store), rank, size, gloo_options);
      group->process_group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
      group->process_group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
      backend_name = "gloo";
    } else {
#ifdef DARKFORMER_WITH_NCCL
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = timeout;
      auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(
          c10::make_intrusive<c10d::PrefixStore>("nccl", group->store), rank, size, nccl_options);
      group->process_group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
      group->process_group->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
      backend_name = "nccl";
#else
      Fail("config key 'train.distributed.backend' resolved to nccl, but this build has no NCCL "
           "(nccl.h was not found at configure time); use gloo");
#endif
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    // Bad input (exit 2), not a peer that failed mid-run (exit 4): no rank has started, and the
    // cause is the launch's address, port, world size or timeout.
    throw Error("rank " + std::to_string(rank) + " of " + std::to_string(size) +
                " could not join the data-parallel group at " + where + " within " +
                std::to_string(config.timeout_s) + " s (train.distributed.timeout_s; check MASTER_ADDR, "
                "MASTER_PORT and that all " + std::to_string(size) + " ranks were started): " + CauseOf(e));
  }
  auto parallel = std::unique_ptr<DataParallel>(
      new DataParallel(std::move(group), env.rank, env.world_size, device, config.timeout_s, backend_name, config));
  parallel->Barrier("joining the group");
  spdlog::info("data parallel: rank {} of {} ({} backend, rendezvous {})", env.rank, env.world_size, backend_name,
               where);
  return parallel;
}

DataParallel::DataParallel(std::unique_ptr<Group> group, int64_t rank, int64_t world_size, torch::Device device,
                           int64_t timeout_s, std::string backend_name, const DistributedConfig& config)
    : group_(std::move(group)),
      rank_(rank),
      world_size_(world_size),
      device_(backend_name == "nccl" ? device : torch::Device(torch::kCPU)),
      timeout_s_(timeout_s),
      backend_name_(std::move(backend_name)),
      config_(config) {}

DataParallel::~DataParallel() = default;

void DataParallel::Fail(const std::string& what, const std::string& cause) const {
  throw DistributedError("data parallel: " + what + " failed on rank " + std::to_string(rank_) + " of " +
                         std::to_string(world_size_) + " (another rank died, or none answered within " +
                         std::to_string(timeout_s_) + " s, train.distributed.timeout_s): " + cause);
}

void DataParallel::Barrier(const std::string& what) {
  // A one-element all-reduce: c10d's barrier on Gloo ignores the timeout option in some paths.
  Reduce({0.0}, false, what);
}

std::vector<double> DataParallel::Sum(const std::vector<double>& values, const std::string& what) {
  return Reduce(values, false, what);
}

std::vector<double> DataParallel::Max(const std::vector<double>& values, const std::string& what) {
  return Reduce(values, true, what);
}

std::vector<double> DataParallel::Reduce(const std::vector<double>& values, bool max, const std::string& what) {
  auto cpu = torch::tensor(values, torch::kFloat64);
  std::vector<at::Tensor> tensors{cpu.to(device_)};
  try {
    c10d::AllreduceOptions options;
    options.reduceOp = max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
    group_->process_group->allreduce(tensors, options)->wait(std::chrono::milliseconds(timeout_s_ * 1000));
  } catch (const std::exception& e) {
    Fail(what, CauseOf(e));
  }
  const auto result = tensors[0].to(torch::kCPU).contiguous();
  return std::vector<double>(result.data_ptr<double>(), result.data_ptr<double>() + result.numel());
}

std::vector<int64_t> DataParallel::AllGather(int64_t value, const std::string& what) {
  // Each rank writes its value into its own slot of a zero vector; the sum gathers them.
  std::vector<at::Tensor> tensors{torch::zeros({world_size_}, torch::kInt64)};
  tensors[0][rank_] = value;
  tensors[0] = tensors[0].to(device_);
  try {
    group_->process_group->allreduce(tensors)->wait(std::chrono::milliseconds(timeout_s_ * 1000));
  } catch (const std::exception& e) {
    Fail(what, CauseOf(e));
  }
  const auto result = tensors[0].to(torch::kCPU).contiguous();
  return std::vector<int64_t>(result.data_ptr<int64_t>(), result.data_ptr<int64_t>() + world_size_);
}

std::vector<std::string> DataParallel::AllGatherText(const std::string& text, const std::string& what) {
  const auto lengths = AllGather(static_cast<int64_t>(text.size()), what);
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  // As AllGather: each rank fills its own row of a zero matrix, and the sum gathers the rows.
  auto rows = torch::zeros({world_size_, std::max<int64_t>(longest, 1)}, torch::kUInt8);
  if (!text.empty()) std::memcpy(rows[rank_].data_ptr(), text.data(), text.size());
  std::vector<at::Tensor> tensors{rows.to(device_)};
  try {
    group_->process_group->allreduce(tensors)->wait(std::chrono::milliseconds(timeout_s_ * 1000));
  } catch (const std::exception& e) {
    Fail(what, CauseOf(e));
  }
  const auto result = tensors[0].to(torch::kCPU).contiguous();
  std::vector<std::string> texts;
  for (int64_t r = 0; r < world_size_; ++r) {
    const auto* row = result[r].data_ptr<uint8_t>();
    texts.emplace_back(reinterpret_cast<const char*>(row), static_cast<size_t>(lengths[r]));
  }
  return texts;
}

void DataParallel::BroadcastFromRankZero(const std::vector<torch::Tensor>& tensors, const std::string& what) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> views;
  for (const auto& t : tensors) {
    if (t.defined() && t.numel() > 0) views.push_back(t.detach());  // shares storage: in place
  }
  if (views.empty()) return;
  try {
    // One tensor per call: Gloo's broadcast wants a single tensor (or one per device).
    for (auto& view : views) {
      std::vector<at::Tensor> one{view.is_contiguous() ? view : view.contiguous()};
      group_->process_group->broadcast(one)->wait(std::chrono::milliseconds(timeout_s_ * 1000));
      if (!view.is_contiguous()) view.copy_(one[0]);
    }
  } catch (const std::exception& e) {
    Fail(what, CauseOf(e));
  }
}

void DataParallel::WatchGradients(const torch::OrderedDict<std::string, torch::Tensor>& named, bool search_unused) {
  watched_ = named.values();
  watched_names_ = named.keys();
  search_unused_ = search_unused;
  const auto& params = watched_;
  // As torch DDP: a small first bucket so the all-reduce starts early in backward, then
  // bucket_cap_mb buckets, in reverse parameter order (the order gradients become ready).
  const std::vector<size_t> caps{static_cast<size_t>(c10d::kDefaultFirstBucketBytes),
                                 static_cast<size_t>(config_.bucket_cap_mb) * 1024 * 1024};
  const std::vector<bool> sparse(params.size(), false);
  auto [buckets, limits] = c10d::compute_bucket_assignment_by_size(params, caps, sparse);
  std::reverse(buckets.begin(), buckets.end());
  std::reverse(limits.begin(), limits.end());
  std::vector<int64_t> limit_list(limits.begin(), limits.end());
  group_->reducer = std::make_shared<c10d::Reducer>(
      params, std::move(buckets), group_->process_group, sparse,
      /*bucket_bytes_cap=*/config_.bucket_cap_mb * 1024 * 1024, search_unused,
      // Gradients are views into the all-reduce buckets (torch DDP's gradient_as_bucket_view):
      // one copy of the gradients instead of two (5 GB for Gemma-2B's fp32 gradients).
      /*gradient_as_bucket_view=*/true, std::unordered_map<size_t, std::string>{},
      /*first_bucket_bytes_cap=*/c10d::kDefaultFirstBucketBytes, /*skip_all_reduce_unused_params=*/false,
      /*use_python_reducer=*/false, std::move(limit_list));
  spdlog::info("data parallel: gradients of {} tensors all-reduced in {} bucket(s); {}", params.size(), limits.size(),
               search_unused ? "each step searched for parameters without a gradient"
                             : "every one gets a gradient (no search)");
}

void DataParallel::Backward(const torch::Tensor& loss, bool synchronise) {
  DF_CHECK(group_->reducer, "DataParallel::Backward before WatchGradients");
  try {
    if (synchronise) {
      group_->reducer->prepare_for_forward();
      std::vector<at::Tensor> outputs;
      if (search_unused_) outputs.push_back(loss);
      group_->reducer->prepare_for_backward(outputs);
    }
    (loss * static_cast<double>(world_size_)).backward();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    Fail("the gradient all-reduce", CauseOf(e));
  }
  if (synchronise && !synchronised_once_) {
    synchronised_once_ = true;
    int64_t views = 0;
    for (const auto& p : watched_) views += p.grad().defined() && p.grad().is_view() ? 1 : 0;
    spdlog::info("data parallel: {} of {} gradients are views into the all-reduce buckets", views, watched_.size());
    CheckEveryGradientArrived();
  }
}

void DataParallel::CheckEveryGradientArrived() const {
  if (search_unused_) return;
  for (size_t i = 0; i < watched_.size(); ++i) {
    // Its bucket never became ready, so no bucket after it was all-reduced either.
    DF_CHECK(watched_[i].grad().defined(),
             "data parallel: trainable parameter '" << watched_names_[i] << "' got no gradient, and "
             "train.distributed.find_unused_parameters is "
             << EnumName(config_.find_unused_parameters, kUnusedParameterSearchNames)
             << " (no search for such parameters); set it to true, or freeze the parameter (train.trainable)");
  }
}

void DataParallel::RebuildBuckets(const std::vector<torch::Tensor>& params) {
  for (auto p : params) p.mutable_grad().reset();
  rebuild_asked_ = true;
  bool rebuilt = false;
  try {
    rebuilt = group_->reducer->rebuild_buckets();
  } catch (const std::exception& e) {
    Fail("rebuilding the gradient buckets", CauseOf(e));
  }
  if (rebuilt) spdlog::info("data parallel: gradient buckets rebuilt in the order gradients became ready");
}

void DataParallel::ZeroGradients(const std::vector<torch::Tensor>& params) {
  if (!search_unused_ && synchronised_once_ && !rebuild_asked_) return RebuildBuckets(params);
  std::vector<torch::Tensor> bucket_views;  // zeroed in one multi-tensor call
  for (auto p : params) {
    auto& grad = p.mutable_grad();
    if (!grad.defined()) continue;
    if (grad.is_view()) {
      bucket_views.push_back(grad);
    } else {
      grad.reset();
    }
  }
  if (!bucket_views.empty()) at::_foreach_zero_(bucket_views);
}

// Every rank applied the same averaged gradients; a digest of each rank's parameters shows the
// replicas stayed bit-identical (logged on every rank, so a launcher's logs can be compared too).
void DataParallel::CheckReplicasAgree(const std::vector<torch::Tensor>& params, int64_t step) {
  const auto digest = static_cast<int64_t>(DigestOf(params));
  spdlog::info("rank {} parameter digest {:016x} after step {}", rank_, static_cast<uint64_t>(digest), step);
  const auto digests = AllGather(digest, "comparing parameter digests");
  for (int64_t r = 1; r < world_size_; ++r) {
    DF_CHECK(digests[r] == digests[0], "data parallel: rank " << r << "'s parameters differ from rank 0's after step "
                                                              << step << " (digest " << std::hex << digests[r]
                                                              << " vs " << digests[0] << ")");
  }
}

uint64_t DigestOf(const std::vector<torch::Tensor>& tensors) {
  uint64_t digest = 0;
  for (const auto& t : tensors) {
    const auto bytes = t.detach().to(torch::kCPU).contiguous();
    const auto view = std::string_view(static_cast<const char*>(bytes.data_ptr()), bytes.nbytes());
    digest = SplitMix64(digest ^ Fnv1a64(view));
  }
  return digest;
}

}  // namespace darkformer
