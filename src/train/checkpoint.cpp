// Atomic, complete training checkpoints (see checkpoint.h).
#include "train/checkpoint.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "model/weights_io.h"

namespace darkformer {

namespace fs = std::filesystem;

namespace {

torch::Tensor BytesTensor(const std::string& bytes) {
  auto t = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

std::string TensorBytes(const torch::Tensor& t) {
  return std::string(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()));
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
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& item : model.named_parameters()) tensors[item.key()] = item.value();
  for (const auto& item : model.named_buffers()) tensors[item.key()] = item.value();
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream optimizer_bytes;
  archive.save_to(optimizer_bytes);
  tensors["trainer/optimizer"] = BytesTensor(optimizer_bytes.str());
  tensors["trainer/rng_cpu"] = at::detail::getDefaultCPUGenerator().get_state();

  YAML::Emitter meta;
  meta << YAML::BeginMap;
  TrainerState::VisitFields([&](const char* name, const auto& field) { meta << YAML::Key << name << YAML::Value << field; },
                            state);
  meta << YAML::Key << "loader" << YAML::Value << state.loader.ToYaml() << YAML::EndMap;
  std::map<std::string, std::string> attributes = {{"format", "darkformer-weights"},
                                                   {"config_yaml", model.config().ToYamlText()},
                                                   {"source", "darkformer checkpoint"},
                                                   {"trainer_state", meta.c_str()}};
  if (!attention_yaml.empty()) attributes["attention_yaml"] = attention_yaml;
  WriteTensorsH5(path, tensors, attributes, {{"format_version", 1}});
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

  const auto optimizer_bytes = TensorBytes(ReadTensorH5(path, "trainer/optimizer"));
  torch::serialize::InputArchive archive;
  std::istringstream in(optimizer_bytes);
  archive.load_from(in);
  optimizer.load(archive);
  auto generator = at::detail::getDefaultCPUGenerator();
  generator.set_state(ReadTensorH5(path, "trainer/rng_cpu"));
  return s;
}

void PruneCheckpoints(const std::string& run_dir, int64_t keep) {
  auto all = ListCheckpoints(run_dir);
  for (size_t i = 0; i + keep < all.size(); ++i) fs::remove(all[i].second);
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
