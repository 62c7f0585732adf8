// The `data` section of a training config: where the token shards are, the tokenizer they must
// match, and how the loader packs and shuffles them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "data/mqar.h"
#include "util/config_reader.h"

namespace darkformer {

enum class Packing { kConcat, kPad };
enum class DataSource { kShards, kMqar };
inline const std::vector<std::pair<std::string, DataSource>> kDataSourceNames = {{"shards", DataSource::kShards},
                                                                                {"mqar", DataSource::kMqar}};

// data.mqar: the generated multi-query associative recall task (data/mqar.h); seq_len is data.seq_len.
struct MqarDataConfig {
  MqarOptions task;               // vocab_size, num_kv_pairs, power_a, random_non_queries, seed
  int64_t train_examples = 20000; // rows of the train split (generated from task.seed)
  int64_t val_examples = 1000;    // rows of the val split (from val_seed: different examples)
  uint64_t val_seed = 1;
};
enum class DocumentPositions { kContinue, kRestart };
inline const std::vector<std::pair<std::string, DocumentPositions>> kDocumentPositionNames = {
    {"continue", DocumentPositions::kContinue}, {"restart", DocumentPositions::kRestart}};
inline const std::vector<std::pair<std::string, Packing>> kPackingNames = {{"concat", Packing::kConcat},
                                                                          {"pad", Packing::kPad}};

struct DataConfig {
  // shards (prepared C4 or pre-tokenized data) | mqar (generated in memory).
  DataSource source = DataSource::kShards;
  // Directory written by `darkformer prepare` (holds manifest.yaml); source shards only.
  std::string shards_dir;
  // The SentencePiece .model the model uses; the shards must have been made with it ("" for
  // pre-tokenized shards, which have no tokenizer).
  std::string tokenizer;
  MqarDataConfig mqar;
  // Tokens per row; each row also reads one more token for the shifted labels.
  int64_t seq_len = 1024;
  // Rows per global batch: all data-parallel ranks together, so a run's numbers do not depend on
  // how many processes ran it. Each rank takes batch_size / world_size of them.
  int64_t batch_size = 8;
  // "concat": documents joined with EOS into one stream cut into rows; "pad": one document per
  // row (long ones continue on further rows), padded, with no loss on padding.
  Packing packing = Packing::kConcat;
  // Start every document with the BOS id recorded in the shards (Gemma does).
  bool bos_per_document = true;
  // Packed windows: attention and every kernel's running state stay inside a document (a
  // document starts after each EOS and at the window's start). Off: a row is one sequence, as
  // transformers runs it.
  bool document_masking = false;
  // With masking: RoPE positions continue across the window, or restart at each document.
  DocumentPositions document_positions = DocumentPositions::kContinue;
  // Seeds the per-epoch shuffle of rows.
  uint64_t seed = 0;
  // This process's data-parallel rank and the number of ranks (not config keys: the trainer sets
  // them from torchrun's RANK and WORLD_SIZE); ranks read disjoint rows of every global batch.
  int64_t rank = 0;
  int64_t world_size = 1;
  // The key path of the section, for errors ("data").
  std::string key_path = "data";

  // Reads the section (`reader` is the data section itself); unknown keys are errors naming their
  // path, as are out-of-range values.
  static DataConfig FromConfig(const ConfigReader& reader);
  // Rows of each global batch that this rank reads; throws (naming data.batch_size and the rank
  // count) when the ranks cannot split the batch evenly.
  int64_t LocalBatchSize() const;
};

}  // namespace darkformer
