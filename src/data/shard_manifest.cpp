// YAML (de)serialization of shard records and the dataset manifest (see shard_manifest.h).
#include "data/shard_manifest.h"

#include <filesystem>

#include "util/atomic_file.h"
#include "util/config_reader.h"
#include "util/error.h"

namespace darkformer {
namespace {

YAML::Node SplitToYaml(const ShardSplit& split) {
  YAML::Node node;
  node["stem"] = split.stem;
  node["documents"] = split.documents;
  node["tokens"] = split.tokens;
  if (split.longest > 0) {
    node["longest"] = split.longest;
    node["longest_line"] = split.longest_line;
  }
  return node;
}

ShardSplit SplitFromYaml(const YAML::Node& node, const std::string& where) {
  ShardSplit split;
  split.stem = RequiredField<std::string>(node, "stem", where);
  split.documents = RequiredField<int64_t>(node, "documents", where);
  split.tokens = RequiredField<int64_t>(node, "tokens", where);
  if (node["longest"]) {
    split.longest = RequiredField<int64_t>(node, "longest", where);
    split.longest_line = RequiredField<int64_t>(node, "longest_line", where);
  }
  return split;
}

YAML::Node CountsToYaml(const C4ReadCounts& c) {
  YAML::Node node;
  node["lines"] = c.lines;
  node["documents"] = c.documents;
  node["blank_lines"] = c.blank;
  node["malformed_lines"] = c.malformed;
  node["no_text_lines"] = c.no_text;
  node["text_bytes"] = c.text_bytes;
  return node;
}

C4ReadCounts CountsFromYaml(const YAML::Node& node, const std::string& where) {
  C4ReadCounts c;
  c.lines = RequiredField<int64_t>(node, "lines", where);
  c.documents = RequiredField<int64_t>(node, "documents", where);
  c.blank = RequiredField<int64_t>(node, "blank_lines", where);
  c.malformed = RequiredField<int64_t>(node, "malformed_lines", where);
  c.no_text = RequiredField<int64_t>(node, "no_text_lines", where);
  c.text_bytes = RequiredField<int64_t>(node, "text_bytes", where);
  return c;
}

}  // namespace

YAML::Node ShardRecord::ToYaml() const {
  YAML::Node node;
  node["name"] = name;
  node["source"] = source;
  node["source_bytes"] = source_bytes;
  node["validation_source"] = validation_source;
  node["settings"] = settings;
  node["read"] = CountsToYaml(counts);
  node["empty_documents"] = empty_documents;
  if (truncated_documents > 0) node["truncated_documents"] = truncated_documents;
  node["train"] = SplitToYaml(train);
  node["val"] = SplitToYaml(val);
  return node;
}

ShardRecord ShardRecord::FromYaml(const YAML::Node& node, const std::string& where) {
  ShardRecord r;
  r.name = RequiredField<std::string>(node, "name", where);
  std::string here = where + " (shard " + r.name + ")";
  r.source = RequiredField<std::string>(node, "source", here);
  r.source_bytes = RequiredField<int64_t>(node, "source_bytes", here);
  r.validation_source = RequiredField<bool>(node, "validation_source", here);
  r.settings = RequiredField<std::string>(node, "settings", here);
  r.counts = CountsFromYaml(node["read"], here + " read");
  r.empty_documents = RequiredField<int64_t>(node, "empty_documents", here);
  if (node["truncated_documents"]) r.truncated_documents = RequiredField<int64_t>(node, "truncated_documents", here);
  r.train = SplitFromYaml(node["train"], here + " train");
  r.val = SplitFromYaml(node["val"], here + " val");
  return r;
}

C4ReadCounts DatasetManifest::TotalCounts() const {
  C4ReadCounts total;
  for (const auto& s : shards) total += s.counts;
  return total;
}

int64_t DatasetManifest::TotalTokens(bool val) const {
  int64_t n = 0;
  for (const auto& s : shards) n += val ? s.val.tokens : s.train.tokens;
  return n;
}

int64_t DatasetManifest::TotalTruncatedDocuments() const {
  int64_t n = 0;
  for (const auto& s : shards) n += s.truncated_documents;
  return n;
}

int64_t DatasetManifest::TotalDocuments(bool val) const {
  int64_t n = 0;
  for (const auto& s : shards) n += val ? s.val.documents : s.train.documents;
  return n;
}

YAML::Node DatasetManifest::ToYaml() const {
  YAML::Node node;
  node["version"] = labelled ? kLabelledManifestVersion : kManifestVersion;
  node["tokenizer"]["hash"] = tokenizer.hash;
  node["tokenizer"]["vocab_size"] = tokenizer.vocab_size;
  node["tokenizer"]["path"] = tokenizer.path;
  node["bytes_per_token"] = bytes_per_token;
  node["bos_id"] = bos_id;
  node["eos_id"] = eos_id;
  node["pad_id"] = pad_id;
  node["seed"] = seed;
  node["val_fraction"] = val_fraction;
  if (labelled) node["labelled"] = true;
  if (max_document_tokens > 0) node["max_document_tokens"] = max_document_tokens;
  C4ReadCounts total = TotalCounts();
  YAML::Node totals = CountsToYaml(total);
  totals["skipped_lines"] = total.skipped();
  totals["train_documents"] = TotalDocuments(false);
  totals["train_tokens"] = TotalTokens(false);
  totals["val_documents"] = TotalDocuments(true);
  totals["val_tokens"] = TotalTokens(true);
  if (max_document_tokens > 0) totals["truncated_documents"] = TotalTruncatedDocuments();
  node["totals"] = totals;
  for (const auto& s : shards) node["shards"].push_back(s.ToYaml());
  return node;
}

DatasetManifest DatasetManifest::FromYaml(const YAML::Node& node, const std::string& where) {
  DatasetManifest m;
  m.version = RequiredField<int>(node, "version", where);
  DF_CHECK(m.version == kManifestVersion || m.version == kLabelledManifestVersion,
           where << ": manifest version " << m.version << ", this build reads " << kManifestVersion << " and "
                 << kLabelledManifestVersion);
  m.labelled = node["labelled"] && RequiredField<bool>(node, "labelled", where);
  DF_CHECK(m.labelled == (m.version == kLabelledManifestVersion),
           where << ": manifest version " << m.version << (m.labelled ? " with" : " without") << " labelled: true");
  m.tokenizer.hash = RequiredField<std::string>(node["tokenizer"], "hash", where + " tokenizer");
  m.tokenizer.vocab_size = RequiredField<int64_t>(node["tokenizer"], "vocab_size", where + " tokenizer");
  m.tokenizer.path = RequiredField<std::string>(node["tokenizer"], "path", where + " tokenizer");
  m.bytes_per_token = RequiredField<int>(node, "bytes_per_token", where);
  m.bos_id = RequiredField<int>(node, "bos_id", where);
  m.eos_id = RequiredField<int>(node, "eos_id", where);
  m.pad_id = RequiredField<int>(node, "pad_id", where);
  m.seed = RequiredField<uint64_t>(node, "seed", where);
  m.val_fraction = RequiredField<double>(node, "val_fraction", where);
  if (node["max_document_tokens"]) m.max_document_tokens = RequiredField<int64_t>(node, "max_document_tokens", where);
  if (node["shards"]) {
    for (const auto& s : node["shards"]) m.shards.push_back(ShardRecord::FromYaml(s, where));
  }
  return m;
}

DatasetManifest DatasetManifest::Load(const std::string& dir) {
  std::string path = (std::filesystem::path(dir) / kManifestFileName).string();
  DF_CHECK(std::filesystem::exists(path),
           path << " does not exist: run `darkformer prepare --output " << dir << "` (to the end) first");
  YAML::Node node;
  try {
    node = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    Fail(path + ": " + e.what());
  }
  return FromYaml(node, path);
}

void DatasetManifest::Save(const std::string& dir) const {
  YAML::Emitter out;
  out << ToYaml();
  WriteFileAtomically((std::filesystem::path(dir) / kManifestFileName).string(), std::string(out.c_str()) + "\n");
}

}  // namespace darkformer
