// The MQAR generator against its definition (Zoology's multiquery_ar): every query's label is the
// value paired with that key earlier in the sequence, nothing else carries a label, the gaps follow
// the configured power law, and the stream is a pure function of (seed, example index).
#include "data/mqar.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "data/mqar_source.h"
#include "util/error.h"
#include "util/labels.h"

namespace darkformer {
namespace {

MqarOptions Options(int64_t vocab = 128, int64_t seq_len = 64, int64_t pairs = 8, double power_a = 0.01) {
  MqarOptions o;
  o.vocab_size = vocab;
  o.seq_len = seq_len;
  o.num_kv_pairs = pairs;
  o.power_a = power_a;
  o.seed = 7;
  return o;
}

TEST(MqarTest, EveryAnswerIsTheValuePairedWithTheQueriedKey) {
  const auto o = Options();
  const auto ex = GenerateMqar(o, 0, 500);
  const auto in = ex.input_ids_NL.accessor<int64_t, 2>();
  const auto lab = ex.labels_NL.accessor<int64_t, 2>();
  const int64_t n = o.num_kv_pairs, context = 2 * n, half = o.vocab_size / 2;
  for (int64_t e = 0; e < 500; ++e) {
    std::map<int64_t, int64_t> pairs;
    std::set<int64_t> values;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t k = in[e][2 * j], v = in[e][2 * j + 1];
      ASSERT_TRUE(k >= 1 && k < half) << "key " << k;
      ASSERT_TRUE(v >= half && v < o.vocab_size) << "value " << v;
      ASSERT_TRUE(pairs.emplace(k, v).second) << "repeated key " << k;
      ASSERT_TRUE(values.insert(v).second) << "repeated value " << v;
    }
    std::set<int64_t> queried;
    for (int64_t t = 0; t < o.seq_len; ++t) {
      if (lab[e][t] == kIgnoreIndex) {
        // Outside the answers the sequence holds the pairs, filler 0s, or a query's key.
        if (t >= context) ASSERT_TRUE(in[e][t] == 0 || pairs.count(in[e][t])) << "example " << e << " t " << t;
        continue;
      }
      ASSERT_GE(t, context) << "a label inside the key-value pairs";
      ASSERT_TRUE(pairs.count(in[e][t])) << "labelled position " << t << " is not a key";
      EXPECT_EQ(lab[e][t], pairs.at(in[e][t]));
      queried.insert(in[e][t]);
    }
    EXPECT_EQ(static_cast<int64_t>(queried.size()), n) << "every key is queried exactly once";
    EXPECT_EQ(ex.labels_NL[e].ne(kIgnoreIndex).sum().item<int64_t>(), n);
  }
}

TEST(MqarTest, QueryGapsFollowThePowerLaw) {
  // The first key's gap is the first draw of the law, so its frequencies are P(g) itself.
  for (const double power_a : {0.01, 0.5, 1.0}) {
    const auto o = Options(128, 64, 8, power_a);
    const int64_t draws = 20000, space = (o.seq_len - 2 * o.num_kv_pairs) / 2;
    const auto ex = GenerateMqar(o, 0, draws);
    const auto in = ex.input_ids_NL.accessor<int64_t, 2>();
    std::vector<double> counts(space, 0.0);
    for (int64_t e = 0; e < draws; ++e) {
      for (int64_t g = 0; g < space; ++g) {
        if (in[e][2 * o.num_kv_pairs + 2 * g] == in[e][0]) counts[g] += 1;
      }
    }
    const auto p = MqarGapProbabilities(power_a, space);
    double chi2 = 0.0;
    for (int64_t g = 0; g < space; ++g) chi2 += std::pow(counts[g] - draws * p[g], 2) / (draws * p[g]);
    // 23 degrees of freedom: the 99.9% quantile of chi-square is 49.7.
    EXPECT_LT(chi2, 49.7) << "power_a " << power_a;
    if (power_a == 0.01) EXPECT_GT(counts[0], 5 * counts[space - 1]);  // short gaps dominate
  }
}

TEST(MqarTest, SameSeedSameBytesAndAnyRangeAgrees) {
  const auto o = Options();
  const auto a = GenerateMqar(o, 0, 50), b = GenerateMqar(o, 0, 50), tail = GenerateMqar(o, 20, 30);
  EXPECT_TRUE(torch::equal(a.input_ids_NL, b.input_ids_NL));
  EXPECT_TRUE(torch::equal(a.labels_NL, b.labels_NL));
  EXPECT_TRUE(torch::equal(a.input_ids_NL.narrow(0, 20, 30), tail.input_ids_NL));
  auto other = o;
  other.seed = 8;
  EXPECT_FALSE(torch::equal(a.input_ids_NL, GenerateMqar(other, 0, 50).input_ids_NL));
}

TEST(MqarTest, RandomFillerReplacesOnlyTheZeros) {
  auto o = Options();
  const auto plain = GenerateMqar(o, 0, 20);
  o.random_non_queries = true;
  const auto filled = GenerateMqar(o, 0, 20);
  EXPECT_TRUE(torch::equal(plain.labels_NL, filled.labels_NL));
  const auto keep = plain.input_ids_NL.ne(0);
  EXPECT_TRUE(torch::equal(plain.input_ids_NL.masked_select(keep), filled.input_ids_NL.masked_select(keep)));
  EXPECT_GT(filled.input_ids_NL.ne(0).sum().item<int64_t>(), keep.sum().item<int64_t>());
}

TEST(MqarTest, BadOptionsNameTheirKey) {
  auto message = [](MqarOptions o) {
    try {
      o.Check("data.mqar", "data.seq_len");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(Options(128, 64, 17)).find("data.mqar.num_kv_pairs"), std::string::npos);
  EXPECT_NE(message(Options(128, 64, 17)).find("data.seq_len"), std::string::npos);  // both keys of the clash
  EXPECT_NE(message(Options(128, 64, int64_t{1} << 62)).find("data.mqar.num_kv_pairs"), std::string::npos);
  EXPECT_NE(message(Options(32, 64, 8)).find("data.mqar.vocab_size"), std::string::npos);
  EXPECT_NE(message(Options(128, 63, 8)).find("data.seq_len"), std::string::npos);  // the key the user wrote
  EXPECT_NE(message(Options(128, 64, 8, 0.0)).find("data.mqar.power_a"), std::string::npos);
}

// A small MQAR run: 32 tokens, 4 pairs, 40 training and 8 validation examples, 4 rows a batch.
DataConfig SmallMqarConfig() {
  DataConfig config;
  config.source = DataSource::kMqar;
  config.seq_len = 32;
  config.batch_size = 4;
  config.mqar.task = Options(64, 32, 4);
  config.mqar.train_examples = 40;
  config.mqar.val_examples = 8;
  config.mqar.val_seed = 99;
  return config;
}

TEST(MqarSourceTest, TrainAndValidationAreDifferentExamplesAndBatchesAreDeterministic) {
  auto config = SmallMqarConfig();
  auto train = OpenBatchSource(config, "train"), again = OpenBatchSource(config, "train");
  auto val = OpenBatchSource(config, "val");
  ASSERT_TRUE(val);
  EXPECT_EQ(train->batches_per_epoch(), 10);
  EXPECT_EQ(val->batches_per_epoch(), 2);
  EXPECT_EQ(train->vocab_size(), 64);
  const auto t = train->Next(), u = again->Next(), v = val->Next();
  EXPECT_TRUE(torch::equal(t.input_ids_BL, u.input_ids_BL));
  EXPECT_FALSE(torch::equal(t.input_ids_BL, v.input_ids_BL));
  EXPECT_EQ(t.labels_BL.ne(kIgnoreIndex).sum().item<int64_t>(), 4 * 4);
  config.mqar.val_examples = 0;
  EXPECT_EQ(OpenBatchSource(config, "val"), nullptr);
}

}  // namespace
}  // namespace darkformer

namespace darkformer {

// Rows are made on demand: each equals the materialised stream's row, and a set of 10^12 examples
// (256 TB if it were held) opens and yields batches at once.
TEST(MqarSourceTest, RowsOnDemandEqualTheStreamAndMemoryDoesNotGrowWithTheSetSize) {
  auto config = SmallMqarConfig();
  MqarSource source(config, "train");
  auto task = config.mqar.task;
  task.seq_len = config.seq_len;
  const auto stream = GenerateMqar(task, 0, 40);
  std::vector<int64_t> inputs(32), labels(32);
  for (int64_t row = 0; row < 40; ++row) {
    source.FillRow(row, inputs.data(), labels.data());
    EXPECT_TRUE(torch::equal(torch::tensor(inputs), stream.input_ids_NL[row])) << "row " << row;
    EXPECT_TRUE(torch::equal(torch::tensor(labels), stream.labels_NL[row])) << "row " << row;
  }
  config.mqar.train_examples = 1'000'000'000'000;
  auto huge = OpenBatchSource(config, "train");
  EXPECT_EQ(huge->batches_per_epoch(), 250'000'000'000);
  for (int i = 0; i < 3; ++i) {
    const auto batch = huge->Next();
    EXPECT_EQ(batch.input_ids_BL.size(0), 4);
    EXPECT_EQ(batch.labels_BL.ne(kIgnoreIndex).sum().item<int64_t>(), 4 * 4);  // every example has its 4 answers
  }
}

}  // namespace darkformer
