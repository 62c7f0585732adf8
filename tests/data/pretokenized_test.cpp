// `prepare --pretokenized`: token ids brought as JSON lines or .npy become shards that train like
// tokenized C4 (the loader rows hold exactly those ids, framed with the given EOS), bad lines are
// counted and skipped, and an id outside --vocab-size is an error naming file and line.
#include "data/pretokenized_reader.h"

#include <gtest/gtest.h>

#include <cstring>

#include "data/data_test_util.h"
#include "data/packed_loader.h"
#include "data/prepare.h"
#include "util/error.h"

namespace darkformer {
namespace {

using testing::TempDir;

PrepareOptions Options(const TempDir& dir, std::vector<std::string> inputs) {
  PrepareOptions o;
  o.inputs = std::move(inputs);
  o.output_dir = dir.File("shards");
  o.pretokenized_vocab_size = 50;
  o.eos_id = 1;
  o.threads = 1;
  return o;
}

TEST(PretokenizedTest, JsonLinesAndNpyBecomeShardsWhoseRowsAreTheIds) {
  TempDir dir;
  testing::WriteGzip(dir.File("a.jsonl.gz"), "[5, 6, 7]\n\n{\"input_ids\": [8, 9], \"meta\": 1}\nnot json\n[1.5]\n");
  testing::WriteNpy(dir.File("b.npy"), {10, 11, 12, 13, 14, 15}, 2, 3);
  testing::WriteNpy(dir.File("c.npy"), {20, 21, 22, 23}, 0, 4);
  const auto result = RunPrepare(Options(dir, {dir.File("a.jsonl.gz"), dir.File("b.npy"), dir.File("c.npy")}));
  const auto& m = result.manifest;
  EXPECT_TRUE(m.tokenizer.IsPretokenized());
  EXPECT_EQ(m.tokenizer.vocab_size, 50);
  EXPECT_EQ(m.TotalDocuments(false), 5);  // 2 JSON documents, 2 .npy rows, 1 .npy vector
  EXPECT_EQ(m.TotalTokens(false), 3 + 2 + 3 + 3 + 4);
  const auto counts = m.TotalCounts();
  EXPECT_EQ(counts.malformed, 1);  // "not json"
  EXPECT_EQ(counts.no_text, 1);    // an array that is not of integers
  EXPECT_EQ(counts.blank, 1);

  DataConfig config;
  config.shards_dir = dir.File("shards");  // no tokenizer: the shards are pre-tokenized
  config.seq_len = 4;
  config.batch_size = 1;
  config.packing = Packing::kPad;
  config.bos_per_document = false;
  PackedLoader loader(config);
  EXPECT_EQ(loader.vocab_size(), 50);
  std::vector<int64_t> inputs(4), labels(4);
  std::vector<std::vector<int64_t>> rows;
  for (int64_t r = 0; r < loader.num_rows(); ++r) {
    loader.FillRow(r, inputs.data(), labels.data());
    rows.push_back(inputs);
  }
  EXPECT_EQ(rows.front(), (std::vector<int64_t>{5, 6, 7, 1}));  // the ids, then EOS
}

TEST(PretokenizedTest, AnIdOutsideTheVocabularyNamesFileAndLine) {
  TempDir dir;
  testing::WritePlain(dir.File("ids.jsonl"), "[1, 2]\n[3, 50]\n");
  try {
    RunPrepare(Options(dir, {dir.File("ids.jsonl")}));
    FAIL() << "id 50 with --vocab-size 50 must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir.File("ids.jsonl") + ":2: token id 50"), std::string::npos) << e.what();
  }
}

TEST(PretokenizedTest, TokenizedShardsStillNeedTheirTokenizerNamed) {
  TempDir dir;
  testing::WriteGzip(dir.File("c4.json.gz"), testing::C4Content(testing::MakeDocuments(40, 1)));
  PrepareOptions options;
  options.inputs = {dir.File("c4.json.gz")};
  options.tokenizer = testing::TinyTokenizer();
  options.output_dir = dir.File("shards");
  RunPrepare(options);
  DataConfig config;
  config.shards_dir = dir.File("shards");
  config.seq_len = 8;
  config.batch_size = 1;
  try {
    PackedLoader loader(config);
    FAIL() << "shards made with a tokenizer need data.tokenizer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'data.tokenizer' is required"), std::string::npos) << e.what();
  }
}

TEST(PretokenizedTest, NpyReaderRefusesFloatsAndThreeDimensions) {
  TempDir dir;
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  const std::string npy = std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(header.size()) + '\0' + header;
  testing::WritePlain(dir.File("f.npy"), npy + std::string(8, '\0'));
  int64_t rows = 0, cols = 0;
  EXPECT_THROW(ReadNpyIntegers(dir.File("f.npy"), &rows, &cols), Error);
  testing::WritePlain(dir.File("x.npy"), "not numpy");
  EXPECT_THROW(ReadNpyIntegers(dir.File("x.npy"), &rows, &cols), Error);
}

}  // namespace
}  // namespace darkformer
