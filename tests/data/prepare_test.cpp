// Tests of `prepare`: gzip and plain sources, counted bad lines, truncated input, the validation
// split's determinism, and a killed-then-resumed run that equals an uninterrupted one byte for byte.
#include "data/prepare.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <map>
#include <set>

#include "data/data_test_util.h"
#include "data/token_dataset.h"
#include "data/token_shard_reader.h"
#include "data/tokenizer.h"
#include "util/error.h"

namespace darkformer {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// Three sources (two gzip, one plain) of generated documents, with a few bad lines in the plain one.
struct Corpus {
  TempDir dir;
  std::vector<std::vector<std::string>> docs;
  Corpus() {
    for (int i = 0; i < 3; ++i) docs.push_back(testing::MakeDocuments(60 + 20 * i, 100 + i));
    testing::WriteGzip(dir.File("c4-train.00000-of-00003.json.gz"), testing::C4Content(docs[0]));
    testing::WriteGzip(dir.File("c4-train.00001-of-00003.json.gz"), testing::C4Content(docs[1]));
    testing::WritePlain(dir.File("c4-train.00002-of-00003.json"),
                        testing::C4Content(docs[2]) + "{broken\n" + R"({"url":"u"})" + "\n");
  }
  std::string Glob() const { return dir.path() + "/c4-train.*"; }
};

PrepareOptions Options(const Corpus& corpus, const std::string& out) {
  PrepareOptions o;
  o.inputs = {corpus.Glob()};
  o.tokenizer = testing::TinyTokenizer();
  o.output_dir = out;
  o.val_fraction = 0.2;
  o.seed = 5;
  o.threads = 2;
  return o;
}

std::map<std::string, std::string> DirContents(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    files[entry.path().filename().string()] = testing::ReadFile(entry.path().string());
  }
  return files;
}

// Decoded texts of every document of `split`, in shard order.
std::vector<std::string> DecodedDocuments(const std::string& dir, const DatasetManifest& m, const std::string& split) {
  Tokenizer tokenizer(m.tokenizer.path);
  std::vector<std::string> texts;
  for (const auto& record : m.shards) {
    TokenShardReader reader(dir + "/" + (split == "val" ? record.val.stem : record.train.stem));
    for (int64_t d = 0; d < reader.num_documents(); ++d) {
      std::vector<int> ids;
      for (int64_t i = reader.doc_begin(d); i < reader.doc_begin(d + 1); ++i) ids.push_back(static_cast<int>(reader.token(i)));
      texts.push_back(tokenizer.Decode(ids));
    }
  }
  return texts;
}

TEST(PrepareTest, TokenizesEveryDocumentAndCountsBadLines) {
  Corpus corpus;
  TempDir out;
  PrepareResult result = RunPrepare(Options(corpus, out.path()));
  const DatasetManifest& m = result.manifest;
  ASSERT_EQ(m.shards.size(), 3u);
  EXPECT_EQ(m.bytes_per_token, 2);
  EXPECT_EQ(m.bos_id, 2);
  EXPECT_EQ(m.eos_id, 1);
  C4ReadCounts total = m.TotalCounts();
  EXPECT_EQ(total.documents, 60 + 80 + 100);
  EXPECT_EQ(total.malformed, 1);
  EXPECT_EQ(total.no_text, 1);
  EXPECT_EQ(m.shards[2].counts.skipped(), 2);
  EXPECT_EQ(m.TotalDocuments(false) + m.TotalDocuments(true), 240);
  EXPECT_GT(m.TotalDocuments(true), 20);
  EXPECT_LT(m.TotalDocuments(true), 80);

  // Train and val together hold every source document exactly once, decoding back to its text.
  auto train = DecodedDocuments(out.path(), m, "train");
  auto val = DecodedDocuments(out.path(), m, "val");
  std::multiset<std::string> got(train.begin(), train.end());
  got.insert(val.begin(), val.end());
  std::multiset<std::string> want;
  for (const auto& docs : corpus.docs) want.insert(docs.begin(), docs.end());
  EXPECT_EQ(got, want);

  // The manifest on disk says the same as the one returned.
  DatasetManifest loaded = DatasetManifest::Load(out.path());
  EXPECT_EQ(loaded.TotalTokens(false), m.TotalTokens(false));
  EXPECT_EQ(loaded.tokenizer.hash, m.tokenizer.hash);
  EXPECT_EQ(loaded.shards[2].source, corpus.dir.path() + "/c4-train.00002-of-00003.json");
}

TEST(PrepareTest, TruncatedSourceFailsNamingFileAndLine) {
  Corpus corpus;
  std::string bytes = testing::ReadFile(corpus.dir.File("c4-train.00001-of-00003.json.gz"));
  testing::WritePlain(corpus.dir.File("c4-train.00001-of-00003.json.gz"), bytes.substr(0, bytes.size() / 2));
  TempDir out;
  try {
    RunPrepare(Options(corpus, out.path()));
    FAIL();
  } catch (const Error& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("c4-train.00001-of-00003.json.gz: corrupt or truncated gzip after line"),
              std::string::npos)
        << message;
  }
  EXPECT_FALSE(fs::exists(out.File("manifest.yaml")));
}

TEST(PrepareTest, ValidationSplitIsReproducibleBySeed) {
  Corpus corpus;
  TempDir a, b, c;
  PrepareOptions options = Options(corpus, a.path());
  options.threads = 1;
  RunPrepare(options);
  options.output_dir = b.path();
  options.threads = 3;
  RunPrepare(options);
  EXPECT_EQ(DirContents(a.path()), DirContents(b.path()));

  options.output_dir = c.path();
  options.seed = 6;
  RunPrepare(options);
  EXPECT_NE(DirContents(a.path())["shard-00000.val.tokens"], DirContents(c.path())["shard-00000.val.tokens"]);

  // The split is a function of (seed, file name, line) alone.
  int held_out = 0;
  for (int line = 1; line <= 10000; ++line) held_out += IsValidationDocument(5, "x.json.gz", line, 0.1);
  EXPECT_NEAR(held_out, 1000, 120);
  EXPECT_FALSE(IsValidationDocument(5, "x.json.gz", 1, 0.0));
}

TEST(PrepareTest, ValidationInputGoesWhollyToValidation) {
  Corpus corpus;
  TempDir out;
  PrepareOptions options = Options(corpus, out.path());
  options.inputs = {corpus.dir.path() + "/*.json.gz"};
  options.val_inputs = {corpus.dir.File("c4-train.00002-of-00003.json")};
  options.val_fraction = 0;
  DatasetManifest m = RunPrepare(options).manifest;
  ASSERT_EQ(m.shards.size(), 3u);
  EXPECT_EQ(m.TotalDocuments(true), 100);
  EXPECT_EQ(m.TotalDocuments(false), 140);
  EXPECT_TRUE(m.shards[2].validation_source);
  EXPECT_EQ(m.shards[2].train.documents, 0);

  options.inputs.push_back(corpus.dir.File("c4-train.00002-of-00003.json"));
  EXPECT_THROW(RunPrepare(options), Error);
}

TEST(PrepareTest, InputThatMatchesNothingIsAnError) {
  Corpus corpus;
  TempDir out;
  PrepareOptions options = Options(corpus, out.path());
  options.inputs.push_back(corpus.dir.path() + "/nothing-*.json.gz");
  try {
    RunPrepare(options);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nothing-*.json.gz' matches no file"), std::string::npos) << e.what();
  }
}

TEST(PrepareTest, KilledThenResumedEqualsOneRun) {
  Corpus corpus;
  TempDir once, resumed;
  RunPrepare(Options(corpus, once.path()));

  // The first run dies right after committing its first shard, as a kill there would leave it;
  // a stray temporary file stands for a shard that was being written when the kill came.
  PrepareOptions options = Options(corpus, resumed.path());
  options.threads = 1;
  options.after_shard_committed = [](const ShardRecord&) { throw std::runtime_error("killed"); };
  EXPECT_THROW(RunPrepare(options), std::runtime_error);
  EXPECT_FALSE(fs::exists(resumed.File("manifest.yaml")));
  int committed = 0;
  for (const auto& entry : fs::directory_iterator(resumed.path())) {
    committed += entry.path().string().find(".done.yaml") != std::string::npos;
  }
  EXPECT_EQ(committed, 1);
  testing::WritePlain(resumed.File("shard-00001.train.tokens.tmp"), "half a shard");

  options.after_shard_committed = nullptr;
  options.threads = 2;
  PrepareResult result = RunPrepare(options);
  EXPECT_EQ(result.sources_reused, 1);
  fs::remove(resumed.File("shard-00001.train.tokens.tmp"));  // overwritten and renamed, so gone
  EXPECT_EQ(DirContents(once.path()), DirContents(resumed.path()));

  // A rerun with everything committed redoes nothing; changed settings redo everything.
  EXPECT_EQ(RunPrepare(options).sources_reused, 3);
  options.seed = 99;
  EXPECT_EQ(RunPrepare(options).sources_reused, 0);
}

TEST(PrepareTest, SigkilledThenResumedEqualsOneRun) {
  Corpus corpus;
  TempDir once, resumed;
  RunPrepare(Options(corpus, once.path()));
  // A child process is SIGKILLed as soon as its first shard commits: no destructor runs, so the
  // other worker's half-written shard stays behind as temporary files.
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    PrepareOptions options = Options(corpus, resumed.path());
    options.after_shard_committed = [](const ShardRecord&) { ::raise(SIGKILL); };
    try {
      RunPrepare(options);
    } catch (...) {
    }
    ::_exit(0);  // not reached when the kill comes
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  EXPECT_FALSE(fs::exists(resumed.File("manifest.yaml")));

  PrepareResult result = RunPrepare(Options(corpus, resumed.path()));
  EXPECT_GE(result.sources_reused, 1);
  auto contents = DirContents(resumed.path());
  for (auto it = contents.begin(); it != contents.end();) {
    // Temporary files of the killed worker are overwritten when that shard is redone.
    it = it->first.size() > 4 && it->first.substr(it->first.size() - 4) == ".tmp" ? contents.erase(it) : std::next(it);
  }
  EXPECT_EQ(DirContents(once.path()), contents);
}

TEST(PrepareTest, ShardWithoutCommitMarkerIsRedone) {
  Corpus corpus;
  TempDir out;
  PrepareOptions options = Options(corpus, out.path());
  RunPrepare(options);
  auto before = DirContents(out.path());
  // Killed between renaming the token files and writing the marker: files look whole, no marker.
  fs::remove(out.File("shard-00001.done.yaml"));
  testing::WritePlain(out.File("shard-00001.train.tokens"), "garbage");
  EXPECT_EQ(RunPrepare(options).sources_reused, 2);
  EXPECT_EQ(DirContents(out.path()), before);
}

}  // namespace
}  // namespace darkformer
