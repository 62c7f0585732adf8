// Tests of the data config section: defaults, values, and errors that name the key path.
#include "data/data_config.h"

#include <gtest/gtest.h>

namespace darkformer {
namespace {

DataConfig Read(const std::string& yaml) {
  YAML::Node root = YAML::Load(yaml);
  return DataConfig::FromConfig(ConfigReader(root).Child("data"));
}

std::string ErrorOf(const std::string& yaml) {
  try {
    Read(yaml);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DataConfigTest, ReadsValuesAndDefaults) {
  DataConfig c = Read("data: {shards_dir: s, tokenizer: t.model, seq_len: 128, packing: pad, seed: 7}");
  EXPECT_EQ(c.shards_dir, "s");
  EXPECT_EQ(c.tokenizer, "t.model");
  EXPECT_EQ(c.seq_len, 128);
  EXPECT_EQ(c.batch_size, 8);
  EXPECT_EQ(c.packing, Packing::kPad);
  EXPECT_TRUE(c.bos_per_document);
  EXPECT_EQ(c.seed, 7u);
  EXPECT_EQ(c.rank, 0);  // set by the trainer from torchrun's environment, not by the config
  EXPECT_EQ(c.world_size, 1);
  EXPECT_EQ(c.key_path, "data");
}

TEST(DataConfigTest, ErrorsNameTheKeyPath) {
  EXPECT_NE(ErrorOf("data: {shards_dir: s, tokenizer: t, sequence_length: 5}").find("'data.sequence_length'"),
            std::string::npos);
  EXPECT_NE(ErrorOf("data: {tokenizer: t}").find("'data.shards_dir'"), std::string::npos);
  EXPECT_NE(ErrorOf("data: {shards_dir: s, tokenizer: t, packing: greedy}").find("'data.packing'"),
            std::string::npos);
  EXPECT_NE(ErrorOf("data: {shards_dir: s, tokenizer: t, seq_len: 0}").find("'data.seq_len'"), std::string::npos);
  EXPECT_NE(ErrorOf("data: {shards_dir: s, tokenizer: t, world_size: 2}").find("'data.world_size'"),
            std::string::npos);
  EXPECT_NE(ErrorOf("data: {shards_dir: s, tokenizer: t, batch_size: many}").find("'data.batch_size'"),
            std::string::npos);
}

}  // namespace
}  // namespace darkformer
