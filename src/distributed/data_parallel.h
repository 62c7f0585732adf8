// Data parallelism on PyTorch's c10d, for a worker that torchrun started: the process group
// (a TCPStore rendezvous at MASTER_ADDR:MASTER_PORT, Gloo on CPU or NCCL on CUDA), c10d's
// gradient Reducer (bucketed all-reduce that starts while backward still runs, as torch DDP's),
// and the few collectives the trainer needs to keep every rank's decisions identical.
//
// Every collective names what it was for; a peer that dies, or none answering within
// train.distributed.timeout_s, ends this rank with a DistributedError instead of a hang.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distributed/distributed_config.h"
#include "distributed/launch_environment.h"
#include "util/error.h"

namespace darkformer {

// A collective or the rendezvous failed: another rank died, hung or could not be reached.
class DistributedError : public Error {
 public:
  using Error::Error;
};

class DataParallel {
 public:
  // Joins the group `env` describes; nullptr when it has one rank (a plain run) unless
  // `even_alone` (a group of one: the device tests' NCCL check). `device` is this rank's device
  // (CUDA: cuda:LOCAL_RANK).
  static std::unique_ptr<DataParallel> Join(const DistributedConfig& config, const LaunchEnvironment& env,
                                            torch::Device device, bool even_alone = false);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int64_t rank() const { return rank_; }
  int64_t world_size() const { return world_size_; }
  const std::string& backend_name() const { return backend_name_; }

  void Barrier(const std::string& what);
  // Element-wise sum / max over ranks, in fp64.
  std::vector<double> Sum(const std::vector<double>& values, const std::string& what);
  std::vector<double> Max(const std::vector<double>& values, const std::string& what);
  // Every rank's `value`, in rank order.
  std::vector<int64_t> AllGather(int64_t value, const std::string& what);
  // Every rank's `text`, in rank order (for the rare exchange of configs; not for bulk data).
  std::vector<std::string> AllGatherText(const std::string& text, const std::string& what);
  // Overwrites `tensors` on every rank with rank 0's (in place, without autograd).
  void BroadcastFromRankZero(const std::vector<torch::Tensor>& tensors, const std::string& what);

  // From now on, a synchronised backward averages the gradients of `params` over the ranks.
  void WatchGradients(const std::vector<torch::Tensor>& params);
  // loss.backward(): with `synchronise`, the gradients (accumulated since the last synchronised
  // backward, as torch DDP's no_sync) are averaged over ranks while backward runs.
  void Backward(const torch::Tensor& loss, bool synchronise);

 private:
  struct Group;
  DataParallel(std::unique_ptr<Group> group, int64_t rank, int64_t world_size, torch::Device device,
               int64_t timeout_s, std::string backend_name, const DistributedConfig& config);
  std::vector<double> Reduce(const std::vector<double>& values, bool max, const std::string& what);
  [[noreturn]] void Fail(const std::string& what, const std::string& cause) const;

  std::unique_ptr<Group> group_;
  int64_t rank_, world_size_;
  torch::Device device_;  // where collective tensors live (NCCL needs CUDA ones)
  int64_t timeout_s_;
  std::string backend_name_;
  DistributedConfig config_;
};

// One 64-bit digest of the tensors' bytes, in order: equal digests across ranks show bit-identical
// replicas.
uint64_t DigestOf(const std::vector<torch::Tensor>& tensors);

}  // namespace darkformer
