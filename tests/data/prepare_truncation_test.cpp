// Tests of `prepare --max-document-tokens`: every document keeps exactly its first N tokens (the
// ids a whole-document run writes, cut), the cut documents are counted, the setting is part of
// what a resumed run must match, and bad values are refused before anything is read.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "data/data_test_util.h"
#include "data/prepare.h"
#include "data/token_shard_reader.h"
#include "util/error.h"

namespace darkformer {
namespace {

using testing::TempDir;

struct Corpus {
  TempDir dir;
  Corpus() {
    testing::WriteGzip(dir.File("c4-train.00000-of-00002.json.gz"), testing::C4Content(testing::MakeDocuments(50, 7)));
    testing::WriteGzip(dir.File("c4-train.00001-of-00002.json.gz"), testing::C4Content(testing::MakeDocuments(40, 8)));
  }
};

PrepareOptions Options(const Corpus& corpus, const std::string& out, int64_t max_document_tokens) {
  PrepareOptions o;
  o.inputs = {corpus.dir.path() + "/c4-train.*"};
  o.tokenizer = testing::TinyTokenizer();
  o.output_dir = out;
  o.val_fraction = 0.2;
  o.seed = 3;
  o.threads = 2;
  o.max_document_tokens = max_document_tokens;
  return o;
}

// Token ids of every document of both splits, shard by shard, train before val.
std::vector<std::vector<int64_t>> Documents(const std::string& dir, const DatasetManifest& m) {
  std::vector<std::vector<int64_t>> docs;
  for (const auto& record : m.shards) {
    for (const auto* split : {&record.train, &record.val}) {
      TokenShardReader reader(dir + "/" + split->stem);
      for (int64_t d = 0; d < reader.num_documents(); ++d) {
        std::vector<int64_t> ids;
        for (int64_t i = reader.doc_begin(d); i < reader.doc_begin(d + 1); ++i) ids.push_back(reader.token(i));
        docs.push_back(ids);
      }
    }
  }
  return docs;
}

TEST(PrepareTruncationTest, EveryDocumentKeepsItsFirstTokens) {
  Corpus corpus;
  TempDir whole_dir, cut_dir;
  const DatasetManifest whole = RunPrepare(Options(corpus, whole_dir.path(), 0)).manifest;
  const auto whole_docs = Documents(whole_dir.path(), whole);
  std::vector<size_t> lengths;
  for (const auto& d : whole_docs) lengths.push_back(d.size());
  std::sort(lengths.begin(), lengths.end());
  // A cut that some documents exceed and some do not, so both cases are exercised.
  const int64_t n = static_cast<int64_t>(lengths[lengths.size() / 2]);
  ASSERT_LT(lengths.front(), static_cast<size_t>(n));
  ASSERT_GT(lengths.back(), static_cast<size_t>(n));

  const DatasetManifest cut = RunPrepare(Options(corpus, cut_dir.path(), n)).manifest;
  const auto cut_docs = Documents(cut_dir.path(), cut);
  ASSERT_EQ(cut_docs.size(), whole_docs.size());  // the same documents, in the same splits and order
  int64_t longer = 0;
  for (size_t d = 0; d < whole_docs.size(); ++d) {
    const size_t keep = std::min<size_t>(whole_docs[d].size(), static_cast<size_t>(n));
    EXPECT_EQ(cut_docs[d], std::vector<int64_t>(whole_docs[d].begin(), whole_docs[d].begin() + keep)) << "doc " << d;
    longer += static_cast<int64_t>(whole_docs[d].size()) > n;
  }
  EXPECT_EQ(cut.TotalTruncatedDocuments(), longer);
  EXPECT_EQ(whole.TotalTruncatedDocuments(), 0);
  for (size_t s = 0; s < cut.shards.size(); ++s) {
    EXPECT_EQ(cut.shards[s].train.documents, whole.shards[s].train.documents);
    EXPECT_EQ(cut.shards[s].val.documents, whole.shards[s].val.documents);
  }

  // The manifest on disk records the cut and its count.
  const DatasetManifest loaded = DatasetManifest::Load(cut_dir.path());
  EXPECT_EQ(loaded.max_document_tokens, n);
  EXPECT_EQ(loaded.TotalTruncatedDocuments(), longer);
  EXPECT_EQ(DatasetManifest::Load(whole_dir.path()).max_document_tokens, 0);
}

TEST(PrepareTruncationTest, ResumeReusesShardsOnlyForTheSameCut) {
  Corpus corpus;
  TempDir out;
  RunPrepare(Options(corpus, out.path(), 8));
  EXPECT_EQ(RunPrepare(Options(corpus, out.path(), 8)).sources_reused, 2);
  const PrepareResult other = RunPrepare(Options(corpus, out.path(), 9));
  EXPECT_EQ(other.sources_reused, 0);
  EXPECT_EQ(DatasetManifest::Load(out.path()).max_document_tokens, 9);
  EXPECT_EQ(RunPrepare(Options(corpus, out.path(), 0)).sources_reused, 0);
}

TEST(PrepareTruncationTest, BadValuesAreRefusedNamingTheFlag) {
  Corpus corpus;
  TempDir out;
  PrepareOptions negative = Options(corpus, out.path(), -1);
  PrepareOptions labelled = Options(corpus, out.path(), 8);
  labelled.tokenizer.clear();
  labelled.pretokenized_vocab_size = 100;
  labelled.labelled = true;
  for (const auto* options : {&negative, &labelled}) {
    try {
      RunPrepare(*options);
      FAIL();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--max-document-tokens"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace darkformer
