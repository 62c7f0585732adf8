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
  MqarOptions task;  // vocab_size, num_kv_pairs, power_a, random_non_queries, seed
  int64_t train_examples = 20000;
  int64_t val_examples = 1000;
  uint64_t val_seed = 1;
};
enum class DocumentPositions { kContinue, kRestart };
inline const std::vector<std::pair<std::string, DocumentPositions>> kDocumentPositionNames = {
    {"continue", DocumentPositions::kContinue}, {"restart", DocumentPositions::kRestart}};
inline const std::vector<std::pair<std::string, Packing>> kPackingNames = {{"concat", Packing::kConcat},
                                                                          {"pad", Packing::kPad}};

struct DataConfig {
  // The keys: doc lines, accepted values and defaults' meaning are declared where
  // data_config.cpp reads them (docs/config_keys.md).
  DataSource source = DataSource::kShards;
  std::string shards_dir;  // source shards only
  std::string tokenizer;   // must be the tokenizer that made the shards
  MqarDataConfig mqar;
  int64_t seq_len = 1024;
  int64_t batch_size = 8;  // the global batch: a run's numbers do not depend on its process count
  Packing packing = Packing::kConcat;
  bool bos_per_document = true;
  bool document_masking = false;
  DocumentPositions document_positions = DocumentPositions::kContinue;
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

// Rows of one micro-batch on each of `devices` data-parallel ranks: data.batch_size / devices.
// A step runs train.grad_accum such micro-batches one after another, so grad_accum does not
// divide it. The one rule the loader, the fit check and the memory estimate size batches by;
// throws naming data.batch_size when the ranks cannot split it evenly.
int64_t MicroBatchRows(const DataConfig& data, int64_t devices);

}  // namespace darkformer
