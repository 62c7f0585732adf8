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

std::vector<std::pair<int64_t, std::string>> ListCheckpoints(const std::string& run_dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  const fs::path dir = fs::path(run_dir) / "checkpoints";
  if (!fs::exists(dir)) return found;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const auto name = entry.path().filename().string();
    if (name.rfind("step_", 0) != 0 || entry.path().extension() != ".h5") continue;
    found.emplace_back(std::stoll(name.substr(5)), entry.path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace

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
  meta << YAML::BeginMap << YAML::Key << "step" << YAML::Value << state.step << YAML::Key << "tokens_seen"
       << YAML::Value << state.tokens_seen << YAML::Key << "spikes" << YAML::Value << state.spikes << YAML::Key << "previous_step_spiked" << YAML::Value
       << state.previous_step_spiked << YAML::Key
       << "skipped_updates" << YAML::Value << state.skipped_updates << YAML::Key << "min_loss" << YAML::Value
       << state.min_loss << YAML::Key << "best_eval_accuracy" << YAML::Value << state.best_eval_accuracy
       << YAML::Key << "wall_seconds" << YAML::Value << state.wall_seconds << YAML::Key << "spike_window"
       << YAML::Value << state.spike_window << YAML::Key << "loader" << YAML::Value << state.loader.ToYaml()
       << YAML::EndMap;
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
  const auto meta = YAML::Load(meta_text);
  TrainerState s;
  s.step = meta["step"].as<int64_t>();
  s.tokens_seen = meta["tokens_seen"].as<int64_t>();
  s.spikes = meta["spikes"].as<int64_t>();
  s.previous_step_spiked = meta["previous_step_spiked"] && meta["previous_step_spiked"].as<bool>();
  s.skipped_updates = meta["skipped_updates"].as<int64_t>();
  s.min_loss = meta["min_loss"].as<double>();
  s.best_eval_accuracy = meta["best_eval_accuracy"].as<double>();
  s.wall_seconds = meta["wall_seconds"].as<double>();
  s.spike_window = meta["spike_window"].as<std::string>();
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
