// Defaults of the attention kernel interface (see attention_kernel.h).
#include "attention/attention_kernel.h"

#include "attention/document_mask.h"
#include "util/error.h"

namespace darkformer {

torch::Tensor AttentionKernelImpl::Attend(const torch::Tensor& q_BHLD, const torch::Tensor& k_BKLD,
                                          const torch::Tensor& v_BKLD, const AttentionCall& call) {
  if (!call.document_ids_BL.defined()) return forward(q_BHLD, k_BKLD, v_BKLD, call);
  CheckDocumentIds(call.document_ids_BL, q_BHLD.size(0), q_BHLD.size(2));
  if (HandlesDocuments(call)) return forward(q_BHLD, k_BKLD, v_BKLD, call);
  AttentionCall one_document = call;
  one_document.document_ids_BL = torch::Tensor();
  return PerDocument(q_BHLD, k_BKLD, v_BKLD, call.document_ids_BL,
                     [&](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
                       return forward(q, k, v, one_document);
                     });
}

torch::Tensor AttentionKernelImpl::Decode(std::unique_ptr<DecodeState>& /*state*/, const torch::Tensor& /*q_BHTD*/,
                                          const torch::Tensor& /*k_BKTD*/, const torch::Tensor& /*v_BKTD*/,
                                          const AttentionCall& /*call*/) {
  Fail("attention kernel '" + kernel_name() + "' has no incremental (decoding) form");
}

}  // namespace darkformer
