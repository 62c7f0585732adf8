// The replicas a run trains on, as the trainer sees them: one process (a plain run) or a
// data-parallel group (DataParallel). The train loop calls these alike and never branches on
// which it has, the way torchtitan's loop works through its parallel dims.
//
// Every call names what it was for, so a group that fails can say which exchange it was.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace darkformer {

class ReplicaGroup {
 public:
  virtual ~ReplicaGroup() = default;

  virtual int64_t rank() const = 0;
  virtual int64_t world_size() const = 0;
  bool is_rank_zero() const { return rank() == 0; }

  virtual void Barrier(const std::string& what) = 0;
  // Element-wise sum / max over the replicas, in fp64.
  virtual std::vector<double> Sum(const std::vector<double>& values, const std::string& what) = 0;
  virtual std::vector<double> Max(const std::vector<double>& values, const std::string& what) = 0;
  // Every replica's `value` / `text`, in rank order (texts: rare exchanges, not bulk data).
  virtual std::vector<int64_t> AllGather(int64_t value, const std::string& what) = 0;
  virtual std::vector<std::string> AllGatherText(const std::string& text, const std::string& what) = 0;
  // Overwrites `tensors` on every replica with rank 0's (in place, without autograd).
  virtual void BroadcastFromRankZero(const std::vector<torch::Tensor>& tensors, const std::string& what) = 0;

  // From now on, Backward leaves in `params`' gradients the mean over the replicas. Unless
  // `search_unused` (train.distributed.find_unused_parameters, resolved), each of them must get a
  // gradient at every step; one that does not is an error naming it.
  virtual void WatchGradients(const torch::OrderedDict<std::string, torch::Tensor>& params, bool search_unused) = 0;
  // Backward of this replica's `loss`, accumulating into the gradients. With `synchronise`, the
  // gradients accumulated since the last synchronised Backward become the replicas' mean of
  // their sums (torch DDP's no_sync between), scaled so that a loss divided by the global label
  // count gives the global batch's gradient.
  virtual void Backward(const torch::Tensor& loss, bool synchronise) = 0;
  // Clears `params`' gradients before a step (torch's zero_grad(set_to_none=True) in effect).
  virtual void ZeroGradients(const std::vector<torch::Tensor>& params) = 0;
  // After the last step: the replicas hold bit-identical `params` (a digest per replica, logged).
  virtual void CheckReplicasAgree(const std::vector<torch::Tensor>& params, int64_t step) = 0;
};

// A plain run: one replica; every exchange returns its input.
class SingleProcess final : public ReplicaGroup {
 public:
  int64_t rank() const override { return 0; }
  int64_t world_size() const override { return 1; }
  void Barrier(const std::string&) override {}
  std::vector<double> Sum(const std::vector<double>& values, const std::string&) override { return values; }
  std::vector<double> Max(const std::vector<double>& values, const std::string&) override { return values; }
  std::vector<int64_t> AllGather(int64_t value, const std::string&) override { return {value}; }
  std::vector<std::string> AllGatherText(const std::string& text, const std::string&) override { return {text}; }
  void BroadcastFromRankZero(const std::vector<torch::Tensor>&, const std::string&) override {}
  void WatchGradients(const torch::OrderedDict<std::string, torch::Tensor>&, bool) override {}
  void Backward(const torch::Tensor& loss, bool) override { loss.backward(); }
  void ZeroGradients(const std::vector<torch::Tensor>& params) override;
  void CheckReplicasAgree(const std::vector<torch::Tensor>&, int64_t) override {}
};

}  // namespace darkformer
