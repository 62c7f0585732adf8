// Atomic, complete training checkpoints (see checkpoint.h).
#include "train/checkpoint.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "model/h5_tensor_io.h"
#include "model/weights_io.h"
#include "train/optimizer_state_io.h"
#include "util/build_version.h"

namespace darkformer {

namespace fs = std::filesystem;

namespace {

constexpr const char* kRngDataset = "trainer/rng_cpu";
// Checkpoints written before the optimizer state was streamed hold it as one dataset: the bytes of
// a torch::serialize archive of the whole optimizer (positional, read whole into memory).
constexpr const char* kLegacyOptimizerDataset = "trainer/optimizer";

void LoadLegacyOptimizer(const H5Reader& file, torch::optim::Optimizer& optimizer) {
  const auto bytes = file.Read(kLegacyOptimizerDataset);
  DF_CHECK(bytes.scalar_type() == torch::kUInt8 && bytes.dim() == 1,
           file.path() << ": '" << kLegacyOptimizerDataset << "' is not a byte string");
  std::istringstream in(std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel())));
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  optimizer.load(archive);
}

}  // namespace

std::vector<std::pair<int64_t, std::string>> ListCheckpoints(const std::string& run_dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  const fs::path dir = fs::path(run_dir) / "checkpoints";
  std::error_code error;
  if (!fs::is_directory(dir, error)) return found;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const auto name = entry.path().filename().string();
    constexpr size_t kPrefix = 5, kSuffix = 3;  // "step_", ".h5"
    if (name.size() <= kPrefix + kSuffix || name.rfind("step_", 0) != 0 ||
        name.compare(name.size() - kSuffix, kSuffix, ".h5") != 0) {
      continue;
    }
    const auto digits = name.substr(kPrefix, name.size() - kPrefix - kSuffix);
    if (digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    found.emplace_back(std::stoll(digits), entry.path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::string CheckpointPath(const std::string& run_dir, int64_t step) {
  return (fs::path(run_dir) / "checkpoints" / fmt::format("step_{:08d}.h5", step)).string();
}

std::optional<std::string> LatestCheckpoint(const std::string& run_dir) {
  const auto all = ListCheckpoints(run_dir);
  if (all.empty()) return std::nullopt;
  return all.back().second;
}

void SaveCheckpoint(const std::string& path, GemmaModelImpl& model, torch::optim::Optimizer& optimizer,
                    const TrainerState& state, const std::string& attention_yaml) {
  fs::create_directories(fs::path(path).parent_path());
  YAML::Emitter meta;
  meta << YAML::BeginMap;
  TrainerState::VisitFields([&](const char* name, const auto& field) { meta << YAML::Key << name << YAML::Value << field; },
                            state);
  meta << YAML::Key << "loader" << YAML::Value << state.loader.ToYaml() << YAML::EndMap;
  std::map<std::string, std::string> attributes = {{"format", "darkformer-weights"},
                                                   {"config_yaml", model.config().ToYamlText()},
                                                   {"source", "darkformer checkpoint"},
                                                   {"darkformer_version", BuildVersion()},
                                                   {"trainer_state", meta.c_str()}};
  if (!attention_yaml.empty()) attributes["attention_yaml"] = attention_yaml;
  const auto rng = at::detail::getDefaultCPUGenerator().get_state();

  // Every tensor goes to the file straight from the model or the optimizer, one at a time: a
  // checkpoint of a large model must not need a second copy of its weights and state in memory.
  H5SizeEstimate size;
  for (const auto& item : model.named_parameters()) size.AddTensor(item.value());
  for (const auto& item : model.named_buffers()) size.AddTensor(item.value());
  EstimateAdamWState(optimizer, size);
  size.AddTensor(rng);
  for (const auto& [key, value] : attributes) size.AddAttribute(value);
  WriteH5Atomically(path, size, [&](H5Writer& file) {
    for (const auto& [key, value] : attributes) file.WriteStringAttribute("", key, value);
    file.WriteIntAttribute("", "format_version", 1);
    for (const auto& item : model.named_parameters()) file.WriteTensor(item.key(), item.value());
    for (const auto& item : model.named_buffers()) file.WriteTensor(item.key(), item.value());
    WriteAdamWState(file, model, optimizer);
    file.WriteTensor(kRngDataset, rng);
  });
}

TrainerState LoadCheckpoint(const std::string& path, GemmaModelImpl& model, torch::optim::Optimizer& optimizer) {
  LoadWeights(path, model);
  const auto meta_text = ReadStringAttributeH5(path, "trainer_state");
  DF_CHECK(!meta_text.empty(), path << ": not a training checkpoint (no trainer_state attribute)");
  TrainerState s;
  YAML::Node meta;
  try {
    meta = YAML::Load(meta_text);
    TrainerState::VisitFields(
        [&](const char* name, auto& field) {
          // Fields added after a checkpoint was written keep their defaults.
          if (meta[name]) field = meta[name].as<std::decay_t<decltype(field)>>();
        },
        s);
  } catch (const YAML::Exception& e) {
    Fail(path + ": unreadable trainer_state attribute: " + e.what());
  }
  s.loader = LoaderState::FromYaml(meta["loader"], path + " (trainer_state.loader)");

  const H5Reader file(path);
  if (file.Exists(kLegacyOptimizerDataset)) {
    LoadLegacyOptimizer(file, optimizer);
  } else {
    DF_CHECK(file.Exists(kAdamWStateGroup), path << ": no optimizer state (neither '" << kAdamWStateGroup
                                                 << "' nor '" << kLegacyOptimizerDataset << "')");
    ReadAdamWState(file, model, optimizer);
  }
  DF_CHECK(file.Exists(kRngDataset), path << ": no dataset '" << kRngDataset << "'");
  auto generator = at::detail::getDefaultCPUGenerator();
  generator.set_state(file.Read(kRngDataset));
  return s;
}

void RemoveStaleCheckpointFiles(const std::string& run_dir) {
  const fs::path dir = fs::path(run_dir) / "checkpoints";
  if (!fs::exists(dir)) return;
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".tmp") stale.push_back(entry.path());
  }
  for (const auto& path : stale) fs::remove(path);
}

}  // namespace darkformer
