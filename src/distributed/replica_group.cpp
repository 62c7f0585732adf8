// The single-process replica group (see replica_group.h).
#include "distributed/replica_group.h"

namespace darkformer {

void SingleProcess::ZeroGradients(const std::vector<torch::Tensor>& params) {
  for (auto p : params) p.mutable_grad().reset();
}

}  // namespace darkformer
