// Tests of the C4 reader: gzip and plain input, counted bad lines, long lines, truncated gzip.
#include "data/c4_reader.h"

#include <gtest/gtest.h>

#include "data/data_test_util.h"
#include "util/error.h"

namespace darkformer {
namespace {

using testing::C4Content;
using testing::C4Line;
using testing::TempDir;

std::vector<std::string> ReadAll(const std::string& path, C4ReadCounts* counts = nullptr) {
  C4Reader reader(path);
  std::vector<std::string> texts;
  std::string text;
  while (reader.Next(&text)) texts.push_back(text);
  if (counts) *counts = reader.counts();
  return texts;
}

TEST(C4ReaderTest, ReadsGzipAndPlainAlike) {
  TempDir dir;
  auto docs = testing::MakeDocuments(50, 1);
  testing::WriteGzip(dir.File("a.json.gz"), C4Content(docs));
  testing::WritePlain(dir.File("a.json"), C4Content(docs));
  C4ReadCounts gz_counts, plain_counts;
  EXPECT_EQ(ReadAll(dir.File("a.json.gz"), &gz_counts), docs);
  EXPECT_EQ(ReadAll(dir.File("a.json"), &plain_counts), docs);
  EXPECT_EQ(gz_counts.documents, 50);
  EXPECT_EQ(gz_counts.lines, 50);
  EXPECT_EQ(gz_counts.skipped(), 0);
  int64_t bytes = 0;
  for (const auto& d : docs) bytes += static_cast<int64_t>(d.size());
  EXPECT_EQ(gz_counts.text_bytes, bytes);
  EXPECT_EQ(plain_counts.text_bytes, bytes);
}

TEST(C4ReaderTest, SkipsAndCountsBadLines) {
  TempDir dir;
  std::string content = C4Line("one") + "\n" + "{not json\n" + "\n" + R"({"url":"no text"})" + "\n" +
                        C4Line("two") + "\n" + R"({"text":"three"} junk)" + "\n" + C4Line("four");  // no final \n
  testing::WriteGzip(dir.File("bad.json.gz"), content);
  C4Reader reader(dir.File("bad.json.gz"));
  std::vector<std::string> texts;
  std::string text;
  while (reader.Next(&text)) texts.push_back(text);
  EXPECT_EQ(texts, (std::vector<std::string>{"one", "two", "four"}));
  EXPECT_EQ(reader.counts().lines, 7);
  EXPECT_EQ(reader.counts().malformed, 2);
  EXPECT_EQ(reader.counts().no_text, 1);
  EXPECT_EQ(reader.counts().blank, 1);
  ASSERT_EQ(reader.first_errors().size(), 3u);
  EXPECT_NE(reader.first_errors()[0].find("bad.json.gz:2:"), std::string::npos) << reader.first_errors()[0];
}

TEST(C4ReaderTest, ReadsLinesLongerThanItsBuffer) {
  TempDir dir;
  std::string long_text(3 << 20, 'x');  // 3 MiB: larger than the initial 1 MiB buffer
  std::vector<std::string> docs = {"short", long_text, "after"};
  testing::WriteGzip(dir.File("long.json.gz"), C4Content(docs));
  EXPECT_EQ(ReadAll(dir.File("long.json.gz")), docs);
}

TEST(C4ReaderTest, TruncatedGzipIsAnErrorNamingFileAndLine) {
  TempDir dir;
  auto docs = testing::MakeDocuments(3000, 2);
  testing::WriteGzip(dir.File("full.json.gz"), C4Content(docs));
  std::string bytes = testing::ReadFile(dir.File("full.json.gz"));
  std::string path = dir.File("cut.json.gz");
  testing::WritePlain(path, bytes.substr(0, bytes.size() * 2 / 3));
  try {
    ReadAll(path);
    FAIL() << "a truncated gzip must not read as a clean end of file";
  } catch (const Error& e) {
    std::string message = e.what();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find("after line "), std::string::npos) << message;
    EXPECT_NE(message.find("unexpected end of file"), std::string::npos) << message;
  }
  // The line named is the last complete one handed out: every document before the damage is read.
  C4Reader reader(path);
  std::string text;
  int64_t read = 0;
  try {
    while (reader.Next(&text)) {
      EXPECT_EQ(text, docs[read]);
      ++read;
    }
    FAIL() << "a truncated gzip must not read as a clean end of file";
  } catch (const Error& e) {
    EXPECT_GT(read, 1000);  // two thirds of the compressed bytes hold well over a third of the lines
    EXPECT_NE(std::string(e.what()).find("after line " + std::to_string(read) + " "), std::string::npos) << e.what();
  }
  // Cutting only the 8-byte trailer (CRC and length) is caught too.
  testing::WritePlain(path, bytes.substr(0, bytes.size() - 4));
  EXPECT_THROW(ReadAll(path), Error);
}

TEST(C4ReaderTest, CorruptGzipIsAnError) {
  TempDir dir;
  testing::WriteGzip(dir.File("ok.json.gz"), C4Content(testing::MakeDocuments(500, 3)));
  std::string bytes = testing::ReadFile(dir.File("ok.json.gz"));
  for (size_t i = bytes.size() / 2; i < bytes.size() / 2 + 16; ++i) bytes[i] = static_cast<char>(bytes[i] ^ 0x5A);
  testing::WritePlain(dir.File("bad.json.gz"), bytes);
  EXPECT_THROW(ReadAll(dir.File("bad.json.gz")), Error);
}

TEST(C4ReaderTest, MissingFileIsAnErrorNamingIt) {
  try {
    C4Reader reader("/nonexistent/c4-train.00000-of-01024.json.gz");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/c4-train.00000-of-01024.json.gz"), std::string::npos);
  }
}

}  // namespace
}  // namespace darkformer
