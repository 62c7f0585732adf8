// Tests of token shard files: round trips at both widths, no complete-looking file from an
// unfinished writer, and readers that refuse damaged files.
#include <gtest/gtest.h>

#include <filesystem>

#include "data/data_test_util.h"
#include "data/token_shard_format.h"
#include "data/token_shard_reader.h"
#include "data/token_shard_writer.h"
#include "util/error.h"

namespace darkformer {
namespace {

using testing::TempDir;

void RoundTrip(int width, int max_id) {
  TempDir dir;
  std::string stem = dir.File("s.train");
  std::vector<std::vector<int>> docs = {{1, 2, 3}, {max_id}, {7, 8, 9, 10, 11}};
  {
    TokenShardWriter writer(stem, width);
    for (const auto& d : docs) writer.AddDocument(d);
    EXPECT_EQ(writer.num_documents(), 3);
    EXPECT_EQ(writer.num_tokens(), 9);
    writer.Finish();
  }
  TokenShardReader reader(stem);
  EXPECT_EQ(reader.bytes_per_token(), width);
  ASSERT_EQ(reader.num_documents(), 3);
  ASSERT_EQ(reader.num_tokens(), 9);
  EXPECT_EQ(std::filesystem::file_size(TokensFileName(stem)), static_cast<uintmax_t>(kShardHeaderBytes + 9 * width));
  for (int d = 0; d < 3; ++d) {
    std::vector<int64_t> got(reader.doc_size(d));
    reader.CopyTokens(reader.doc_begin(d), reader.doc_size(d), got.data());
    EXPECT_EQ(got, std::vector<int64_t>(docs[d].begin(), docs[d].end()));
  }
}

TEST(TokenShardTest, RoundTripsUint16) { RoundTrip(2, 65535); }
TEST(TokenShardTest, RoundTripsUint32) { RoundTrip(4, 255999); }

TEST(TokenShardTest, WidthFollowsVocabSize) {
  EXPECT_EQ(BytesPerTokenForVocab(8000), 2);
  EXPECT_EQ(BytesPerTokenForVocab(65536), 2);
  EXPECT_EQ(BytesPerTokenForVocab(65537), 4);
  EXPECT_EQ(BytesPerTokenForVocab(256000), 4);
}

TEST(TokenShardTest, UnfinishedWriterLeavesNothing) {
  TempDir dir;
  std::string stem = dir.File("s.train");
  {
    TokenShardWriter writer(stem, 2);
    writer.AddDocument({1, 2, 3});
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(TokenShardTest, IdTooWideIsAnError) {
  TempDir dir;
  TokenShardWriter writer(dir.File("s"), 2);
  EXPECT_THROW(writer.AddDocument({65536}), Error);
}

TEST(TokenShardTest, ReaderRefusesTruncatedFiles) {
  TempDir dir;
  std::string stem = dir.File("s");
  {
    TokenShardWriter writer(stem, 4);
    writer.AddDocument({1, 2, 3, 4});
    writer.Finish();
  }
  std::filesystem::resize_file(TokensFileName(stem), kShardHeaderBytes + 3 * 4);
  try {
    TokenShardReader reader(stem);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(DocsFileName(stem)), std::string::npos) << e.what();
  }
  std::filesystem::resize_file(TokensFileName(stem), kShardHeaderBytes + 3 * 4 + 1);
  EXPECT_THROW(TokenShardReader reader(stem), Error);
}

}  // namespace
}  // namespace darkformer
