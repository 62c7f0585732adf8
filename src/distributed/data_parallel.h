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
#include "distributed/replica_group.h"
#include "util/error.h"

namespace darkformer {

// A collective or the rendezvous failed: another rank died, hung or could not be reached.
class DistributedError : public Error {
 public:
  using Error::Error;
};

class DataParallel final : public ReplicaGroup {
 public:
  // Joins the group `env` describes; nullptr when it has one rank (a plain run) unless
  // `even_alone` (a group of one: the device tests' NCCL check). `device` is this rank's device
  // (CUDA: cuda:LOCAL_RANK).
  static std::unique_ptr<DataParallel> Join(const DistributedConfig& config, const LaunchEnvironment& env,
                                            torch::Device device, bool even_alone = false);
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int64_t rank() const override { return rank_; }
  int64_t world_size() const override { return world_size_; }
  const std::string& backend_name() const { return backend_name_; }

  void Barrier(const std::string& what) override;
  std::vector<double> Sum(const std::vector<double>& values, const std::string& what) override;
  std::vector<double> Max(const std::vector<double>& values, const std::string& what) override;
  std::vector<int64_t> AllGather(int64_t value, const std::string& what) override;
  std::vector<std::string> AllGatherText(const std::string& text, const std::string& what) override;
  void BroadcastFromRankZero(const std::vector<torch::Tensor>& tensors, const std::string& what) override;

  // c10d's Reducer on `params` (torch DDP's buckets, gradients as bucket views).
  void WatchGradients(const torch::OrderedDict<std::string, torch::Tensor>& params, bool search_unused) override;
  // The Reducer averages the summed gradients over the ranks while backward runs; the loss is
  // scaled by the rank count first, which undoes that mean (the loss is already divided by the
  // global label count).
  void Backward(const torch::Tensor& loss, bool synchronise) override;
  // A gradient that is a view into a bucket is zeroed in place: it cannot be detached, and
  // keeping it keeps the next backward accumulating into the bucket (one copy); others are reset.
  // Without the search, the first call after a synchronised step rebuilds the buckets instead
  // (RebuildBuckets).
  void ZeroGradients(const std::vector<torch::Tensor>& params) override;
  void CheckReplicasAgree(const std::vector<torch::Tensor>& params, int64_t step) override;

 private:
  struct Group;
  DataParallel(std::unique_ptr<Group> group, int64_t rank, int64_t world_size, torch::Device device,
               int64_t timeout_s, std::string backend_name, const DistributedConfig& config);
  std::vector<double> Reduce(const std::vector<double>& values, bool max, const std::string& what);
  [[noreturn]] void Fail(const std::string& what, const std::string& cause) const;
  // Without the search, c10d's Reducer lists the order gradients become ready in at every
  // backward until its buckets are rebuilt in that order, once (torch DDP asks before each
  // forward). Between steps, the gradients dropped first: the old buckets go before the new come.
  void RebuildBuckets(const std::vector<torch::Tensor>& params);
  // After the first synchronised backward: without the search, every watched parameter has a
  // gradient; the first without one is named.
  void CheckEveryGradientArrived() const;

  std::unique_ptr<Group> group_;
  int64_t rank_, world_size_;
  torch::Device device_;  // where collective tensors live (NCCL needs CUDA ones)
  int64_t timeout_s_;
  std::string backend_name_;
  DistributedConfig config_;
  std::vector<torch::Tensor> watched_;  // WatchGradients' parameters
  std::vector<std::string> watched_names_;
  bool search_unused_ = true;
  bool synchronised_once_ = false, rebuild_asked_ = false;
};

// One 64-bit digest of the tensors' bytes, in order: equal digests across ranks show bit-identical
// replicas.
uint64_t DigestOf(const std::vector<torch::Tensor>& tensors);

}  // namespace darkformer
