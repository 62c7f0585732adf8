// kernel-check --weights: a checkpoint's own queries and keys, layer by layer (kernel_check_args.h).
#include <fmt/format.h>

#include <fstream>
#include <iostream>
#include <sstream>

#include "attention/learned_proposal.h"
#include "cli/kernel_check_args.h"
#include "data/packed_loader.h"
#include "data/tokenizer.h"
#include "model/gemma_model.h"
#include "model/weights_io.h"
#include "util/error.h"

namespace darkformer {

namespace {

// Token ids [B, L] from one loader batch or the start of a text file; the tokenizer must fit the model.
torch::Tensor InputIds(const KernelCheckArgs& a, int64_t model_vocab) {
  DF_CHECK(a.shards.empty() + a.text.empty() + a.ids.empty() == 2,
           "kernel-check --weights needs exactly one of --shards, --text and --ids");
  if (!a.ids.empty()) {  // whitespace-separated token ids, e.g. for a converted HF fixture
    std::ifstream in(a.ids);
    DF_CHECK(in.good(), "--ids: cannot read '" << a.ids << "'");
    std::vector<int64_t> ids;
    for (int64_t id; in >> id && static_cast<int64_t>(ids.size()) < a.seq_len;) {
      DF_CHECK(id >= 0 && id < model_vocab, "--ids '" << a.ids << "': id " << id << " outside the model's vocab_size "
                                                       << model_vocab);
      ids.push_back(id);
    }
    DF_CHECK(ids.size() >= 2, "--ids '" << a.ids << "' holds " << ids.size() << " ids; need at least 2");
    return torch::tensor(ids, torch::kInt64).unsqueeze(0);
  }
  DF_CHECK(!a.tokenizer.empty(), "kernel-check --weights with --shards or --text needs --tokenizer");
  Tokenizer tokenizer(a.tokenizer);
  DF_CHECK(tokenizer.vocab_size() <= model_vocab, "tokenizer '" << a.tokenizer << "' has " << tokenizer.vocab_size()
                                                  << " pieces but the model in '" << a.weights << "' has vocab_size "
                                                  << model_vocab << "; its ids would index past the embedding");
  if (!a.shards.empty()) {
    DataConfig data;
    data.shards_dir = a.shards;
    data.tokenizer = a.tokenizer;
    data.seq_len = a.seq_len;
    data.batch_size = a.batch;
    PackedLoader loader(data, a.split);
    return loader.Next().input_ids_BL;
  }
  std::ifstream in(a.text);
  DF_CHECK(in.good(), "--text: cannot read '" << a.text << "'");
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::vector<int> ids;
  tokenizer.Encode(buffer.str(), &ids);
  if (tokenizer.bos_id() >= 0) ids.insert(ids.begin(), tokenizer.bos_id());
  DF_CHECK(ids.size() >= 2, "--text '" << a.text << "' gives " << ids.size() << " tokens; need at least 2");
  const int64_t length = std::min<int64_t>(a.seq_len, static_cast<int64_t>(ids.size()));
  return torch::tensor(std::vector<int64_t>(ids.begin(), ids.begin() + length), torch::kInt64).unsqueeze(0);
}

// performer, lfk, ... as named with --options; darkformer twice: M = I and M = whitening (Calibrate).
std::vector<KernelSpec> Specs(const KernelCheckArgs& a) {
  std::vector<KernelSpec> specs;
  for (const auto& name : a.kernels) {
    if (name != "darkformer") {
      specs.push_back({name, name, a.options, false});
      continue;
    }
    for (const std::string init : {"identity", "whitening"}) {
      auto node = YAML::Load(a.options);
      node["init"] = init;
      specs.push_back({"darkformer(" + init + ")", name, YAML::Dump(node), init == "whitening"});
    }
  }
  return specs;
}

// A layer's learned Sigma = M^T M (N x D x D) where the checkpoint's kernel holds a square M
// (darkformer); undefined otherwise.
torch::Tensor LearnedSigma(const std::string& weights, int64_t layer) {
  if (ReadWeightsAttentionYaml(weights).find("darkformer") == std::string::npos) return {};
  torch::Tensor m_NRD;
  try {
    m_NRD = ReadTensorH5(weights, fmt::format("layers.{}.self_attn.kernel.M", layer)).to(torch::kFloat64);
  } catch (const Error&) {
    return {};  // this layer runs another kernel (attention.per_layer)
  }
  if (m_NRD.size(1) != m_NRD.size(2)) return {};  // rank < d: Sigma is singular, no density to weigh by
  return torch::matmul(m_NRD.transpose(1, 2), m_NRD);
}

// The checkpoint's model, built exact: a kernel's trained state is read where present, not used.
GemmaModel LoadExact(const std::string& weights, const GemmaConfig& config) {
  GemmaModel model(config);
  WeightsLoadOptions load;
  load.kernel_state_optional = true;
  LoadWeights(weights, *model, load);
  model->eval();
  return model;
}

}  // namespace

void ModelDiagnostics(const KernelCheckArgs& a) {
  JsonLinesFile json(a.json);
  torch::NoGradGuard no_grad;
  torch::manual_seed(a.seed);
  const auto config = ReadWeightsConfig(a.weights);
  auto model = LoadExact(a.weights, config);
  const auto ids_BL = InputIds(a, config.vocab_size);
  const auto specs = Specs(a);
  const int64_t length = ids_BL.size(1), batch = ids_BL.size(0);
  std::cout << fmt::format("{}: {} layers, H={} (kv {}), D={}, s={:.4g}; batch {}x{}; options {}; reference: exact causal "
                           "softmax (no soft-cap, no window)\n",
                           a.weights, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
                           config.head_dim, config.QueryScale(), batch, length, a.options);
  std::string header = fmt::format("{:>5} {:>10} {:>8} {:>10} {:>8}", "layer", "cond(x)", "erank(x)", "cond(y)", "erank(y)");
  for (const auto& spec : specs) header += fmt::format(" {:>22}", spec.label);
  std::cout << "  relative L2 error of the attention output vs exact; cond = lambda_max/lambda_min, erank = exp(entropy)\n"
            << header << "\n";
  const int64_t heads = config.num_attention_heads, kv_heads = config.num_key_value_heads, d = config.head_dim;
  model->ForEachAttentionInput(ids_BL, [&](const GemmaModelImpl::AttentionInput& in) {
    const auto [q_BHLD, k_BHLD] = in.attention.QueriesKeys(in.h_BLE, in.rope);
    const auto v_BHLD = in.attention.v_proj(in.h_BLE).view({batch, length, kv_heads, d}).transpose(1, 2)
                            .repeat_interleave(heads / kv_heads, /*dim=*/1);
    const auto r = DiagnoseLayer(q_BHLD, k_BHLD, v_BHLD, in.attention.call().scale, in.layer, specs);
    std::string row = fmt::format("{:>5} {:>10.4g} {:>8.3f} {:>10.4g} {:>8.3f}", in.layer, r.x.condition_number,
                                  r.x.effective_rank, r.y.condition_number, r.y.effective_rank);
    Json errors = Json::object();
    for (const auto& e : r.errors) {
      row += fmt::format(" {:>22.4g}", e.relative_error);
      errors[e.label] = e.relative_error;
    }
    json.Write({{"layer", in.layer}, {"cond_x", r.x.condition_number}, {"erank_x", r.x.effective_rank},
                     {"trace_x", r.x.trace}, {"cond_y", r.y.condition_number}, {"erank_y", r.y.effective_rank},
                     {"trace_y", r.y.trace}, {"relative_error", errors}});
    std::cout << row << "\n";
  });
  SayWritten(json);
}

// Parameters from the layer's batch; for a checkpoint that holds M, its Sigma = M^T M as a proposal
// beside proposal I (learned_proposal.h).
void FavorEstimators(const KernelCheckArgs& a) {
  JsonLinesFile json(a.json);
  torch::NoGradGuard no_grad;
  const auto config = ReadWeightsConfig(a.weights);
  auto model = LoadExact(a.weights, config);
  const auto ids_BL = InputIds(a, config.vocab_size);
  std::cout << fmt::format("{}: FAVOR estimators of exp(x.y) on each layer's x = sqrt(s) q, y = sqrt(s) k; batch {}x{}; "
                           "parameters from the layer's batch (pooled over heads); {} causal pairs, {} draws, iid omega\n",
                           a.weights, ids_BL.size(0), ids_BL.size(1), a.synthetic.pairs, a.draws);
  std::cout << fmt::format("{:>5} {:>14} {:>5} {:>11} {:>11} {:>11}\n", "layer", "estimator", "m", "rel.err", "rel.var",
                           "exact var");
  const int64_t heads = config.num_attention_heads, kv_heads = config.num_key_value_heads;
  model->ForEachAttentionInput(ids_BL, [&](const GemmaModelImpl::AttentionInput& in) {
    const auto [q_BHLD, k_BHLD] = in.attention.QueriesKeys(in.h_BLE, in.rope);
    const auto k_rep = k_BHLD.size(1) == heads ? k_BHLD : k_BHLD.repeat_interleave(heads / kv_heads, /*dim=*/1);
    const auto stats = CompareFavorEstimatorsOnLayer(q_BHLD, k_rep, in.attention.call().scale, a.num_features,
                                                     a.synthetic.pairs, a.draws, a.seed + 7919 * in.layer);
    for (const auto& s : stats) {
      std::cout << fmt::format("{:>5} {:>14} {:>5} {:>11.4g} {:>11.4g} {:>11.4g}\n", in.layer, s.estimator, s.num_features,
                               s.relative_error, s.relative_variance, s.closed_form_variance);
      json.Write({{"layer", in.layer}, {"estimator", s.estimator}, {"num_features", s.num_features},
                       {"relative_error", s.relative_error}, {"relative_variance", s.relative_variance},
                       {"variance", s.variance}, {"closed_form_variance", s.closed_form_variance}});
    }
    const auto sigma_NDD = LearnedSigma(a.weights, in.layer);
    if (!sigma_NDD.defined()) return;
    for (const auto& p : CompareLearnedProposalOnLayer(q_BHLD, k_rep, in.attention.call().scale, sigma_NDD, a.num_features,
                                                       a.synthetic.pairs, a.draws, a.seed + 7919 * in.layer)) {
      const auto& s = p.stats;
      std::cout << fmt::format("{:>5} {:>14} {:>5} {:>11.4g} {:>11.4g} {:>11.4g}  (min eigenvalue of Sigma {:.3f})\n",
                               in.layer, s.estimator, s.num_features, s.relative_error, s.relative_variance,
                               s.closed_form_variance, p.sigma_min_eigenvalue);
      json.Write({{"layer", in.layer}, {"estimator", s.estimator}, {"num_features", s.num_features},
                       {"relative_error", s.relative_error}, {"relative_variance", s.relative_variance},
                       {"variance", s.variance}, {"closed_form_variance", s.closed_form_variance},
                       {"sigma_min_eigenvalue", p.sigma_min_eigenvalue}});
    }
  });
  SayWritten(json);
}

}  // namespace darkformer
