// Prepare orchestration (see prepare.h): one job per source file on a pool of std::threads. Each
// job writes its shard under temporary names, renames it into place, and commits it by writing
// "<name>.done.yaml" last; a rerun reuses every committed shard whose source and settings match.
#include "data/prepare.h"

#include <glob.h>
#include <time.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include "util/atomic_file.h"
#include "data/c4_reader.h"
#include "util/hashing.h"
#include "data/token_shard_format.h"
#include "data/token_shard_writer.h"
#include "data/label_shard.h"
#include "data/labelled_record_reader.h"
#include "data/pretokenized_reader.h"
#include "data/prepare_source.h"
#include "data/tokenizer.h"
#include "util/error.h"

namespace darkformer {
namespace fs = std::filesystem;
namespace {

using prepare_source::Cancelled;
using prepare_source::FindCommitted;
using prepare_source::PrepareSource;
using prepare_source::SettingsKey;
using prepare_source::SourceJob;
using Clock = std::chrono::steady_clock;

// CPU time of the calling thread: on a shared machine it measures per-core speed where wall
// time would also count the time other processes held the core.
double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::vector<SourceJob> MakeJobs(const PrepareOptions& options) {
  std::vector<std::string> train_files;
  if (!options.inputs.empty()) train_files = ExpandInputs(options.inputs, "--input");
  std::vector<std::string> val_files;
  if (!options.val_inputs.empty()) val_files = ExpandInputs(options.val_inputs, "--val-input");
  DF_CHECK(!train_files.empty() || !val_files.empty(), "prepare: no input files (give --input)");
  std::set<std::string> val_set(val_files.begin(), val_files.end());
  for (const auto& f : train_files) {
    DF_CHECK(!val_set.count(f), "prepare: " << f << " matches both --input and --val-input");
  }
  std::vector<SourceJob> jobs;
  auto add = [&](const std::string& path, bool is_val) {
    SourceJob job;
    job.index = static_cast<int>(jobs.size());
    job.path = path;
    job.validation_source = is_val;
    std::error_code ec;
    job.bytes = static_cast<int64_t>(fs::file_size(path, ec));
    DF_CHECK(!ec, path << ": cannot read its size: " << ec.message());
    char name[32];
    std::snprintf(name, sizeof(name), "shard-%05d", job.index);
    job.name = name;
    jobs.push_back(job);
  };
  for (const auto& f : train_files) add(f, false);
  for (const auto& f : val_files) add(f, true);
  return jobs;
}

// Option checks that need no file, so a bad command line fails before anything is read.
void CheckOptions(const PrepareOptions& options) {
  DF_CHECK(options.val_fraction >= 0 && options.val_fraction < 1,
           "prepare: --val-fraction must be in [0, 1), got " << options.val_fraction);
  DF_CHECK(!options.output_dir.empty(), "prepare: --output is required");
  DF_CHECK(options.max_document_tokens >= 0,
           "prepare: --max-document-tokens must be >= 0 (0: keep documents whole), got " << options.max_document_tokens);
  DF_CHECK(options.max_document_tokens == 0 || !options.labelled,
           "prepare: --max-document-tokens does not apply to --labelled records (each is one row, its labels whole)");
}

// Loads the tokenizer model into `tokenizer`, or leaves it empty for pre-tokenized inputs.
void LoadTokenizer(const PrepareOptions& options, std::optional<Tokenizer>* tokenizer) {
  DF_CHECK(options.tokenizer.empty() != (options.pretokenized_vocab_size == 0),
           "prepare: give either a tokenizer (--tokenizer) or pre-tokenized inputs (--pretokenized --vocab-size N)");
  DF_CHECK(!options.labelled || options.pretokenized_vocab_size > 0,
           "prepare --labelled: the records are token ids, so --vocab-size N is required and --tokenizer is not");
  if (options.pretokenized_vocab_size <= 0) tokenizer->emplace(options.tokenizer);
}

// Pre-tokenized inputs have no model to take the vocabulary and special ids from.
void SetPretokenizedIds(const PrepareOptions& options, DatasetManifest* manifest) {
  manifest->tokenizer.hash = TokenizerIdentity::kPretokenizedHash;
  manifest->tokenizer.vocab_size = options.pretokenized_vocab_size;
  DF_CHECK(options.eos_id || options.labelled,
           "prepare --pretokenized: --eos-id is required (documents are joined with it)");
  manifest->bos_id = options.bos_id.value_or(-1);
  manifest->eos_id = options.eos_id.value_or(-1);
  manifest->labelled = options.labelled;
  manifest->pad_id = -1;
}

void SetTokenizerIds(const PrepareOptions& options, const Tokenizer& tokenizer, DatasetManifest* manifest) {
  manifest->tokenizer = tokenizer.identity();
  manifest->bos_id = options.bos_id.value_or(tokenizer.bos_id());
  manifest->eos_id = options.eos_id.value_or(tokenizer.eos_id());
  manifest->pad_id = tokenizer.pad_id();
}

// The manifest's header (vocabulary, special ids, split settings); its shards are added last.
// `tokenizer` is null for pre-tokenized inputs.
DatasetManifest NewManifest(const PrepareOptions& options, const Tokenizer* tokenizer) {
  DatasetManifest manifest;
  if (tokenizer) {
    SetTokenizerIds(options, *tokenizer, &manifest);
  } else {
    SetPretokenizedIds(options, &manifest);
  }
  const int64_t vocab_size = manifest.tokenizer.vocab_size;
  const std::string vocab_source = tokenizer ? options.tokenizer + "'s vocabulary" : "--vocab-size";
  manifest.bytes_per_token = BytesPerTokenForVocab(static_cast<int>(vocab_size));
  manifest.seed = options.seed;
  manifest.val_fraction = options.val_fraction;
  manifest.max_document_tokens = options.max_document_tokens;
  DF_CHECK((manifest.labelled && manifest.eos_id == -1) || (manifest.eos_id >= 0 && manifest.eos_id < vocab_size),
           "prepare: EOS id " << manifest.eos_id << " is not in " << vocab_source << " (size " << vocab_size
                              << "): pass --eos-id");
  DF_CHECK(manifest.bos_id < vocab_size, "prepare: BOS id " << manifest.bos_id << " is not in " << vocab_source);
  return manifest;
}

// Creates the output directory and removes its manifest: the manifest names the finished
// dataset, and while this run works there is none.
void ClearManifest(const std::string& output_dir) {
  fs::create_directories(output_dir);
  std::remove((fs::path(output_dir) / kManifestFileName).c_str());
}

// What every job of one run reads.
struct PrepareContext {
  const PrepareOptions& options;
  const Tokenizer* tokenizer;  // null for pre-tokenized inputs
  std::string settings;        // SettingsKey(): committed shards must match it
  int bytes_per_token = 0;
};

// Fills `records` with the shards an earlier run committed (counted in `reused`) and returns
// the jobs left to do, largest first.
std::vector<const SourceJob*> FindCommittedSources(const PrepareContext& context, const std::vector<SourceJob>& jobs,
                                                   std::vector<std::optional<ShardRecord>>* records, int* reused) {
  const std::string& output_dir = context.options.output_dir;
  std::vector<const SourceJob*> todo;
  for (const auto& job : jobs) {
    (*records)[job.index] =
        FindCommitted(output_dir, job, context.settings, context.bytes_per_token, context.options.labelled);
    if ((*records)[job.index]) {
      ++*reused;
    } else {
      todo.push_back(&job);
    }
  }
  if (*reused > 0) {
    spdlog::info("prepare: {} of {} sources already committed in {}; resuming", *reused, jobs.size(), output_dir);
  }
  // Largest first, so one big file does not start last and run alone.
  std::stable_sort(todo.begin(), todo.end(),
                   [](const SourceJob* a, const SourceJob* b) { return a->bytes > b->bytes; });
  return todo;
}

// --threads, or one per core, but no more than there are jobs (and at least one).
int WorkerCount(const PrepareOptions& options, size_t jobs) {
  const int threads =
      options.threads > 0 ? options.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, std::min<int>(threads, static_cast<int>(jobs)));
}

// What the worker threads share; they take the jobs of `todo` in order through `next`.
struct WorkQueue {
  WorkQueue(const PrepareContext& context, const std::vector<const SourceJob*>& todo,
            std::vector<std::optional<ShardRecord>>* records, PrepareResult* result)
      : context(context), todo(todo), records(*records), result(*result) {}

  const PrepareContext& context;
  const std::vector<const SourceJob*>& todo;
  std::vector<std::optional<ShardRecord>>& records;
  PrepareResult& result;
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mutex;  // guards records, result, first_error and the hook
  std::exception_ptr first_error;
};

// Adds a committed shard to the records and tallies, logs it and runs the test hook.
void RecordShard(const SourceJob& job, const ShardRecord& record, double seconds, double cpu_seconds,
                 WorkQueue* queue) {
  std::lock_guard<std::mutex> lock(queue->mutex);
  queue->result.text_bytes_processed += record.counts.text_bytes;
  queue->result.busy_seconds += seconds;
  queue->result.cpu_seconds += cpu_seconds;
  spdlog::info("{} <- {}: {} docs, {} train + {} val tokens, {} skipped lines, {:.2f} MB/s", record.name,
               job.path, record.counts.documents, record.train.tokens, record.val.tokens,
               record.counts.skipped(), record.counts.text_bytes / 1e6 / std::max(seconds, 1e-9));
  queue->records[job.index] = record;
  const PrepareOptions& options = queue->context.options;
  if (options.after_shard_committed) options.after_shard_committed(record);
}

// Prepares and records one source. Returns false when the worker should stop: the job was
// cancelled, or it failed (the first failure is kept, and stops every other worker).
bool PrepareJob(const SourceJob& job, WorkQueue* queue) {
  const PrepareContext& context = queue->context;
  auto job_start = Clock::now();
  double cpu_start = ThreadCpuSeconds();
  try {
    ShardRecord record = PrepareSource(job, context.options, context.tokenizer, context.settings,
                                       context.bytes_per_token, queue->stop);
    double seconds = std::chrono::duration<double>(Clock::now() - job_start).count();
    double cpu_seconds = ThreadCpuSeconds() - cpu_start;
    RecordShard(job, record, seconds, cpu_seconds, queue);
    return true;
  } catch (const Cancelled&) {
    return false;
  } catch (...) {
    std::lock_guard<std::mutex> lock(queue->mutex);
    if (!queue->first_error) queue->first_error = std::current_exception();
    queue->stop.store(true);
    return false;
  }
}

// One worker thread: takes the next job until none is left or the run stops.
void RunWorker(WorkQueue* queue) {
  while (!queue->stop.load()) {
    size_t i = queue->next.fetch_add(1);
    if (i >= queue->todo.size()) return;
    if (!PrepareJob(*queue->todo[i], queue)) return;
  }
}

// Prepares `todo` on a pool of threads, filling `records` and the tallies of `result`; rethrows
// the first worker's error once every thread has stopped.
void PrepareInParallel(const PrepareContext& context, const std::vector<const SourceJob*>& todo,
                       std::vector<std::optional<ShardRecord>>* records, PrepareResult* result) {
  result->threads = WorkerCount(context.options, todo.size());
  WorkQueue queue(context, todo, records, result);
  std::vector<std::thread> pool;
  for (int t = 0; t < result->threads; ++t) pool.emplace_back(RunWorker, &queue);
  for (auto& t : pool) t.join();
  if (queue.first_error) std::rethrow_exception(queue.first_error);
}

// Lists every shard, reused or new, in source order and writes manifest.yaml, which marks the
// dataset finished.
void WriteManifest(const std::string& output_dir, const std::vector<std::optional<ShardRecord>>& records,
                   DatasetManifest* manifest) {
  for (const auto& r : records) manifest->shards.push_back(*r);
  manifest->Save(output_dir);
}

}  // namespace

std::vector<std::string> ExpandInputs(const std::vector<std::string>& patterns, const std::string& option) {
  std::set<std::string> files;
  for (const auto& pattern : patterns) {
    glob_t g{};
    int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
    size_t matched = 0;
    if (rc == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) {
        if (!fs::is_regular_file(g.gl_pathv[i])) continue;
        files.insert(g.gl_pathv[i]);
        ++matched;
      }
    }
    globfree(&g);
    DF_CHECK(rc == 0 || rc == GLOB_NOMATCH, option << " '" << pattern << "': glob failed");
    DF_CHECK(matched > 0,
             option << " '" << pattern << "' matches no file");
  }
  return {files.begin(), files.end()};
}

bool IsValidationDocument(uint64_t seed, std::string_view source_name, int64_t line, double val_fraction) {
  if (val_fraction <= 0) return false;
  uint64_t h = SplitMix64(SplitMix64(seed ^ Fnv1a64(source_name)) ^ static_cast<uint64_t>(line));
  return UnitInterval(h) < val_fraction;
}

PrepareResult RunPrepare(const PrepareOptions& options) {
  const auto start = Clock::now();
  CheckOptions(options);
  const std::vector<SourceJob> jobs = MakeJobs(options);
  std::optional<Tokenizer> tokenizer;
  LoadTokenizer(options, &tokenizer);
  const Tokenizer* model = tokenizer ? &*tokenizer : nullptr;
  DatasetManifest manifest = NewManifest(options, model);
  const PrepareContext context{options, model, SettingsKey(options, manifest.tokenizer, manifest.bytes_per_token),
                               manifest.bytes_per_token};
  ClearManifest(options.output_dir);

  PrepareResult result;
  result.sources_total = static_cast<int>(jobs.size());
  std::vector<std::optional<ShardRecord>> records(jobs.size());
  const std::vector<const SourceJob*> todo = FindCommittedSources(context, jobs, &records, &result.sources_reused);
  PrepareInParallel(context, todo, &records, &result);

  WriteManifest(options.output_dir, records, &manifest);
  result.manifest = std::move(manifest);
  result.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

}  // namespace darkformer
