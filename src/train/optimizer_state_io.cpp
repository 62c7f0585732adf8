// Streamed AdamW checkpoint state (see optimizer_state_io.h).
#include "train/optimizer_state_io.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "util/error.h"

namespace darkformer {

namespace {

using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;

const std::vector<std::string>& MomentNames() {
  static const std::vector<std::string> names = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return names;
}

std::string GroupPath(size_t index) { return std::string(kAdamWStateGroup) + "/param_groups/" + std::to_string(index); }
std::string StatePath() { return std::string(kAdamWStateGroup) + "/state"; }
std::string StatePath(const std::string& param) { return StatePath() + "/" + param; }

// The optimizer holds the model's parameter tensors themselves; their TensorImpl is what its state
// map is keyed by, and the name is what the file is keyed by.
std::map<const void*, std::string> ParameterNames(GemmaModelImpl& model) {
  std::map<const void*, std::string> names;
  for (const auto& item : model.named_parameters()) names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  return names;
}

const std::string& NameOf(const std::map<const void*, std::string>& names, const torch::Tensor& param,
                          const std::string& file) {
  const auto it = names.find(param.unsafeGetTensorImpl());
  DF_CHECK(it != names.end(), file << ": the optimizer holds a tensor of shape " << param.sizes()
                                   << " that is not a parameter of the model");
  return it->second;
}

AdamWOptions& OptionsOf(torch::optim::OptimizerParamGroup& group, const std::string& file) {
  auto* options = dynamic_cast<AdamWOptions*>(&group.options());
  DF_CHECK(options != nullptr, file << ": checkpoints hold AdamW optimizer state only; this optimizer is not AdamW");
  return *options;
}

const AdamWParamState& StateOf(const torch::optim::OptimizerParamState& state, const std::string& name,
                               const std::string& file) {
  const auto* adamw = dynamic_cast<const AdamWParamState*>(&state);
  DF_CHECK(adamw != nullptr, file << ": optimizer state of '" << name << "' is not AdamW state");
  return *adamw;
}

std::string JoinLines(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& line : lines) out += line + "\n";
  return out;
}

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Reads `dataset` into `existing` when that can hold it as it is, else into a new tensor of the
// stored dtype on the parameter's device (what AdamW itself would have allocated).
torch::Tensor ReadMoment(const H5Reader& file, const std::string& dataset, const torch::Tensor& existing,
                         const torch::Tensor& param) {
  const auto info = file.Info(dataset);
  const bool reuse = existing.defined() && existing.sizes() == c10::IntArrayRef(info.shape) &&
                     existing.scalar_type() == info.dtype && existing.device() == param.device();
  const auto target = reuse ? existing : torch::empty(info.shape, torch::TensorOptions(info.dtype).device(param.device()));
  file.ReadInto(dataset, target);
  CheckFinite(target, file.path(), dataset);
  return target;
}

double RequiredDouble(const H5Reader& file, const std::string& group, const char* name) {
  const auto value = file.DoubleAttribute(group, name);
  DF_CHECK(value.has_value(), file.path() << ": optimizer param group '" << group << "' has no attribute '" << name << "'");
  return *value;
}

}  // namespace

void EstimateAdamWState(const torch::optim::Optimizer& optimizer, H5SizeEstimate& size) {
  for (const auto& group : optimizer.param_groups()) {
    size.AddObject();
    size.AddBytes(64 * static_cast<int64_t>(group.params().size()));  // the names of its parameters
  }
  for (const auto& [key, state] : optimizer.state()) {
    const auto* adamw = dynamic_cast<const AdamWParamState*>(state.get());
    if (adamw == nullptr) continue;  // WriteAdamWState refuses it
    size.AddObject();  // the group and its step
    size.AddObject();
    for (const auto& moment : {adamw->exp_avg(), adamw->exp_avg_sq(), adamw->max_exp_avg_sq()}) {
      if (moment.defined()) size.AddTensor(moment);
    }
  }
}

void WriteAdamWState(H5Writer& file, GemmaModelImpl& model, const torch::optim::Optimizer& optimizer) {
  const auto& path = file.path();
  const auto names = ParameterNames(model);
  file.CreateGroup(StatePath());
  const auto& groups = optimizer.param_groups();
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto* options = dynamic_cast<const AdamWOptions*>(&groups[i].options());
    DF_CHECK(options != nullptr, path << ": checkpoints hold AdamW optimizer state only; this optimizer is not AdamW");
    std::vector<std::string> params;
    for (const auto& param : groups[i].params()) {
      const auto& name = NameOf(names, param, path);
      params.push_back(name);
      const auto it = optimizer.state().find(param.unsafeGetTensorImpl());
      if (it == optimizer.state().end()) continue;  // no step taken for it yet
      const auto& state = StateOf(*it->second, name, path);
      file.WriteTensor(StatePath(name) + "/step", torch::scalar_tensor(state.step(), torch::kInt64));
      const std::vector<torch::Tensor> moments = {state.exp_avg(), state.exp_avg_sq(), state.max_exp_avg_sq()};
      for (size_t m = 0; m < moments.size(); ++m) {
        if (moments[m].defined()) file.WriteTensor(StatePath(name) + "/" + MomentNames()[m], moments[m]);
      }
    }
    const auto group = GroupPath(i);
    file.CreateGroup(group);
    file.WriteDoubleAttribute(group, "lr", options->lr());
    file.WriteDoubleAttribute(group, "beta1", std::get<0>(options->betas()));
    file.WriteDoubleAttribute(group, "beta2", std::get<1>(options->betas()));
    file.WriteDoubleAttribute(group, "eps", options->eps());
    file.WriteDoubleAttribute(group, "weight_decay", options->weight_decay());
    file.WriteIntAttribute(group, "amsgrad", options->amsgrad() ? 1 : 0);
    file.WriteStringAttribute(group, "params", JoinLines(params));
  }
}

void ReadAdamWState(const H5Reader& file, GemmaModelImpl& model, torch::optim::Optimizer& optimizer) {
  const auto& path = file.path();
  const auto names = ParameterNames(model);
  auto& groups = optimizer.param_groups();
  const auto stored_groups = file.Groups(std::string(kAdamWStateGroup) + "/param_groups");
  DF_CHECK(stored_groups.size() == groups.size(), path << ": the checkpoint has " << stored_groups.size()
                                                       << " optimizer param group(s), the optimizer "
                                                       << groups.size());
  // First every check, from metadata alone: a checkpoint that does not fit leaves the optimizer
  // as it was (the trainer then tries an older checkpoint).
  std::map<std::string, torch::Tensor> params;  // name -> the parameter (no copy)
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto group = GroupPath(i);
    DF_CHECK(file.Exists(group), path << ": no optimizer param group '" << group << "'");
    OptionsOf(groups[i], path);
    std::vector<std::string> expected;
    for (const auto& param : groups[i].params()) {
      expected.push_back(NameOf(names, param, path));
      params[expected.back()] = param;
    }
    const auto stored = SplitLines(file.StringAttribute(group, "params").value_or(""));
    for (size_t k = 0; k < std::max(stored.size(), expected.size()); ++k) {
      const auto a = k < stored.size() ? stored[k] : "(none)", b = k < expected.size() ? expected[k] : "(none)";
      DF_CHECK(a == b, path << ": optimizer param group " << i << " differs from the run's: parameter " << k
                            << " is '" << a << "' in the checkpoint, '" << b
                            << "' in the optimizer (were train.trainable or train.no_decay changed?)");
    }
    for (const char* key : {"lr", "beta1", "beta2", "eps", "weight_decay"}) RequiredDouble(file, group, key);
  }
  const auto stored_state = file.Groups(StatePath());
  for (const auto& name : stored_state) {
    const auto it = params.find(name);
    DF_CHECK(it != params.end(), path << ": unexpected optimizer state for '" << name
                                      << "' (not a trainable parameter of the model)");
    const auto step = StatePath(name) + "/step";
    DF_CHECK(file.Exists(step), path << ": no dataset '" << step << "'");
    const auto step_info = file.Info(step);
    DF_CHECK(step_info.shape.empty() && step_info.dtype == torch::kInt64,
             path << ": '" << step << "' is not a scalar int64");
    for (const auto& moment : MomentNames()) {
      const auto dataset = StatePath(name) + "/" + moment;
      if (!file.Exists(dataset)) {
        DF_CHECK(moment == "max_exp_avg_sq", path << ": no dataset '" << dataset << "'");
        continue;
      }
      const auto info = file.Info(dataset);
      DF_CHECK(it->second.sizes() == c10::IntArrayRef(info.shape),
               path << ": tensor '" << dataset << "' has shape " << c10::IntArrayRef(info.shape)
                    << " in the file, but the parameter '" << name << "' has " << it->second.sizes());
    }
  }

  for (size_t i = 0; i < groups.size(); ++i) {
    const auto group = GroupPath(i);
    auto& options = OptionsOf(groups[i], path);
    options.lr(RequiredDouble(file, group, "lr"));
    options.betas({RequiredDouble(file, group, "beta1"), RequiredDouble(file, group, "beta2")});
    options.eps(RequiredDouble(file, group, "eps"));
    options.weight_decay(RequiredDouble(file, group, "weight_decay"));
    options.amsgrad(file.IntAttribute(group, "amsgrad").value_or(0) != 0);
  }
  const std::set<std::string> with_state(stored_state.begin(), stored_state.end());
  auto& state = optimizer.state();
  for (const auto& [name, param] : params) {
    void* key = param.unsafeGetTensorImpl();
    if (!with_state.count(name)) {
      state.erase(key);  // as in the checkpoint: no step taken for it yet
      continue;
    }
    auto& slot = state[key];
    auto* adamw = dynamic_cast<AdamWParamState*>(slot.get());
    if (adamw == nullptr) {
      slot = std::make_unique<AdamWParamState>();
      adamw = static_cast<AdamWParamState*>(slot.get());
    }
    const auto dir = StatePath(name) + "/";
    adamw->step(file.Read(dir + "step").item<int64_t>());
    adamw->exp_avg(ReadMoment(file, dir + "exp_avg", adamw->exp_avg(), param));
    adamw->exp_avg_sq(ReadMoment(file, dir + "exp_avg_sq", adamw->exp_avg_sq(), param));
    adamw->max_exp_avg_sq(file.Exists(dir + "max_exp_avg_sq")
                              ? ReadMoment(file, dir + "max_exp_avg_sq", adamw->max_exp_avg_sq(), param)
                              : torch::Tensor());
  }
}

}  // namespace darkformer
