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
#include "data/tokenizer.h"
#include "util/error.h"

namespace darkformer {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

// CPU time of the calling thread: on a shared machine it measures per-core speed where wall
// time would also count the time other processes held the core.
double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Thrown inside a worker when another worker failed, to abandon its shard early.
struct Cancelled {};

struct SourceJob {
  int index = 0;
  std::string path;
  bool validation_source = false;
  int64_t bytes = 0;
  std::string name;  // "shard-00003"
};

// Everything that shapes a shard's bytes; a committed shard with another key is redone.
std::string SettingsKey(const PrepareOptions& options, const TokenizerIdentity& tokenizer, int bytes_per_token) {
  char fraction[32];
  std::snprintf(fraction, sizeof(fraction), "%.17g", options.val_fraction);
  return "tokenizer=" + tokenizer.hash + ";vocab=" + std::to_string(tokenizer.vocab_size) +
         ";bytes_per_token=" + std::to_string(bytes_per_token) + ";seed=" + std::to_string(options.seed) +
         ";val_fraction=" + fraction + ";split=v1";
}

std::string MarkerPath(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / (name + ".done.yaml")).string();
}

bool SplitFilesIntact(const std::string& dir, const ShardSplit& split, int bytes_per_token) {
  std::error_code ec;
  auto tokens_size = fs::file_size(fs::path(dir) / TokensFileName(split.stem), ec);
  if (ec || static_cast<int64_t>(tokens_size) != kShardHeaderBytes + split.tokens * bytes_per_token) return false;
  auto docs_size = fs::file_size(fs::path(dir) / DocsFileName(split.stem), ec);
  return !ec && static_cast<int64_t>(docs_size) == kShardHeaderBytes + (split.documents + 1) * 8;
}

// The committed record of `job` if a previous run finished it with the same settings.
std::optional<ShardRecord> FindCommitted(const std::string& dir, const SourceJob& job, const std::string& settings,
                                         int bytes_per_token) {
  std::string marker = MarkerPath(dir, job.name);
  if (!fs::exists(marker)) return std::nullopt;
  try {
    ShardRecord r = ShardRecord::FromYaml(YAML::LoadFile(marker), marker);
    if (r.source != job.path || r.source_bytes != job.bytes || r.settings != settings ||
        r.validation_source != job.validation_source || !SplitFilesIntact(dir, r.train, bytes_per_token) ||
        !SplitFilesIntact(dir, r.val, bytes_per_token)) {
      return std::nullopt;
    }
    return r;
  } catch (const std::exception& e) {
    spdlog::warn("{}: unreadable commit marker, redoing the shard ({})", marker, e.what());
    return std::nullopt;
  }
}

ShardRecord PrepareSource(const SourceJob& job, const PrepareOptions& options, const Tokenizer& tokenizer,
                          const std::string& settings, int bytes_per_token, const std::atomic<bool>& stop) {
  // A stale marker must not vouch for the files this job is about to replace.
  std::remove(MarkerPath(options.output_dir, job.name).c_str());
  ShardRecord record;
  record.name = job.name;
  record.source = job.path;
  record.source_bytes = job.bytes;
  record.validation_source = job.validation_source;
  record.settings = settings;
  record.train.stem = job.name + ".train";
  record.val.stem = job.name + ".val";

  const fs::path dir(options.output_dir);
  TokenShardWriter train((dir / record.train.stem).string(), bytes_per_token);
  TokenShardWriter val((dir / record.val.stem).string(), bytes_per_token);
  const std::string source_name = fs::path(job.path).filename().string();
  C4Reader reader(job.path);
  std::string text;
  std::vector<int> ids;
  while (reader.Next(&text)) {
    if (stop.load(std::memory_order_relaxed)) throw Cancelled{};
    tokenizer.Encode(text, &ids);
    if (ids.empty()) {
      ++record.empty_documents;
      continue;
    }
    bool is_val = job.validation_source ||
                  IsValidationDocument(options.seed, source_name, reader.counts().lines, options.val_fraction);
    (is_val ? val : train).AddDocument(ids);
  }
  for (const auto& error : reader.first_errors()) spdlog::warn("skipped {}", error);
  train.Finish();
  val.Finish();
  record.counts = reader.counts();
  record.train.documents = train.num_documents();
  record.train.tokens = train.num_tokens();
  record.val.documents = val.num_documents();
  record.val.tokens = val.num_tokens();
  YAML::Emitter out;
  out << record.ToYaml();
  WriteFileAtomically(MarkerPath(options.output_dir, job.name), std::string(out.c_str()) + "\n");
  return record;
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
  DF_CHECK(options.val_fraction >= 0 && options.val_fraction < 1,
           "prepare: --val-fraction must be in [0, 1), got " << options.val_fraction);
  DF_CHECK(!options.output_dir.empty(), "prepare: --output is required");
  std::vector<SourceJob> jobs = MakeJobs(options);

  Tokenizer tokenizer(options.tokenizer);
  DatasetManifest manifest;
  manifest.tokenizer = tokenizer.identity();
  manifest.bytes_per_token = BytesPerTokenForVocab(tokenizer.vocab_size());
  manifest.bos_id = options.bos_id.value_or(tokenizer.bos_id());
  manifest.eos_id = options.eos_id.value_or(tokenizer.eos_id());
  manifest.pad_id = tokenizer.pad_id();
  manifest.seed = options.seed;
  manifest.val_fraction = options.val_fraction;
  DF_CHECK(manifest.eos_id >= 0 && manifest.eos_id < tokenizer.vocab_size(),
           "prepare: EOS id " << manifest.eos_id << " is not in " << options.tokenizer
                              << "'s vocabulary (size " << tokenizer.vocab_size() << "): pass --eos-id");
  DF_CHECK(manifest.bos_id < tokenizer.vocab_size(),
           "prepare: BOS id " << manifest.bos_id << " is not in " << options.tokenizer << "'s vocabulary");
  const std::string settings = SettingsKey(options, tokenizer.identity(), manifest.bytes_per_token);

  fs::create_directories(options.output_dir);
  // The manifest names the finished dataset; while this run works, there is none.
  std::remove((fs::path(options.output_dir) / kManifestFileName).c_str());

  PrepareResult result;
  result.sources_total = static_cast<int>(jobs.size());
  std::vector<std::optional<ShardRecord>> records(jobs.size());
  std::vector<const SourceJob*> todo;
  for (const auto& job : jobs) {
    records[job.index] = FindCommitted(options.output_dir, job, settings, manifest.bytes_per_token);
    if (records[job.index]) {
      ++result.sources_reused;
    } else {
      todo.push_back(&job);
    }
  }
  if (result.sources_reused > 0) {
    spdlog::info("prepare: {} of {} sources already committed in {}; resuming", result.sources_reused, jobs.size(),
                 options.output_dir);
  }
  // Largest first, so one big file does not start last and run alone.
  std::stable_sort(todo.begin(), todo.end(), [](const SourceJob* a, const SourceJob* b) { return a->bytes > b->bytes; });

  int threads = options.threads > 0 ? options.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::max(1, std::min<int>(threads, static_cast<int>(todo.size())));
  result.threads = threads;
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mutex;  // guards records, result, first_error and the hook
  std::exception_ptr first_error;
  auto worker = [&]() {
    while (!stop.load()) {
      size_t i = next.fetch_add(1);
      if (i >= todo.size()) return;
      const SourceJob& job = *todo[i];
      auto job_start = Clock::now();
      double cpu_start = ThreadCpuSeconds();
      try {
        ShardRecord record = PrepareSource(job, options, tokenizer, settings, manifest.bytes_per_token, stop);
        double seconds = std::chrono::duration<double>(Clock::now() - job_start).count();
        double cpu_seconds = ThreadCpuSeconds() - cpu_start;
        std::lock_guard<std::mutex> lock(mutex);
        result.text_bytes_processed += record.counts.text_bytes;
        result.busy_seconds += seconds;
        result.cpu_seconds += cpu_seconds;
        spdlog::info("{} <- {}: {} docs, {} train + {} val tokens, {} skipped lines, {:.2f} MB/s", record.name,
                     job.path, record.counts.documents, record.train.tokens, record.val.tokens,
                     record.counts.skipped(), record.counts.text_bytes / 1e6 / std::max(seconds, 1e-9));
        records[job.index] = record;
        if (options.after_shard_committed) options.after_shard_committed(record);
      } catch (const Cancelled&) {
        return;
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first_error) first_error = std::current_exception();
        stop.store(true);
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  if (first_error) std::rethrow_exception(first_error);

  for (auto& r : records) manifest.shards.push_back(*r);
  manifest.Save(options.output_dir);
  result.manifest = std::move(manifest);
  result.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

}  // namespace darkformer
