// A layer's kernel as the memory estimate's shadow sees it (see shadow_kernel.h).
#include "train/shadow_kernel.h"

#include "attention/feature_kernel_base.h"
#include "attention/kernel_registry.h"
#include "attention/log_feature_kernel.h"
#include "attention/ops/causal_form.h"
#include "train/trainable_set.h"

namespace darkformer::shadow {

bool ChunkParallel(const KernelInfo& k, bool cpu) {
  const bool raw_runs = cpu && k.kind == KernelInfo::Kind::kPositive;
  return k.log_form && ResolveCausalForm(k.op, cpu, raw_runs, k.documents) == CausalForm::kChunkParallel;
}

KernelInfo DescribeKernel(const RunConfig& c, int64_t layer, const std::vector<std::string>& trainable) {
  const std::string name = c.attention.KernelForLayer(layer);
  KernelShape shape{c.model.num_attention_heads, c.model.head_dim, layer};
  const auto kernel = MakeAttentionKernel(name, shape, c.attention.OptionsFor(name));
  KernelInfo info;
  for (const auto& p : kernel->named_parameters()) {
    const std::string full = "layers." + std::to_string(layer) + ".self_attn.kernel." + p.key();
    info.params_trainable = info.params_trainable || MatchesAny(full, trainable);
  }
  info.rank = c.model.head_dim;
  info.documents = c.data.document_masking;
  info.exact_mask = name == "exact" && c.attention.OptionsFor(name).Get<std::string>("documents", "auto") == "mask";
  const auto* features = dynamic_cast<const FeatureKernelBase*>(kernel.get());
  if (name == "exact" || !features) {
    info.kind = KernelInfo::Kind::kExact;
    return info;
  }
  info.chunk = features->options().chunk_size;
  info.features = features->options().num_features;
  info.kind = KernelInfo::Kind::kGenericFeatures;
  const auto* log_form = dynamic_cast<const LogFeatureKernel*>(features);  // signed maps: no operator
  info.log_form = log_form != nullptr && features->options().op != CausalOp::kNaive;
  info.op = features->options().op;
  if (info.log_form) {
    if (const auto form = log_form->PositiveForm()) {
      info.kind = KernelInfo::Kind::kPositive;
      info.features = form->w_MR.size(0);
      if (form->input_map_NRD.defined()) {
        info.map_heads = form->input_map_NRD.size(0);
        info.rank = form->input_map_NRD.size(1);
      }
    }
  }
  return info;
}

}  // namespace darkformer::shadow
