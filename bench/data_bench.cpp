// data_bench: prepare throughput (MB of text per second per core) and loader throughput
// (batches per second) on real C4 files. A benchmark, not a test: tools/bench_data.sh runs it.
#include <spdlog/spdlog.h>
#include <stdlib.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "data/packed_loader.h"
#include "data/prepare.h"
#include "util/error.h"

namespace {

using Clock = std::chrono::steady_clock;
using darkformer::DataConfig;
using darkformer::PackedLoader;
using darkformer::PrepareOptions;
using darkformer::PrepareResult;

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

PrepareResult TimePrepare(PrepareOptions options, int threads) {
  options.threads = threads;
  PrepareResult r = darkformer::RunPrepare(options);
  double mb = r.text_bytes_processed / 1e6;
  std::printf("prepare  threads=%d  %.2f MB text, %lld docs, %lld tokens in %.2f s: %.2f MB/s total, "
              "%.2f MB/s per busy thread (wall), %.2f MB per CPU-second (per core)\n",
              r.threads, mb, static_cast<long long>(r.manifest.TotalCounts().documents),
              static_cast<long long>(r.manifest.TotalTokens(false) + r.manifest.TotalTokens(true)), r.wall_seconds,
              mb / r.wall_seconds, mb / r.busy_seconds, mb / r.cpu_seconds);
  return r;
}

void TimeLoader(const DataConfig& config, int batches) {
  PackedLoader loader(config);
  loader.Next();  // page the maps in, as a running trainer would have
  auto start = Clock::now();
  int64_t checksum = 0;
  for (int i = 0; i < batches; ++i) checksum += loader.Next().input_ids_BL[0][0].item<int64_t>();
  double s = Seconds(start);
  std::printf("loader   packing=%-6s B=%lld L=%lld  %d batches in %.3f s: %.0f batches/s, %.1f us/batch, %.1f M "
              "tokens/s (%lld rows, %lld batches/epoch; checksum %lld)\n",
              darkformer::EnumName(config.packing, darkformer::kPackingNames).c_str(), static_cast<long long>(config.batch_size),
              static_cast<long long>(config.seq_len), batches, s, batches / s, 1e6 * s / batches,
              batches * config.batch_size * config.seq_len / s / 1e6, static_cast<long long>(loader.num_rows()),
              static_cast<long long>(loader.batches_per_epoch()), static_cast<long long>(checksum));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"data_bench: prepare and loader throughput on C4 files"};
  PrepareOptions options;
  std::vector<int> thread_counts = {1, 2};
  int batches = 20000;
  int64_t seq_len = 1024, batch_size = 8;
  app.add_option("--input", options.inputs, "C4 files or globs")->required();
  app.add_option("--tokenizer", options.tokenizer, "SentencePiece .model")->required();
  app.add_option("--work-dir", options.output_dir, "Scratch directory for shards (emptied per run)")->required();
  app.add_option("--threads", thread_counts, "Thread counts to time prepare with")->capture_default_str();
  app.add_option("--batches", batches, "Loader batches to time")->capture_default_str();
  app.add_option("--seq-len", seq_len, "Loader sequence length")->capture_default_str();
  app.add_option("--batch-size", batch_size, "Loader batch size")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);
  try {
    const std::string root = options.output_dir;
    options.val_fraction = 0.01;
    std::string last_dir;
    for (int threads : thread_counts) {
      options.output_dir = root + "/threads-" + std::to_string(threads);
      // Always from scratch: a committed shard would be reused, not timed. The directory is flat.
      std::filesystem::create_directories(options.output_dir);
      for (const auto& f : std::filesystem::directory_iterator(options.output_dir)) std::filesystem::remove(f.path());
      TimePrepare(options, threads);
      last_dir = options.output_dir;
    }
    DataConfig config;
    config.shards_dir = last_dir;
    config.tokenizer = options.tokenizer;
    config.seq_len = seq_len;
    config.batch_size = batch_size;
    for (const auto packing : {darkformer::Packing::kConcat, darkformer::Packing::kPad}) {
      config.packing = packing;
      TimeLoader(config, batches);
    }
  } catch (const darkformer::Error& e) {
    spdlog::error("{}", e.what());
    return 2;
  }
  return 0;
}
