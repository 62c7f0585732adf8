// Our SentencePiece build (third_party/) against Python sentencepiece's ids on the demo corpus:
// tests/fixtures/tokenizer/demo_ids.json, written by tools/make_tokenizer_fixture.py, holds them.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/c4_reader.h"
#include "data/tokenizer.h"

namespace darkformer {
namespace {

std::string SourceDir() {
  const char* dir = std::getenv("DARKFORMER_SOURCE_DIR");
  return dir ? dir : DARKFORMER_TEST_SOURCE_DIR;
}

std::string DemoFile(const std::string& name) { return SourceDir() + "/data/demo/" + name; }

const nlohmann::json& Reference() {
  static const nlohmann::json reference = [] {
    std::ifstream in(SourceDir() + "/tests/fixtures/tokenizer/demo_ids.json");
    return in ? nlohmann::json::parse(in) : nlohmann::json();
  }();
  return reference;
}

// The fixture holds for the demo model it was made from (named by its .vocab: the .model also
// records the path it was trained from). Fails, never skips, when the demo corpus is missing.
void ExpectTheFixturesModel() {
  ASSERT_FALSE(Reference().is_null()) << "tests/fixtures/tokenizer/demo_ids.json is missing";
  ASSERT_TRUE(std::filesystem::exists(DemoFile("tokenizer.model")))
      << DemoFile("tokenizer.model") << " is missing: run tools/setup.sh (tools/make_demo_corpus.sh)";
  ASSERT_EQ(HashFileFnv1a64(DemoFile("tokenizer.vocab")), Reference()["vocab_fnv1a64"].get<std::string>())
      << "data/demo's model is not the one the fixture was made from: rerun tools/make_tokenizer_fixture.py";
}

const Tokenizer& DemoTokenizer() {
  static const Tokenizer tokenizer(DemoFile("tokenizer.model"));
  return tokenizer;
}

std::vector<std::string> Documents(const std::string& file) {
  C4Reader reader(DemoFile(file));
  std::vector<std::string> texts;
  std::string text;
  while (reader.Next(&text)) texts.push_back(text);
  return texts;
}

// Equal ids, or where they first differ (gtest prints long vectors cut short).
::testing::AssertionResult SameIds(const std::vector<int>& ours, const std::vector<int>& python) {
  size_t i = 0;
  while (i < ours.size() && i < python.size() && ours[i] == python[i]) ++i;
  if (i == ours.size() && i == python.size()) return ::testing::AssertionSuccess();
  auto at = [i](const std::vector<int>& ids) { return i < ids.size() ? std::to_string(ids[i]) : "end"; };
  return ::testing::AssertionFailure() << "first difference at id " << i << ": ours " << at(ours) << ", Python's "
                                       << at(python) << " (lengths " << ours.size() << " and " << python.size() << ")";
}

// FNV-1a 64 over each document's ids as little-endian int32, each document followed by -1: the
// digest tools/make_tokenizer_fixture.py writes.
class IdsDigest {
 public:
  void Add(const std::vector<int>& ids) {
    for (int id : ids) AddInt(id);
    AddInt(-1);
  }
  std::string Hex() const {
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h_));
    return std::string("fnv1a64:") + hex;
  }

 private:
  void AddInt(int32_t value) {
    unsigned char bytes[4];
    for (int i = 0; i < 4; ++i) bytes[i] = static_cast<unsigned char>(static_cast<uint32_t>(value) >> (8 * i));
    for (unsigned char b : bytes) h_ = (h_ ^ b) * 1099511628211ULL;
  }
  uint64_t h_ = 14695981039346656037ULL;
};

TEST(TokenizerReferenceTest, EdgeStringsGivePythonsIds) {
  ASSERT_NO_FATAL_FAILURE(ExpectTheFixturesModel());
  for (const auto& item : Reference()["strings"]) {
    std::vector<int> ids;
    DemoTokenizer().Encode(item["text"].get<std::string>(), &ids);
    EXPECT_TRUE(SameIds(ids, item["ids"].get<std::vector<int>>())) << "text: " << item["text"];
  }
}

TEST(TokenizerReferenceTest, FirstDocumentsGivePythonsIdsOneByOne) {
  ASSERT_NO_FATAL_FAILURE(ExpectTheFixturesModel());
  for (const auto& item : Reference()["documents"]) {
    auto texts = Documents(item["file"].get<std::string>());
    const size_t index = item["index"].get<size_t>();
    ASSERT_LT(index, texts.size()) << item["file"];
    std::vector<int> ids;
    DemoTokenizer().Encode(texts[index], &ids);
    EXPECT_TRUE(SameIds(ids, item["ids"].get<std::vector<int>>())) << item["file"] << " document " << index;
  }
}

TEST(TokenizerReferenceTest, WholeFilesGivePythonsIdsDigest) {
  ASSERT_NO_FATAL_FAILURE(ExpectTheFixturesModel());
  for (const auto& item : Reference()["digests"]) {
    const std::string file = item["file"].get<std::string>();
    IdsDigest digest;
    int64_t tokens = 0;
    auto texts = Documents(file);
    std::vector<int> ids;
    for (const auto& text : texts) {
      DemoTokenizer().Encode(text, &ids);
      digest.Add(ids);
      tokens += static_cast<int64_t>(ids.size());
    }
    EXPECT_EQ(static_cast<int64_t>(texts.size()), item["documents"].get<int64_t>()) << file;
    EXPECT_EQ(tokens, item["tokens"].get<int64_t>()) << file;
    EXPECT_EQ(digest.Hex(), item["ids"].get<std::string>()) << file;
  }
}

}  // namespace
}  // namespace darkformer
