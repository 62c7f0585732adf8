// Reading and checking the `data` config section (see data_config.h).
#include "data/data_config.h"

#include <spdlog/spdlog.h>

#include "util/error.h"

namespace darkformer {

static MqarDataConfig ReadMqar(const ConfigReader& r) {
  MqarDataConfig m;
  m.task.vocab_size = r.Get("vocab_size", m.task.vocab_size);
  m.task.num_kv_pairs = r.Get("num_kv_pairs", m.task.num_kv_pairs);
  m.task.power_a = r.Get("power_a", m.task.power_a);
  m.task.random_non_queries = r.Get("random_non_queries", m.task.random_non_queries);
  m.task.seed = r.Get("seed", m.task.seed);
  m.train_examples = r.Get("train_examples", m.train_examples);
  m.val_examples = r.Get("val_examples", m.val_examples);
  m.val_seed = r.Get("val_seed", m.task.seed + 1);
  r.RejectUnknown();
  DF_CHECK(m.train_examples > 0, "config key '" << r.KeyPath("train_examples") << "' must be positive");
  DF_CHECK(m.val_examples >= 0, "config key '" << r.KeyPath("val_examples") << "' must be >= 0");
  DF_CHECK(m.val_seed != m.task.seed, "config key '" << r.KeyPath("val_seed") << "' must differ from "
                                                     << r.KeyPath("seed") << ": validation examples must be new ones");
  return m;
}

DataConfig DataConfig::FromConfig(const ConfigReader& reader) {
  DataConfig c;
  c.key_path = reader.path().empty() ? "data" : reader.path();
  c.source = reader.GetEnum("source", c.source, kDataSourceNames);
  if (c.source == DataSource::kShards) {
    c.shards_dir = reader.Require<std::string>("shards_dir");
    c.tokenizer = reader.Get<std::string>("tokenizer", c.tokenizer);
  } else {
    // docs/data.md: MQAR makes its own tokens, so a C4 config switched with --set data.source=mqar
    // keeps its shards_dir and tokenizer, unread.
    for (const char* unread : {"shards_dir", "tokenizer"}) {
      if (!reader.Has(unread)) continue;
      (void)reader.Get<std::string>(unread, "");
      spdlog::info("config key '{}' is not read with data.source: mqar", reader.KeyPath(unread));
    }
  }
  c.mqar = ReadMqar(reader.Child("mqar"));
  c.seq_len = reader.Get<int64_t>("seq_len", c.seq_len);
  c.batch_size = reader.Get<int64_t>("batch_size", c.batch_size);
  c.packing = reader.GetEnum("packing", c.packing, kPackingNames);
  c.bos_per_document = reader.Get<bool>("bos_per_document", c.bos_per_document);
  c.seed = reader.Get<uint64_t>("seed", c.seed);
  c.document_masking = reader.Get<bool>("document_masking", c.document_masking);
  c.document_positions = reader.GetEnum("document_positions", c.document_positions, kDocumentPositionNames);
  reader.RejectUnknown();
  DF_CHECK(c.document_masking || c.document_positions == DocumentPositions::kContinue,
           "config key '" << reader.KeyPath("document_positions")
                          << "' is 'restart', which needs documents: set '" << reader.KeyPath("document_masking")
                          << "' to true (positions restart at the boundaries it marks)");
  if (c.source == DataSource::kMqar) {
    c.mqar.task.seq_len = c.seq_len;
    c.mqar.task.Check(reader.KeyPath("mqar"), reader.KeyPath("seq_len"));
  }

  DF_CHECK(c.seq_len > 0, "config key '" << reader.KeyPath("seq_len") << "' must be positive, got " << c.seq_len);
  DF_CHECK(c.batch_size > 0,
           "config key '" << reader.KeyPath("batch_size") << "' must be positive, got " << c.batch_size);
  return c;
}

int64_t DataConfig::LocalBatchSize() const {
  DF_CHECK(world_size > 0 && rank >= 0 && rank < world_size,
           "data-parallel rank " << rank << " is outside [0, " << world_size << ")");
  DF_CHECK(batch_size % world_size == 0, "config key '" << key_path << ".batch_size' (" << batch_size
                                                        << ", the global batch) does not divide among "
                                                        << world_size << " data-parallel ranks (WORLD_SIZE)");
  return batch_size / world_size;
}

}  // namespace darkformer
