// Tests of the SentencePiece wrapper and its identity (file hash and vocab size).
#include "data/tokenizer.h"

#include <gtest/gtest.h>

#include "data/data_test_util.h"
#include "util/error.h"

namespace darkformer {
namespace {

TEST(TokenizerTest, EncodesAndDecodesWithGemmaSpecialIds) {
  Tokenizer tokenizer(testing::TinyTokenizer());
  EXPECT_EQ(tokenizer.pad_id(), 0);
  EXPECT_EQ(tokenizer.eos_id(), 1);
  EXPECT_EQ(tokenizer.bos_id(), 2);
  std::vector<int> ids;
  tokenizer.Encode("The model learns from text.", &ids);
  EXPECT_FALSE(ids.empty());
  EXPECT_EQ(tokenizer.Decode(ids), "The model learns from text.");
}

TEST(TokenizerTest, IdentityIsTheFileHashAndVocabSize) {
  Tokenizer a(testing::TinyTokenizer(320));
  Tokenizer b(testing::TinyTokenizer(320));
  Tokenizer c(testing::TinyTokenizer(340));
  EXPECT_TRUE(a.identity().SameAs(b.identity()));
  EXPECT_FALSE(a.identity().SameAs(c.identity()));
  EXPECT_EQ(a.identity().hash.rfind("fnv1a64:", 0), 0u);
  EXPECT_EQ(a.identity().hash.size(), 8u + 16u);
  EXPECT_EQ(a.identity().hash, HashFileFnv1a64(testing::TinyTokenizer(320)));
}

TEST(TokenizerTest, Fnv1aMatchesItsReferenceValue) {
  testing::TempDir dir;
  testing::WritePlain(dir.File("a"), "a");
  // FNV-1a 64 of "a" (reference value from the FNV specification's test vectors).
  EXPECT_EQ(HashFileFnv1a64(dir.File("a")), "fnv1a64:af63dc4c8601ec8c");
}

TEST(TokenizerTest, MissingModelIsAnErrorNamingIt) {
  try {
    Tokenizer tokenizer("/nonexistent/tokenizer.model");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tokenizer.model"), std::string::npos);
  }
}

}  // namespace
}  // namespace darkformer
