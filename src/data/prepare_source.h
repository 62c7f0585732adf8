// One source file of `prepare` (prepare.h): its job, the settings key a committed shard must
// match, finding a committed shard to reuse, and tokenizing the file into its train/val shard
// (written under temporary names, renamed, then committed by "<name>.done.yaml").
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "data/prepare.h"
#include "data/token_shard_format.h"
#include "data/tokenizer.h"

namespace darkformer::prepare_source {

// Thrown inside a worker when another worker failed, to abandon its shard early.
struct Cancelled {};

struct SourceJob {
  int index = 0;
  std::string path;
  bool validation_source = false;
  int64_t bytes = 0;
  std::string name;  // "shard-00003"
};

// Everything that shapes a shard's bytes; a committed shard with another key is redone.
std::string SettingsKey(const PrepareOptions& options, const TokenizerIdentity& tokenizer, int bytes_per_token);

// The committed record of `job` if a previous run finished it with the same settings.
std::optional<ShardRecord> FindCommitted(const std::string& dir, const SourceJob& job, const std::string& settings,
                                         int bytes_per_token, bool labelled);

// Tokenizes `job` into its shard; throws Cancelled once `stop` is set.
ShardRecord PrepareSource(const SourceJob& job, const PrepareOptions& options, const Tokenizer* tokenizer,
                          const std::string& settings, int bytes_per_token, const std::atomic<bool>& stop);

}  // namespace darkformer::prepare_source
