// `darkformer prepare`: C4 JSON-lines sources (or pre-tokenized ids) -> memory-mappable token shards with a
// held-out validation split, in parallel over source files, resumable after a kill.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "data/shard_manifest.h"

namespace darkformer {

struct PrepareOptions {
  // Source files or glob patterns (each must match something); sorted and deduplicated.
  std::vector<std::string> inputs;
  // Sources whose every document goes to the validation split (instead of, or with, val_fraction).
  std::vector<std::string> val_inputs;
  // The SentencePiece .model to tokenize with ("" with pretokenized_vocab_size).
  std::string tokenizer;
  // > 0: the inputs are token ids already (data/pretokenized_reader.h), all below this vocabulary
  // size; no tokenizer is used, and an EOS id must be given.
  int64_t pretokenized_vocab_size = 0;
  // With pretokenized_vocab_size: the inputs are labelled records (data/labelled_record_reader.h)
  // and every shard gets a labels file; the EOS id becomes optional (records are not joined).
  bool labelled = false;
  // Directory for shards and manifest.yaml; created if missing.
  std::string output_dir;
  // Fraction in [0, 1) of the documents of `inputs` held out for validation, chosen by hashing
  // (seed, source file name, line number): the same documents for any thread count or resume.
  double val_fraction = 0.0;
  uint64_t seed = 0;
  // > 0: every document keeps only its first N tokens, the rest dropped (transformers' tokenizer
  // truncation=True, max_length=N), so packed windows hold more, shorter documents. Not with
  // `labelled` (a record is a row whose labels must stay whole).
  int64_t max_document_tokens = 0;
  // Worker threads over source files; 0 means one per core.
  int threads = 0;
  // Special ids recorded for the loader; unset means the tokenizer model's own.
  std::optional<int> bos_id;
  std::optional<int> eos_id;
  // Test hook: runs after each shard is committed (its .done.yaml written). Throwing from it
  // stops prepare as a kill would.
  std::function<void(const ShardRecord&)> after_shard_committed;
};

struct PrepareResult {
  DatasetManifest manifest;
  int sources_total = 0;
  int sources_reused = 0;   // committed by an earlier run and left as they were
  int threads = 0;
  int64_t text_bytes_processed = 0;  // by this run (reused sources excluded)
  double wall_seconds = 0;
  double busy_seconds = 0;  // wall time summed over workers
  double cpu_seconds = 0;   // CPU time summed over workers: MB per CPU-second is MB/s per core
};

// Expands files and glob patterns into a sorted, deduplicated list; a pattern that matches no
// file is an error naming it and `option`.
std::vector<std::string> ExpandInputs(const std::vector<std::string>& patterns, const std::string& option);

// True when the document on `line` of the source named `source_name` (its file name, without
// directories, so moving the corpus keeps the split) belongs to the validation split.
bool IsValidationDocument(uint64_t seed, std::string_view source_name, int64_t line, double val_fraction);

PrepareResult RunPrepare(const PrepareOptions& options);

}  // namespace darkformer
