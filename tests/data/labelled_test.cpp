// `prepare --labelled`: a benchmark's {"input_ids", "labels"} records (JSON lines or paired .npy)
// become shards whose rows are exactly those records, one per row, labels as given and -100 on
// padding; every bad record is an error naming file and line.
#include <gtest/gtest.h>

#include <cstring>

#include "data/data_test_util.h"
#include "data/labelled_loader.h"
#include "data/labelled_record_reader.h"
#include "data/prepare.h"
#include "util/error.h"

namespace darkformer {
namespace {

using testing::TempDir;

PrepareOptions Options(const TempDir& dir, std::vector<std::string> val_inputs) {
  PrepareOptions o;
  o.val_inputs = std::move(val_inputs);
  o.output_dir = dir.File("shards");
  o.pretokenized_vocab_size = 50;
  o.labelled = true;
  o.threads = 1;
  return o;
}

DataConfig Config(const TempDir& dir, int64_t seq_len, int64_t batch_size) {
  DataConfig config;
  config.shards_dir = dir.File("shards");
  config.seq_len = seq_len;
  config.batch_size = batch_size;
  return config;
}

// Every row of `loader` in order, inputs and labels.
std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> Rows(const BatchSource& loader, int64_t L) {
  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> rows;
  for (int64_t r = 0; r < loader.num_rows(); ++r) {
    std::vector<int64_t> inputs(L), labels(L);
    loader.FillRow(r, inputs.data(), labels.data());
    rows.emplace_back(inputs, labels);
  }
  return rows;
}

TEST(LabelledTest, RecordsBecomeOneRowEachWithTheirOwnLabels) {
  TempDir dir;
  testing::WritePlain(dir.File("a.jsonl"),
                      "{\"input_ids\": [5, 6, 7], \"labels\": [-100, -100, 9]}\n\n"
                      "{\"labels\": [4, -100], \"input_ids\": [8, 9], \"meta\": \"x\"}\n");
  testing::WriteNpy(dir.File("b.input_ids.npy"), {10, 11, 12, 13}, 2, 2);
  testing::WriteNpy(dir.File("b.labels.npy"), {-100, 20, 21, -100}, 2, 2);
  const auto result = RunPrepare(Options(dir, {dir.File("a.jsonl"), dir.File("b.input_ids.npy")}));
  EXPECT_TRUE(result.manifest.labelled);
  EXPECT_EQ(result.manifest.TotalDocuments(true), 4);
  EXPECT_EQ(DatasetManifest::Load(dir.File("shards")).shards[0].val.longest_line, 1);

  LabelledLoader loader(Config(dir, 4, 1), "val", /*pad_to_whole_batches=*/false);
  const auto rows = Rows(loader, 4);
  ASSERT_EQ(rows.size(), 4u);
  const int64_t X = kIgnoreIndex;
  EXPECT_EQ(rows[0].first, (std::vector<int64_t>{5, 6, 7, 0}));  // no BOS/EOS; padded with 0
  EXPECT_EQ(rows[0].second, (std::vector<int64_t>{X, X, 9, X}));  // not shifted
  EXPECT_EQ(rows[1].first, (std::vector<int64_t>{8, 9, 0, 0}));
  EXPECT_EQ(rows[1].second, (std::vector<int64_t>{4, X, X, X}));
  EXPECT_EQ(rows[2].second, (std::vector<int64_t>{X, 20, X, X}));
  EXPECT_EQ(rows[3].first, (std::vector<int64_t>{12, 13, 0, 0}));
  EXPECT_EQ(rows[3].second, (std::vector<int64_t>{21, X, X, X}));
}

TEST(LabelledTest, EvaluationPadsToWholeBatchesAndTrainingDropsTheRest) {
  TempDir dir;
  std::string lines;
  for (int i = 0; i < 5; ++i) lines += "{\"input_ids\": [1, 2], \"labels\": [2, 3]}\n";
  testing::WritePlain(dir.File("r.jsonl"), lines);
  RunPrepare(Options(dir, {dir.File("r.jsonl")}));
  const auto eval = OpenEvalSource(Config(dir, 4, 2), "val");
  ASSERT_TRUE(eval && eval->EvaluatedWhole());
  EXPECT_EQ(eval->num_rows(), 6);  // 5 records and one empty row
  int64_t labelled = 0;
  for (const auto& row : Rows(*eval, 4)) {
    for (int64_t label : row.second) labelled += label != kIgnoreIndex;
  }
  EXPECT_EQ(labelled, 10);
  EXPECT_EQ(OpenBatchSource(Config(dir, 4, 2), "val")->num_rows(), 5);
  EXPECT_EQ(OpenBatchSource(Config(dir, 4, 2), "val")->batches_per_epoch(), 2);
}

TEST(LabelledTest, ARecordLongerThanSeqLenNamesFileAndLine) {
  TempDir dir;
  testing::WritePlain(dir.File("r.jsonl"),
                      "{\"input_ids\": [1], \"labels\": [2]}\n{\"input_ids\": [1, 2, 3], \"labels\": [2, 3, 4]}\n");
  RunPrepare(Options(dir, {dir.File("r.jsonl")}));
  try {
    LabelledLoader loader(Config(dir, 2, 1), "val", false);
    FAIL() << "a 3-token record cannot fit seq_len 2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir.File("r.jsonl") + ":2: record of 3 tokens"), std::string::npos)
        << e.what();
  }
}

TEST(LabelledTest, ARerunReusesCommittedLabelledShards) {
  TempDir dir;
  testing::WritePlain(dir.File("r.jsonl"), "{\"input_ids\": [1, 2], \"labels\": [2, 3]}\n");
  RunPrepare(Options(dir, {dir.File("r.jsonl")}));
  EXPECT_EQ(RunPrepare(Options(dir, {dir.File("r.jsonl")})).sources_reused, 1);
  std::remove((dir.File("shards") + "/shard-00000.val.labels").c_str());
  EXPECT_EQ(RunPrepare(Options(dir, {dir.File("r.jsonl")})).sources_reused, 0);  // its labels went missing
}

// Prepare's error for `content` on line 2 of a JSON-lines file.
std::string JsonLinesError(const std::string& content) {
  TempDir dir;
  testing::WritePlain(dir.File("bad.jsonl"), "{\"input_ids\": [1, 2], \"labels\": [2, -100]}\n" + content + "\n");
  try {
    RunPrepare(Options(dir, {dir.File("bad.jsonl")}));
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind(dir.File("bad.jsonl") + ":2: ", 0), 0u) << "must start with file:line: " << message;
    return message;
  }
  ADD_FAILURE() << "accepted " << content;
  return "";
}

TEST(LabelledTest, BadRecordsAreRefusedNamingFileAndLine) {
  EXPECT_NE(JsonLinesError(R"({"input_ids": [1, 2, 3], "labels": [2, 3]})").find("3 input_ids but 2 labels"),
            std::string::npos);
  EXPECT_NE(JsonLinesError(R"({"input_ids": [1, 2], "labels": [2, 50]})").find("labels[1] = 50"), std::string::npos);
  EXPECT_NE(JsonLinesError(R"({"input_ids": [1, 2], "labels": [2, -7]})").find("labels[1] = -7"), std::string::npos);
  EXPECT_NE(JsonLinesError(R"({"input_ids": [1, 50], "labels": [2, 3]})").find("input_ids[1] = 50"),
            std::string::npos);
  EXPECT_NE(JsonLinesError(R"({"input_ids": [1, 2], "labels": [2, 1.5]})").find("labels[1] = 1.5 is not an integer"),
            std::string::npos);
  EXPECT_NE(JsonLinesError(R"({"input_ids": ["1"], "labels": [2]})").find("is not an integer"), std::string::npos);
  EXPECT_NE(JsonLinesError(R"({"input_ids": [1, 2]})").find("missing field \"labels\""), std::string::npos);
  EXPECT_NE(JsonLinesError(R"({"labels": [1, 2]})").find("missing field \"input_ids\""), std::string::npos);
  EXPECT_NE(JsonLinesError(R"({"input_ids": 3, "labels": [2]})").find("not an array"), std::string::npos);
  EXPECT_NE(JsonLinesError("[1, 2]").find("not a JSON object"), std::string::npos);
  EXPECT_NE(JsonLinesError("{\"input_ids\": [1, 2], ").find("not a JSON object"), std::string::npos);
}

TEST(LabelledTest, BadNpyRowsAreRefusedNamingFileAndRow) {
  TempDir dir;
  testing::WriteNpy(dir.File("x.input_ids.npy"), {1, 2, 3, 4}, 2, 2);
  testing::WriteNpy(dir.File("x.labels.npy"), {2, -100, 3, 99}, 2, 2);
  try {
    RunPrepare(Options(dir, {dir.File("x.input_ids.npy")}));
    FAIL() << "label 99 with --vocab-size 50 must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir.File("x.input_ids.npy") + ":2: labels[1] = 99"), std::string::npos)
        << e.what();
  }
  testing::WriteNpy(dir.File("x.labels.npy"), {2, -100, 3, 4, 5, 6}, 2, 3);
  EXPECT_THROW(RunPrepare(Options(dir, {dir.File("x.input_ids.npy")})), Error);  // shapes differ
  testing::WriteNpy(dir.File("plain.npy"), {1, 2}, 1, 2);
  try {
    RunPrepare(Options(dir, {dir.File("plain.npy")}));
    FAIL() << "an .npy without input_ids in its name has no paired labels";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"input_ids\" in its name"), std::string::npos) << e.what();
  }
  EXPECT_EQ(PairedLabelsNpyPath("/d/mqar_input_ids.npy"), "/d/mqar_labels.npy");
}

}  // namespace
}  // namespace darkformer
