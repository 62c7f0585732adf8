// Tests of the packed loader: row contents and labels for both packings against a plain
// reconstruction, deterministic shuffling, disjoint ranks, exact resume, tokenizer mismatch.
#include "data/packed_loader.h"

#include <gtest/gtest.h>

#include <set>

#include "data/data_test_util.h"
#include "data/prepare.h"
#include "data/token_shard_reader.h"
#include "util/error.h"

namespace darkformer {
namespace {

using testing::TempDir;

// Prepared shards of two small generated sources, shared by the tests of this file.
class PackedLoaderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    source_ = new TempDir();
    shards_ = new TempDir();
    testing::WriteGzip(source_->File("a.json.gz"), testing::C4Content(testing::MakeDocuments(150, 11)));
    testing::WritePlain(source_->File("b.json"), testing::C4Content(testing::MakeDocuments(150, 12)));
    PrepareOptions options;
    options.inputs = {source_->path() + "/*"};
    options.tokenizer = testing::TinyTokenizer();
    options.output_dir = shards_->path();
    options.val_fraction = 0.1;
    RunPrepare(options);
  }
  static void TearDownTestSuite() {
    delete shards_;
    delete source_;
  }

  static DataConfig Config(Packing packing = Packing::kConcat, int64_t seq_len = 16, int64_t batch_size = 4) {
    DataConfig c;
    c.shards_dir = shards_->path();
    c.tokenizer = testing::TinyTokenizer();
    c.seq_len = seq_len;
    c.batch_size = batch_size;
    c.packing = packing;
    c.seed = 3;
    return c;
  }

  // The framed documents ([BOS] tokens EOS) of the train split, read plainly from the shards.
  static std::vector<std::vector<int64_t>> FramedDocuments(bool bos) {
    DatasetManifest m = DatasetManifest::Load(shards_->path());
    std::vector<std::vector<int64_t>> docs;
    for (const auto& record : m.shards) {
      TokenShardReader reader(shards_->path() + "/" + record.train.stem);
      for (int64_t d = 0; d < reader.num_documents(); ++d) {
        std::vector<int64_t> doc;
        if (bos) doc.push_back(m.bos_id);
        for (int64_t i = reader.doc_begin(d); i < reader.doc_begin(d + 1); ++i) doc.push_back(reader.token(i));
        doc.push_back(m.eos_id);
        docs.push_back(doc);
      }
    }
    return docs;
  }

  static std::vector<int64_t> Flat(const torch::Tensor& t) {
    torch::Tensor c = t.contiguous();
    return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
  }

  static TempDir* source_;
  static TempDir* shards_;
};

TempDir* PackedLoaderTest::source_ = nullptr;
TempDir* PackedLoaderTest::shards_ = nullptr;

TEST_F(PackedLoaderTest, ConcatRowsAreTheDocumentStreamCutIntoShiftedWindows) {
  for (bool bos : {true, false}) {
    DataConfig config = Config();
    config.bos_per_document = bos;
    PackedLoader loader(config);
    std::vector<int64_t> stream;
    for (const auto& doc : FramedDocuments(bos)) stream.insert(stream.end(), doc.begin(), doc.end());
    const int64_t L = config.seq_len;
    ASSERT_EQ(loader.num_rows(), (static_cast<int64_t>(stream.size()) - 1) / L);
    std::vector<int64_t> inputs(L), labels(L);
    for (int64_t r = 0; r < loader.num_rows(); ++r) {
      loader.FillRow(r, inputs.data(), labels.data());
      ASSERT_EQ(inputs, std::vector<int64_t>(stream.begin() + r * L, stream.begin() + r * L + L)) << "row " << r;
      ASSERT_EQ(labels, std::vector<int64_t>(stream.begin() + r * L + 1, stream.begin() + r * L + L + 1)) << "row " << r;
    }
  }
}

TEST_F(PackedLoaderTest, PadRowsHoldOneDocumentWithNoLossOnPadding) {
  DataConfig config = Config(Packing::kPad, 12);
  PackedLoader loader(config);
  const int64_t L = config.seq_len;
  const int64_t pad = loader.manifest().pad_id;
  // Rebuild the expected rows: each framed document in windows of L + 1 overlapping by one.
  std::vector<std::vector<int64_t>> want_inputs, want_labels;
  for (const auto& doc : FramedDocuments(true)) {
    const int64_t m = static_cast<int64_t>(doc.size());
    for (int64_t start = 0; start + 1 < m; start += L) {
      std::vector<int64_t> in(L, pad), lab(L, kIgnoreIndex);
      for (int64_t i = 0; i < L && start + i < m; ++i) in[i] = doc[start + i];
      for (int64_t i = 0; i < L && start + i + 1 < m; ++i) lab[i] = doc[start + i + 1];
      want_inputs.push_back(in);
      want_labels.push_back(lab);
    }
  }
  ASSERT_EQ(loader.num_rows(), static_cast<int64_t>(want_inputs.size()));
  std::vector<int64_t> inputs(L), labels(L);
  int64_t padded = 0;
  for (int64_t r = 0; r < loader.num_rows(); ++r) {
    loader.FillRow(r, inputs.data(), labels.data());
    ASSERT_EQ(inputs, want_inputs[r]) << "row " << r;
    ASSERT_EQ(labels, want_labels[r]) << "row " << r;
    padded += labels.back() == kIgnoreIndex;
  }
  EXPECT_GT(padded, 0);
}

TEST_F(PackedLoaderTest, BatchesAreInt64AndFollowTheSeededShuffle) {
  PackedLoader a(Config()), b(Config());
  DataConfig other = Config();
  other.seed = 4;
  PackedLoader c(other);
  Batch first = a.Next();
  EXPECT_EQ(first.input_ids_BL.dtype(), torch::kInt64);
  EXPECT_EQ(first.input_ids_BL.sizes(), (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(first.labels_BL.sizes(), (std::vector<int64_t>{4, 16}));
  EXPECT_TRUE(torch::equal(first.input_ids_BL, b.Next().input_ids_BL));
  EXPECT_NE(a.RowsOfBatch(0, 0), c.RowsOfBatch(0, 0));
  EXPECT_NE(a.RowsOfBatch(0, 0), a.RowsOfBatch(1, 0));  // a new shuffle every epoch
  // The batch is the rows RowsOfBatch names.
  std::vector<int64_t> rows = a.RowsOfBatch(0, 0);
  std::vector<int64_t> inputs(16), labels(16);
  a.FillRow(rows[2], inputs.data(), labels.data());
  EXPECT_EQ(Flat(first.input_ids_BL[2]), inputs);
  EXPECT_EQ(Flat(first.labels_BL[2]), labels);
  // Within an epoch no row repeats.
  std::set<int64_t> seen;
  for (int64_t s = 0; s < a.batches_per_epoch(); ++s) {
    for (int64_t r : a.RowsOfBatch(0, s)) EXPECT_TRUE(seen.insert(r).second) << "row " << r << " twice";
  }
}

TEST_F(PackedLoaderTest, RanksSplitEachGlobalBatchIntoDisjointSlices) {
  DataConfig config = Config();
  config.batch_size = 12;  // the global batch
  PackedLoader single(config);
  config.world_size = 3;
  std::vector<std::unique_ptr<PackedLoader>> ranks;
  for (int r = 0; r < 3; ++r) {
    config.rank = r;
    ranks.push_back(std::make_unique<PackedLoader>(config));
  }
  ASSERT_EQ(ranks[0]->batches_per_epoch(), single.batches_per_epoch());  // the epoch does not depend on W
  std::set<int64_t> seen;
  for (int64_t s = 0; s < single.batches_per_epoch(); ++s) {
    // The three slices in rank order are the batch one process reads.
    std::vector<int64_t> joined;
    for (const auto& loader : ranks) {
      const auto rows = loader->RowsOfBatch(0, s);
      ASSERT_EQ(rows.size(), 4u);
      joined.insert(joined.end(), rows.begin(), rows.end());
    }
    EXPECT_EQ(joined, single.RowsOfBatch(0, s));
    for (int64_t r : joined) EXPECT_TRUE(seen.insert(r).second) << "row " << r << " twice";
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), single.batches_per_epoch() * 12);
  EXPECT_EQ(ranks[1]->Next().input_ids_BL.size(0), 4);
}

TEST_F(PackedLoaderTest, AGlobalBatchThatRanksCannotSplitIsAnErrorNamingBoth) {
  DataConfig config = Config();
  config.batch_size = 6;
  config.world_size = 4;
  try {
    PackedLoader loader(config);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'data.batch_size' (6"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("4 data-parallel ranks"), std::string::npos) << e.what();
  }
}

TEST_F(PackedLoaderTest, RestoredLoaderContinuesWithTheSameBatches) {
  for (const Packing packing : {Packing::kConcat, Packing::kPad}) {
    PackedLoader uninterrupted(Config(packing));
    const int64_t per_epoch = uninterrupted.batches_per_epoch();
    const int64_t saved_at = per_epoch - 2;  // resume shortly before an epoch boundary
    PackedLoader first_run(Config(packing));
    for (int64_t i = 0; i < saved_at; ++i) {
      uninterrupted.Next();
      first_run.Next();
    }
    // Through YAML text, as a checkpoint would store it.
    YAML::Emitter out;
    out << first_run.state().ToYaml();
    LoaderState saved = LoaderState::FromYaml(YAML::Load(out.c_str()), "checkpoint");
    EXPECT_EQ(saved, first_run.state());

    PackedLoader resumed(Config(packing));
    resumed.Restore(saved);
    for (int64_t i = 0; i < 5; ++i) {
      Batch want = uninterrupted.Next();
      Batch got = resumed.Next();
      ASSERT_TRUE(torch::equal(want.input_ids_BL, got.input_ids_BL)) << EnumName(packing, kPackingNames) << " batch " << i;
      ASSERT_TRUE(torch::equal(want.labels_BL, got.labels_BL)) << EnumName(packing, kPackingNames) << " batch " << i;
    }
    EXPECT_EQ(resumed.state().epoch, 1);
    EXPECT_EQ(resumed.state(), uninterrupted.state());
  }
}

TEST_F(PackedLoaderTest, RestoreRefusesAnotherSeedOrEpochLength) {
  PackedLoader loader(Config());
  LoaderState state = loader.state();
  state.seed = 99;
  EXPECT_THROW(loader.Restore(state), Error);
  state = loader.state();
  state.batches_per_epoch += 1;
  EXPECT_THROW(loader.Restore(state), Error);
}

TEST_F(PackedLoaderTest, RefusesShardsMadeWithAnotherTokenizer) {
  DataConfig config = Config();
  config.tokenizer = testing::TinyTokenizer(340);
  Tokenizer configured(config.tokenizer);
  Tokenizer made_with(testing::TinyTokenizer());
  try {
    PackedLoader loader(config);
    FAIL() << "a tokenizer mismatch must be an error";
  } catch (const Error& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("'data.tokenizer'"), std::string::npos) << message;
    EXPECT_NE(message.find(configured.identity().hash), std::string::npos) << message;
    EXPECT_NE(message.find(made_with.identity().hash), std::string::npos) << message;
    EXPECT_NE(message.find("vocab " + std::to_string(made_with.vocab_size())), std::string::npos) << message;
  }
}

TEST_F(PackedLoaderTest, ValidationSplitLoadsAndTooSmallDataIsAnError) {
  PackedLoader val(Config(Packing::kConcat, 16, 2), "val");
  EXPECT_GT(val.num_rows(), 0);
  EXPECT_THROW(PackedLoader(Config(Packing::kConcat, 16, 100000)), Error);
  DataConfig missing = Config();
  missing.shards_dir = source_->path();  // no manifest.yaml there
  EXPECT_THROW(PackedLoader loader(missing), Error);
}

}  // namespace
}  // namespace darkformer
