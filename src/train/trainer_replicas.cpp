// The trainer's replica group (see trainer.h): joining torchrun's data-parallel group, checking
// that the ranks run the same config and model, and agreeing on decisions.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <sstream>

#include "attention/kernel_traits.h"
#include "distributed/data_parallel.h"
#include "distributed/launch_environment.h"
#include "train/config_diff.h"
#include "train/trainer.h"
#include "util/hashing.h"
#include "util/labels.h"
#include "util/mixed_precision.h"

namespace darkformer {

void Trainer::JoinReplicaGroup() {
  const auto env = LaunchEnvironment::FromProcessEnvironment();
  if (!env || env->world_size <= 1) return;
  config_.data.rank = env->rank;
  config_.data.world_size = env->world_size;
  if (device_.is_cuda()) {
    device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(env->local_rank));
    // Before any CUDA allocation (NCCL's communicator, the model): otherwise every rank's
    // context and first tensors land on cuda:0.
    c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->setDevice(device_);
  }
  replicas_ = DataParallel::Join(config_.train.distributed, *env, device_);
  if (!is_rank_zero()) {
    // Every rank logs its setup (prefixed); step, eval and spike lines come from rank 0 alone.
    spdlog::set_pattern(fmt::format("[%Y-%m-%d %H:%M:%S.%e] [rank {}] [%^%l%$] %v", env->rank));
  }
  // Before anything else the ranks do together: every rank must run the same config, or they
  // would wait on collectives the others never start.
  const auto mine = FlattenConfig(config_);
  if (const auto texts = DifferingRanks(SerializeFlatConfig(mine), "comparing the ranks' configs")) {
    for (int64_t r = 1; r < replicas_->world_size(); ++r) {
      const auto difference = FirstDifference(ParseFlatConfig((*texts)[0]), ParseFlatConfig((*texts)[r]));
      if (!difference) continue;
      Fail("data parallel: config key '" + difference->key + "' differs between ranks: rank 0 has " +
           difference->first + ", rank " + std::to_string(r) + " has " + difference->second +
           "; every rank must run the same config");
    }
  }
  config_.data.LocalBatchSize();  // a global batch the ranks cannot split fails here, on every rank
}

std::optional<std::vector<std::string>> Trainer::DifferingRanks(const std::string& text, const std::string& what) {
  const auto digests = replicas_->AllGather(static_cast<int64_t>(Fnv1a64(text)), what);
  if (std::all_of(digests.begin(), digests.end(), [&](int64_t d) { return d == digests[0]; })) return std::nullopt;
  return replicas_->AllGatherText(text, what);
}

void Trainer::CheckRanksBuiltTheSameModel() {
  std::string shapes;
  for (const auto& item : model_->named_parameters()) {
    shapes += item.key() + " " + c10::toString(item.value().scalar_type()) + " " + c10::str(item.value().sizes()) + "\n";
  }
  for (const auto& item : model_->named_buffers()) shapes += item.key() + " " + c10::str(item.value().sizes()) + "\n";
  const auto texts = DifferingRanks(shapes, "comparing the ranks' parameter shapes");
  if (!texts) return;
  for (int64_t r = 1; r < replicas_->world_size(); ++r) {
    std::istringstream zero((*texts)[0]), other((*texts)[r]);
    for (std::string a, b;;) {
      const bool more_a = static_cast<bool>(std::getline(zero, a)), more_b = static_cast<bool>(std::getline(other, b));
      if (!more_a && !more_b) break;
      if (!more_a) a.clear();
      if (!more_b) b.clear();
      if (a == b) continue;
      Fail("data parallel: rank " + std::to_string(r) + "'s model differs from rank 0's: rank 0 has '" +
           (a.empty() ? "(nothing)" : a) + "', rank " + std::to_string(r) + " has '" + (b.empty() ? "(nothing)" : b) +
           "'");
    }
  }
}

void Trainer::WatchTrainableGradients() {
  if (replicas_->world_size() == 1) return;  // a plain run: its own gradients are the mean
  torch::OrderedDict<std::string, torch::Tensor> trainable;
  for (const auto& item : model_->named_parameters()) {
    if (item.value().requires_grad()) trainable.insert(item.key(), item.value());
  }
  // train.distributed.find_unused_parameters: auto searches only where some layer's kernel
  // ignores queries and keys (its q/k projections then get no gradient).
  bool search = config_.train.distributed.find_unused_parameters == UnusedParameterSearch::kAlways;
  if (config_.train.distributed.find_unused_parameters == UnusedParameterSearch::kAuto) {
    for (int64_t i = 0; i < config_.model.num_hidden_layers; ++i) {
      search = search || !TraitsOf(config_.attention.KernelForLayer(i)).reads_queries_and_keys;
    }
  }
  replicas_->WatchGradients(trainable, search);
}

bool Trainer::AnyRank(bool flag, const std::string& what) {
  return replicas_->Max({flag ? 1.0 : 0.0}, what)[0] > 0.0;
}

}  // namespace darkformer
