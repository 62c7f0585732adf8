// HDF5 weights I/O (see weights_io.h).
#include "model/weights_io.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <set>

#include "model/h5_tensor_io.h"
#include "util/error.h"

namespace darkformer {

namespace {

constexpr const char* kFormat = "darkformer-weights";

// Everything the model saves: parameters and persistent buffers, by module path. The map holds
// references to the model's own tensors, not copies.
std::map<std::string, torch::Tensor> ModelState(GemmaModelImpl& model) {
  std::map<std::string, torch::Tensor> state;
  for (const auto& item : model.named_parameters()) state[item.key()] = item.value();
  for (const auto& item : model.named_buffers()) state[item.key()] = item.value();
  return state;
}

bool IsKernelState(const std::string& name) { return name.find(".kernel.") != std::string::npos; }

}  // namespace

std::string ReadStringAttributeH5(const std::string& path, const std::string& name) {
  DF_CHECK(std::filesystem::exists(path), "weights file not found: " << path);
  return H5Reader(path).StringAttribute("", name).value_or("");
}

GemmaConfig ReadWeightsConfig(const std::string& path) {
  const auto format = ReadStringAttributeH5(path, "format");
  DF_CHECK(format == kFormat, path << ": not a darkformer weights file (attribute 'format' is '" << format
                                   << "', expected '" << kFormat << "')");
  const auto yaml = ReadStringAttributeH5(path, "config_yaml");
  DF_CHECK(!yaml.empty(), path << ": missing attribute 'config_yaml'");
  return GemmaConfig::FromYamlText(yaml, path + " (attribute config_yaml)");
}

std::string ReadWeightsAttentionYaml(const std::string& path) { return ReadStringAttributeH5(path, "attention_yaml"); }

std::map<std::string, torch::Tensor> ReadTensorsH5(const std::string& path) {
  const H5Reader file(path);
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& name : file.Datasets()) tensors[name] = file.Read(name);
  return tensors;
}

torch::Tensor ReadTensorH5(const std::string& path, const std::string& dataset) {
  const H5Reader file(path);
  DF_CHECK(file.Exists(dataset), path << ": no dataset '" << dataset << "'");
  return file.Read(dataset);
}

void WriteTensorsH5(const std::string& path, const std::map<std::string, torch::Tensor>& tensors,
                    const std::map<std::string, std::string>& string_attributes,
                    const std::map<std::string, int64_t>& int_attributes, const H5WriteOptions& options) {
  H5SizeEstimate size;
  for (const auto& [name, tensor] : tensors) size.AddTensor(tensor);
  for (const auto& [name, value] : string_attributes) size.AddAttribute(value);
  WriteH5Atomically(path, size, [&](H5Writer& file) {
    for (const auto& [key, value] : string_attributes) file.WriteStringAttribute("", key, value);
    for (const auto& [key, value] : int_attributes) file.WriteIntAttribute("", key, value);
    // "group/name" datasets (checkpoint extras) live in groups, which loaders of weights skip.
    for (const auto& [name, tensor] : tensors) file.WriteTensor(name, tensor);
  }, options);
}

void SaveWeights(const std::string& path, GemmaModelImpl& model, const std::string& attention_yaml) {
  std::map<std::string, std::string> attributes = {
      {"format", kFormat}, {"config_yaml", model.config().ToYamlText()}, {"source", "darkformer"}};
  if (!attention_yaml.empty()) attributes["attention_yaml"] = attention_yaml;
  WriteTensorsH5(path, ModelState(model), attributes, {{"format_version", 1}});
}

void LoadWeights(const std::string& path, GemmaModelImpl& model, const WeightsLoadOptions& options) {
  const auto file_config = ReadWeightsConfig(path);
  const auto diff = model.config().Diff(file_config);
  DF_CHECK(diff.empty(), path << ": model config differs from the file's (model vs file): " << diff);
  // Everything is checked from the datasets' metadata before any value is read, so a bad file
  // leaves the model untouched; then each tensor is read straight into its parameter or buffer.
  const H5Reader file(path);
  const auto names = file.Datasets();
  const std::set<std::string> in_file(names.begin(), names.end());
  auto state = ModelState(model);
  std::vector<std::string> missing, kept_init;
  for (const auto& [name, target] : state) {
    if (!in_file.count(name)) {
      (options.kernel_state_optional && IsKernelState(name) ? kept_init : missing).push_back(name);
      continue;
    }
    const auto info = file.Info(name);
    DF_CHECK(target.sizes() == c10::IntArrayRef(info.shape),
             path << ": tensor '" << name << "' has shape " << c10::IntArrayRef(info.shape)
                  << " in the file, but the model expects " << target.sizes());
    DF_CHECK(!target.is_floating_point() || c10::isFloatingType(info.dtype),
             path << ": tensor '" << name << "' is " << c10::toString(info.dtype)
                  << " in the file, not floating point; the model's " << name << " is "
                  << c10::toString(target.scalar_type()));
  }
  if (!missing.empty()) {
    std::string list;
    for (const auto& n : missing) list += (list.empty() ? "" : ", ") + n;
    Fail(path + ": missing tensor(s): " + list);
  }
  std::vector<std::string> skipped;
  for (const auto& name : names) {
    if (state.count(name)) continue;
    DF_CHECK(options.kernel_state_optional && IsKernelState(name),
             path << ": unexpected tensor '" << name << "' (the model has no such parameter or buffer)");
    skipped.push_back(name);
  }
  for (auto& [name, target] : state) {
    if (!in_file.count(name)) continue;
    file.ReadInto(name, target);
    CheckFinite(target, path, name);  // a NaN or Inf weight is refused, never loaded
  }
  if (!kept_init.empty())
    spdlog::info("{}: {} kernel tensor(s) not in the file keep their initialisation (first: {})", path,
                 kept_init.size(), kept_init.front());
  if (!skipped.empty())
    spdlog::info("{}: {} kernel tensor(s) of another kernel skipped (first: {})", path, skipped.size(), skipped.front());
}

}  // namespace darkformer
