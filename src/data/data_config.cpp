// Reading and checking the `data` config section (see data_config.h).
#include "data/data_config.h"

#include <spdlog/spdlog.h>

#include "util/error.h"

namespace darkformer {

static MqarDataConfig ReadMqar(const ConfigReader& r) {
  MqarDataConfig m;
  m.task.vocab_size = r.Get("vocab_size", m.task.vocab_size, "keys from [1, V/2), values from [V/2, V); must fit model.vocab_size");
  m.task.num_kv_pairs = r.Get("num_kv_pairs", m.task.num_kv_pairs, "key-value pairs per sequence, each queried once (4 n <= seq_len)");
  m.task.power_a = r.Get("power_a", m.task.power_a, "query gaps drawn with P(g) ~ a (g+1)^(a-1)");
  m.task.random_non_queries = r.Get("random_non_queries", m.task.random_non_queries, "random tokens instead of 0 at filler positions");
  m.task.seed = r.Get("seed", m.task.seed, "seeds the train split");
  m.train_examples = r.Get("train_examples", m.train_examples, KeySpec("rows of the train split (from seed)").Above(0));
  m.val_examples = r.Get("val_examples", m.val_examples, KeySpec("rows of the val split (from val_seed)").Min(0, "0 = none"));
  m.val_seed = r.Get("val_seed", m.task.seed + 1, "seeds the val split: must differ from seed (default seed + 1)");
  r.RejectUnknown();
  DF_CHECK(m.val_seed != m.task.seed, "config key '" << r.KeyPath("val_seed") << "' must differ from "
                                                     << r.KeyPath("seed") << ": validation examples must be new ones");
  return m;
}

DataConfig DataConfig::FromConfig(const ConfigReader& reader) {
  DataConfig c;
  c.key_path = reader.path().empty() ? "data" : reader.path();
  c.source = reader.GetEnum("source", c.source, kDataSourceNames,
                            "shards (prepared C4 or pre-tokenized ids) | mqar (generated in memory; docs/data.md)");
  const KeySpec shards_dir = KeySpec("directory written by `darkformer prepare` (holds manifest.yaml); source shards only").Example("data/demo/shards");
  const KeySpec tokenizer("the SentencePiece .model that made the shards (\"\" for pre-tokenized shards); source shards only");
  if (c.source == DataSource::kShards) {
    c.shards_dir = reader.Require<std::string>("shards_dir", shards_dir);
    c.tokenizer = reader.Get("tokenizer", c.tokenizer, tokenizer);
  } else {
    // docs/data.md: MQAR makes its own tokens, so a C4 config switched with --set data.source=mqar
    // keeps its shards_dir and tokenizer, unread.
    for (const char* unread : {"shards_dir", "tokenizer"}) {
      if (!reader.Has(unread)) continue;
      (void)reader.Get<std::string>(unread, "");
      spdlog::info("config key '{}' is not read with data.source: mqar", reader.KeyPath(unread));
    }
  }
  c.seq_len = reader.Get("seq_len", c.seq_len, KeySpec("tokens per row (each row reads one more for the shifted labels)").Above(0));
  c.batch_size = reader.Get("batch_size", c.batch_size,
                            KeySpec("rows per global batch: all data-parallel ranks together, each takes 1/WORLD_SIZE").Above(0));
  c.packing = reader.GetEnum("packing", c.packing, kPackingNames,
                             "concat: documents joined with EOS, cut into rows | pad: one document per row, padded, no loss on padding");
  c.bos_per_document = reader.Get("bos_per_document", c.bos_per_document, "BOS at the start of every document, as Gemma does");
  c.document_masking = reader.Get("document_masking", c.document_masking,
                                  "attention and every kernel's running state stay inside a document (after each EOS); false: a row is one sequence, as transformers runs it");
  c.document_positions = reader.GetEnum("document_positions", c.document_positions, kDocumentPositionNames,
                                        "with document_masking: RoPE positions continue across the window, or restart per document");
  c.seed = reader.Get("seed", c.seed, "the per-epoch shuffle of rows (offset by 1000003 train.seed)");
  c.mqar = ReadMqar(reader.Child("mqar", "source mqar: Zoology's multi-query associative recall (seq_len = data.seq_len)"));
  reader.RejectUnknown();
  DF_CHECK(c.document_masking || c.document_positions == DocumentPositions::kContinue,
           "config key '" << reader.KeyPath("document_positions")
                          << "' is 'restart', which needs documents: set '" << reader.KeyPath("document_masking")
                          << "' to true (positions restart at the boundaries it marks)");
  if (c.source == DataSource::kMqar) {
    c.mqar.task.seq_len = c.seq_len;
    c.mqar.task.Check(reader.KeyPath("mqar"), reader.KeyPath("seq_len"));
  }
  return c;
}

int64_t DataConfig::LocalBatchSize() const {
  DF_CHECK(world_size > 0 && rank >= 0 && rank < world_size,
           "data-parallel rank " << rank << " is outside [0, " << world_size << ")");
  return MicroBatchRows(*this, world_size);
}

int64_t MicroBatchRows(const DataConfig& data, int64_t devices) {
  DF_CHECK(devices > 0, "the number of data-parallel ranks must be positive, got " << devices);
  DF_CHECK(data.batch_size % devices == 0, "config key '" << data.key_path << ".batch_size' (" << data.batch_size
                                                          << ", the global batch) does not divide among " << devices
                                                          << " data-parallel ranks");
  return data.batch_size / devices;
}

}  // namespace darkformer
