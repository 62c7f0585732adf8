// Reading and checking the `data` config section (see data_config.h).
#include "data/data_config.h"

#include "util/error.h"

namespace darkformer {

DataConfig DataConfig::FromConfig(const ConfigReader& reader) {
  DataConfig c;
  c.key_path = reader.path().empty() ? "data" : reader.path();
  c.shards_dir = reader.Require<std::string>("shards_dir");
  c.tokenizer = reader.Require<std::string>("tokenizer");
  c.seq_len = reader.Get<int64_t>("seq_len", c.seq_len);
  c.batch_size = reader.Get<int64_t>("batch_size", c.batch_size);
  c.packing = reader.GetEnum("packing", c.packing, kPackingNames);
  c.bos_per_document = reader.Get<bool>("bos_per_document", c.bos_per_document);
  c.seed = reader.Get<uint64_t>("seed", c.seed);
  c.rank = reader.Get<int64_t>("rank", c.rank);
  c.world_size = reader.Get<int64_t>("world_size", c.world_size);
  reader.RejectUnknown();

  DF_CHECK(c.seq_len > 0, "config key '" << reader.KeyPath("seq_len") << "' must be positive, got " << c.seq_len);
  DF_CHECK(c.batch_size > 0,
           "config key '" << reader.KeyPath("batch_size") << "' must be positive, got " << c.batch_size);
  DF_CHECK(c.world_size > 0,
           "config key '" << reader.KeyPath("world_size") << "' must be positive, got " << c.world_size);
  DF_CHECK(c.rank >= 0 && c.rank < c.world_size, "config key '" << reader.KeyPath("rank") << "' must be in [0, "
                                                                 << c.world_size << "), got " << c.rank);
  return c;
}

}  // namespace darkformer
