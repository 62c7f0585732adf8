// One source file of `prepare` (see prepare_source.h).
#include "data/prepare_source.h"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>

#include "data/c4_reader.h"
#include "data/label_shard.h"
#include "data/labelled_record_reader.h"
#include "data/pretokenized_reader.h"
#include "data/token_shard_writer.h"
#include "util/atomic_file.h"
#include "util/error.h"
#include "util/hashing.h"

namespace darkformer::prepare_source {

namespace fs = std::filesystem;

namespace {

std::string MarkerPath(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / (name + ".done.yaml")).string();
}

bool SplitFilesIntact(const std::string& dir, const ShardSplit& split, int bytes_per_token, bool labelled) {
  std::error_code ec;
  if (labelled) {
    auto labels_size = fs::file_size(fs::path(dir) / LabelsFileName(split.stem), ec);
    if (ec || static_cast<int64_t>(labels_size) != kShardHeaderBytes + split.tokens * 4) return false;
  }
  auto tokens_size = fs::file_size(fs::path(dir) / TokensFileName(split.stem), ec);
  if (ec || static_cast<int64_t>(tokens_size) != kShardHeaderBytes + split.tokens * bytes_per_token) return false;
  auto docs_size = fs::file_size(fs::path(dir) / DocsFileName(split.stem), ec);
  return !ec && static_cast<int64_t>(docs_size) == kShardHeaderBytes + (split.documents + 1) * 8;
}

}  // namespace

std::string SettingsKey(const PrepareOptions& options, const TokenizerIdentity& tokenizer, int bytes_per_token) {
  char fraction[32];
  std::snprintf(fraction, sizeof(fraction), "%.17g", options.val_fraction);
  return "tokenizer=" + tokenizer.hash + ";vocab=" + std::to_string(tokenizer.vocab_size) +
         ";bytes_per_token=" + std::to_string(bytes_per_token) + ";seed=" + std::to_string(options.seed) +
         ";val_fraction=" + fraction + ";split=v1" + (options.labelled ? ";labelled=v1" : "") +
         (options.max_document_tokens > 0 ? ";max_document_tokens=" + std::to_string(options.max_document_tokens)
                                          : "");
}

std::optional<ShardRecord> FindCommitted(const std::string& dir, const SourceJob& job, const std::string& settings,
                                         int bytes_per_token, bool labelled) {
  std::string marker = MarkerPath(dir, job.name);
  if (!fs::exists(marker)) return std::nullopt;
  try {
    ShardRecord r = ShardRecord::FromYaml(YAML::LoadFile(marker), marker);
    if (r.source != job.path || r.source_bytes != job.bytes || r.settings != settings ||
        r.validation_source != job.validation_source || !SplitFilesIntact(dir, r.train, bytes_per_token, labelled) ||
        !SplitFilesIntact(dir, r.val, bytes_per_token, labelled)) {
      return std::nullopt;
    }
    return r;
  } catch (const std::exception& e) {
    spdlog::warn("{}: unreadable commit marker, redoing the shard ({})", marker, e.what());
    return std::nullopt;
  }
}

ShardRecord PrepareSource(const SourceJob& job, const PrepareOptions& options, const Tokenizer* tokenizer,
                          const std::string& settings, int bytes_per_token, const std::atomic<bool>& stop) {
  // A stale marker must not vouch for the files this job is about to replace.
  std::remove(MarkerPath(options.output_dir, job.name).c_str());
  ShardRecord record;
  record.name = job.name;
  record.source = job.path;
  record.source_bytes = job.bytes;
  record.validation_source = job.validation_source;
  record.settings = settings;
  record.train.stem = job.name + ".train";
  record.val.stem = job.name + ".val";

  const fs::path dir(options.output_dir);
  TokenShardWriter train((dir / record.train.stem).string(), bytes_per_token);
  TokenShardWriter val((dir / record.val.stem).string(), bytes_per_token);
  const std::string source_name = fs::path(job.path).filename().string();
  std::vector<int> ids;
  // Each document goes to its split by (seed, source, line) alone; returns that split (null: empty).
  auto add = [&](int64_t line) -> ShardSplit* {
    if (stop.load(std::memory_order_relaxed)) throw Cancelled{};
    if (ids.empty()) {
      ++record.empty_documents;
      return nullptr;
    }
    if (options.max_document_tokens > 0 && static_cast<int64_t>(ids.size()) > options.max_document_tokens) {
      ids.resize(options.max_document_tokens);
      ++record.truncated_documents;
    }
    const bool is_val =
        job.validation_source || IsValidationDocument(options.seed, source_name, line, options.val_fraction);
    (is_val ? val : train).AddDocument(ids);
    return is_val ? &record.val : &record.train;
  };
  auto finish = [&](const auto& reader) {
    for (const auto& error : reader.first_errors()) spdlog::warn("skipped {}", error);
    record.counts = reader.counts();
  };
  if (options.labelled) {
    LabelShardWriter train_labels((dir / record.train.stem).string()), val_labels((dir / record.val.stem).string());
    LabelledRecordReader reader(job.path, options.pretokenized_vocab_size);
    LabelledRecord labelled;
    while (reader.Next(&labelled)) {
      ids.swap(labelled.input_ids);
      ShardSplit* split = add(reader.line());
      if (!split) continue;
      (split == &record.val ? val_labels : train_labels).AddDocument(labelled.labels);
      if (static_cast<int64_t>(ids.size()) > split->longest) {
        split->longest = static_cast<int64_t>(ids.size());
        split->longest_line = reader.line();
      }
    }
    finish(reader);
    train_labels.Finish();
    val_labels.Finish();
  } else if (tokenizer) {
    C4Reader reader(job.path);
    std::string text;
    while (reader.Next(&text)) {
      tokenizer->Encode(text, &ids);
      add(reader.counts().lines);
    }
    finish(reader);
  } else {
    PretokenizedReader reader(job.path, options.pretokenized_vocab_size);
    while (reader.Next(&ids)) add(reader.counts().lines);
    finish(reader);
  }
  train.Finish();
  val.Finish();
  record.train.documents = train.num_documents();
  record.train.tokens = train.num_tokens();
  record.val.documents = val.num_documents();
  record.val.tokens = val.num_tokens();
  YAML::Emitter out;
  out << record.ToYaml();
  WriteFileAtomically(MarkerPath(options.output_dir, job.name), std::string(out.c_str()) + "\n");
  return record;
}

}  // namespace darkformer::prepare_source
