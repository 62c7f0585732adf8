// Defaults of the attention kernel interface (see attention_kernel.h).
#include "attention/attention_kernel.h"

#include "util/error.h"

namespace darkformer {

torch::Tensor AttentionKernelImpl::Decode(std::unique_ptr<DecodeState>& /*state*/, const torch::Tensor& /*q_BHTD*/,
                                          const torch::Tensor& /*k_BKTD*/, const torch::Tensor& /*v_BKTD*/,
                                          const AttentionCall& /*call*/) {
  Fail("attention kernel '" + kernel_name() + "' has no incremental (decoding) form");
}

}  // namespace darkformer
