// Metadata of prepared token shards: one ShardRecord per source file (also written alone as that
// shard's "<name>.done.yaml" commit marker), and the DatasetManifest (manifest.yaml) over them all.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>
#include <vector>

#include "data/c4_reader.h"
#include "data/tokenizer.h"

namespace darkformer {

inline constexpr char kManifestFileName[] = "manifest.yaml";
inline constexpr int kManifestVersion = 1;
// Labelled datasets (`prepare --labelled`) are version 2, so a build that cannot read their labels
// refuses them rather than training on shifted inputs.
inline constexpr int kLabelledManifestVersion = 2;

// One split ("train" or "val") of one shard.
struct ShardSplit {
  std::string stem;  // file stem relative to the shards dir, e.g. "shard-00003.train"
  int64_t documents = 0;
  int64_t tokens = 0;
  // Labelled shards: the longest record's tokens and its source line (or .npy row), so a loader
  // whose seq_len is too short can name it.
  int64_t longest = 0;
  int64_t longest_line = 0;
};

// What one source file became.
struct ShardRecord {
  std::string name;         // "shard-00003"
  std::string source;       // the source file as given (after glob expansion)
  int64_t source_bytes = 0; // its size on disk, to notice a changed source on resume
  bool validation_source = false;  // from --val-input: every document goes to the val split
  std::string settings;     // the prepare settings that shaped it (PrepareSettingsKey)
  C4ReadCounts counts;
  int64_t empty_documents = 0;  // texts that tokenized to nothing (not written)
  int64_t truncated_documents = 0;  // cut to max_document_tokens (written shortened)
  ShardSplit train;
  ShardSplit val;

  YAML::Node ToYaml() const;
  // `where` names the file the node came from, for errors.
  static ShardRecord FromYaml(const YAML::Node& node, const std::string& where);
};

struct DatasetManifest {
  int version = kManifestVersion;
  TokenizerIdentity tokenizer;
  int bytes_per_token = 4;
  int bos_id = -1;
  int eos_id = -1;
  int pad_id = -1;
  uint64_t seed = 0;
  double val_fraction = 0.0;
  int64_t max_document_tokens = 0;  // prepare --max-document-tokens; 0: documents whole
  // Every shard has a labels file (data/label_shard.h): records are rows, not a token stream.
  bool labelled = false;
  std::vector<ShardRecord> shards;

  // Sums over shards.
  C4ReadCounts TotalCounts() const;
  int64_t TotalTokens(bool val) const;
  int64_t TotalDocuments(bool val) const;
  int64_t TotalTruncatedDocuments() const;

  YAML::Node ToYaml() const;
  static DatasetManifest FromYaml(const YAML::Node& node, const std::string& where);
  // Reads "<dir>/manifest.yaml"; a missing one is an error saying prepare has not finished there.
  static DatasetManifest Load(const std::string& dir);
  void Save(const std::string& dir) const;
};

}  // namespace darkformer
