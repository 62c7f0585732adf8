// Loading run configs with base files and overrides (see run_config.h).
#include "train/run_config.h"

#include <filesystem>
#include <algorithm>

#include "attention/kernel_registry.h"
#include "attention/ops/cuda_op.h"
#include "attention/ops/cuda_op_device.h"
#include "distributed/launch_environment.h"
#include "train/size_terms.h"
#include "util/config_file_lines.h"

namespace darkformer {

namespace fs = std::filesystem;

YAML::Node MergeYaml(const YAML::Node& base, const YAML::Node& overlay) {
  if (!overlay.IsMap() || !base.IsMap()) return YAML::Clone(overlay);
  YAML::Node merged = YAML::Clone(base);
  for (const auto& entry : overlay) {
    const auto key = entry.first.as<std::string>();
    merged[key] = merged[key] ? MergeYaml(merged[key], entry.second) : YAML::Clone(entry.second);
  }
  return merged;
}

// op: cuda runs on a CUDA device only, in a build with kernels for its architecture: a run elsewhere
// is refused at load, naming the key.
static void CheckCudaOp(const RunConfig& c, const std::vector<std::string>& kernels, const ConfigReader& attention) {
  const bool on_cuda =
      c.train.device == TrainDevice::kCuda || (c.train.device == TrainDevice::kAuto && torch::cuda::is_available());
  for (const auto& name : kernels) {
    const auto section = c.attention.options.IsMap() ? c.attention.options[name] : YAML::Node();
    if (!section || !section.IsMap() || !section["op"] || section["op"].Scalar() != "cuda") continue;
    const auto key = attention.KeyPath(name) + ".op";
    DF_CHECK(on_cuda, "config key '" << key << "': op: cuda runs on a CUDA device; this run computes on the CPU (train.device "
                                     << (c.train.device == TrainDevice::kCpu ? "cpu" : "auto, and no GPU is visible")
                                     << "); use op: auto");
    DF_CHECK(CudaOpBuilt(), "config key '" << key << "': op: cuda: this build has no CUDA kernels (CMake found no nvcc); use op: auto");
    const auto launch = LaunchEnvironment::FromProcessEnvironment();  // the run computes on cuda:LOCAL_RANK
    const auto problem = CudaOpDeviceProblem(launch ? launch->local_rank : 0);
    DF_CHECK(problem.empty(), "config key '" << key << "': op: cuda: " << problem);
  }
}

// Records the line of every key of `node` (a file's own document) under `prefix`, over what a base
// file recorded: the merge's order, so each key path keeps the file that gave its value.
static void RecordKeyLines(const YAML::Node& node, const std::string& prefix, const std::string& file,
                           std::map<std::string, KeyLine>* lines) {
  if (!node.IsMap()) return;
  for (const auto& entry : node) {
    const auto key = entry.first.as<std::string>();
    if (prefix.empty() && key == "base") continue;
    const auto key_path = prefix.empty() ? key : prefix + "." + key;
    (*lines)[key_path] = {file, entry.first.Mark().line + 1};
    RecordKeyLines(entry.second, key_path, file, lines);
  }
}

static YAML::Node LoadWithBases(const std::string& path, int depth, std::map<std::string, KeyLine>* lines) {
  DF_CHECK(depth < 16, path << ": `base:` chain deeper than 16 files (a cycle?)");
  DF_CHECK(fs::exists(path), "config file not found: " << path);
  DF_CHECK(!fs::is_directory(path), path << ": is a directory, not a config file");
  YAML::Node node;
  try {
    node = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    Fail(path + ": invalid YAML: " + e.what());
  }
  if (!node.IsMap() || !node["base"]) {
    RecordKeyLines(node, "", path, lines);
    return node;
  }
  // `base:` is one file or a list of files merged in order (later ones win); this file wins over all.
  const auto bases = node["base"];
  std::vector<std::string> base_files;
  if (bases.IsScalar()) {
    base_files.push_back(bases.Scalar());
  } else if (bases.IsSequence()) {
    for (const auto& entry : bases) {
      DF_CHECK(entry.IsScalar(), path << ": config key 'base' (line " << entry.Mark().line + 1
                                      << "): list entries must be file paths, got " << YamlTypeName(entry));
      base_files.push_back(entry.Scalar());
    }
  } else {
    Fail(path + ": config key 'base' (line " + std::to_string(bases.Mark().line + 1) +
         ") must be a file path or a list of file paths, got " + YamlTypeName(bases));
  }
  YAML::Node merged(YAML::NodeType::Map);
  for (const auto& base : base_files) {
    merged = MergeYaml(merged, LoadWithBases((fs::path(path).parent_path() / base).string(), depth + 1, lines));
  }
  RecordKeyLines(node, "", path, lines);
  node.remove("base");
  return MergeYaml(merged, node);
}

void ApplyOverride(YAML::Node& root, const std::string& assignment) {
  const auto eq = assignment.find('=');
  DF_CHECK(eq != std::string::npos && eq > 0, "--set expects key.path=value, got '" << assignment << "'");
  const std::string path = assignment.substr(0, eq);
  YAML::Node value;
  try {
    value = YAML::Load(assignment.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    Fail("--set " + assignment + ": value is not valid YAML: " + e.what());
  }
  std::vector<std::string> keys;
  size_t start = 0;
  while (true) {
    const auto dot = path.find('.', start);
    keys.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  // Wrap the value in maps from the innermost key out. reset() rebinds a handle; yaml-cpp's
  // operator= would instead overwrite the node it refers to.
  YAML::Node overlay = value;
  for (auto key = keys.rbegin(); key != keys.rend(); ++key) {
    DF_CHECK(!key->empty(), "--set " << assignment << ": empty key in path '" << path << "'");
    YAML::Node wrap(YAML::NodeType::Map);
    wrap[*key] = overlay;
    overlay.reset(wrap);
  }
  root = MergeYaml(root, overlay);
}

RunConfig RunConfig::Read(const ConfigReader& reader) {
  RunConfig c;
  c.model = GemmaConfig::FromConfig(reader.Child("model", "Gemma architecture (configs/model/*.yaml hold real ones)"));
  const auto attention = reader.Child(
      "attention", "each layer's kernel, and each kernel's options (attention.<kernel>), checked even when no layer uses it");
  c.attention = AttentionConfig::FromConfig(attention, c.model.num_hidden_layers);
  // Each kernel in use reads its option section now by its declarations (Options::Read, what the
  // kernel is built from later), so a bad kernel option fails at load naming its key path, and
  // nothing is built or drawn. Sections of kernels this run does not use are checked too: an
  // option that would be rejected once the kernel is switched on (a sweep axis, a finetune) is an
  // error today, not later. They read through `attention`, so their defaults join the run's (a
  // resume compares them filled in); a declaring reader reads every kernel's, declaring them all.
  std::vector<std::string> names;  // those in use first, then the other sections, each once
  const auto add = [&names](const std::string& name) {
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  };
  for (int64_t layer = 0; layer < c.model.num_hidden_layers; ++layer) add(c.attention.KernelForLayer(layer));
  for (const auto& name : KernelNames()) {
    if (reader.declaring() || (c.attention.options.IsMap() && c.attention.options[name])) add(name);
  }
  CheckKernelDrawsFit(c.attention, c.model);
  for (const auto& name : names) CheckKernelOptions(name, attention.Child(name, KeySpec(KernelDescription(name))));
  c.data = DataConfig::FromConfig(reader.Child("data", "the token stream: prepared shards or generated MQAR"));
  // RoPE could compute later positions, but the model declares it does not support them.
  DF_CHECK(c.data.seq_len <= c.model.max_position_embeddings,
           "config key '" << c.data.key_path << ".seq_len' (" << c.data.seq_len << ") exceeds 'model.max_position_embeddings' ("
                          << c.model.max_position_embeddings << "): raise the model's positions or shorten the sequences");
  c.train = TrainConfig::FromConfig(reader.Child("train", "the optimizer, schedule, checkpoints and numerics"));
  CheckCudaOp(c, names, attention);
  // train.seed is the run's seed (as in HF's and torchtitan's trainers): besides model init it
  // offsets the data order and every kernel's draws, so a sweep over train.seed varies all of a
  // run's randomness. Seed 0 leaves data.seed and the kernels' seeds as configured.
  c.attention.run_seed = c.train.seed;
  c.data.seed += static_cast<uint64_t>(c.train.seed) * 1000003u;
  c.eval = EvalConfig::FromConfig(reader.Child("eval", "validation loss during training"));
  c.log = LogConfig::FromConfig(reader.Child("log", KeySpec("where the run writes").Resumable()));
  reader.RejectUnknown();
  c.resolved = reader.node();
  c.defaults = reader.defaults_used();
  return c;
}

RunConfig RunConfig::FromNode(YAML::Node root, const std::string& origin) {
  try {
    return Read(ConfigReader(root, ""));
  } catch (const Error& e) {
    Fail(origin + ": " + e.what());
  }
}

RunConfig RunConfig::Load(const std::string& path, const std::vector<std::string>& overrides) {
  std::map<std::string, KeyLine> lines;
  auto root = LoadWithBases(path, 0, &lines);
  for (const auto& assignment : overrides) ApplyOverride(root, assignment);
  const ScopedFileOrigins file_lines(path, std::move(lines));  // errors name a key's file and line
  const ScopedSetOrigins origins(overrides);  // or a --set key's assignment, not a file line
  return FromNode(root, path);
}

}  // namespace darkformer
