// `darkformer prepare`: tokenizes C4 JSON-lines sources into token shards (src/data/prepare.h)
// and reports what it read, skipped and wrote.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <memory>

#include "cli/commands.h"
#include "data/prepare.h"
#include "util/error.h"

namespace darkformer {
namespace {

struct PrepareFlags {
  PrepareOptions options;
  int bos_id = -2;  // -2: not given (use the tokenizer's); -1: none
  int eos_id = -2;
  bool pretokenized = false;
  bool labelled = false;
};

void RunPrepareCommand(const PrepareFlags& flags) {
  PrepareOptions options = flags.options;
  // --labelled records are token ids too, so it implies --pretokenized.
  options.labelled = flags.labelled;
  DF_CHECK((flags.pretokenized || flags.labelled) == (options.pretokenized_vocab_size > 0),
           "prepare: --pretokenized (or --labelled) and --vocab-size N (N > 0) go together; without them, give "
           "--tokenizer");
  if (flags.bos_id != -2) options.bos_id = flags.bos_id;
  if (flags.eos_id != -2) options.eos_id = flags.eos_id;
  PrepareResult result = RunPrepare(options);
  const DatasetManifest& m = result.manifest;
  C4ReadCounts total = m.TotalCounts();
  int64_t empty = 0;
  for (const auto& s : m.shards) empty += s.empty_documents;
  spdlog::info("prepare: {} sources ({} reused from an earlier run) -> {}", result.sources_total,
               result.sources_reused, options.output_dir);
  spdlog::info("read {} lines: {} documents, {} skipped ({} malformed, {} without text), {} blank; {} empty after "
               "tokenizing",
               total.lines, total.documents, total.skipped(), total.malformed, total.no_text, total.blank, empty);
  spdlog::info("train: {} documents, {} tokens; val: {} documents, {} tokens; {} bytes per token; tokenizer {}",
               m.TotalDocuments(false), m.TotalTokens(false), m.TotalDocuments(true), m.TotalTokens(true),
               m.bytes_per_token, m.tokenizer.Describe());
  if (m.max_document_tokens > 0) {
    spdlog::info("{} of {} documents cut to their first {} tokens (--max-document-tokens)",
                 m.TotalTruncatedDocuments(), m.TotalDocuments(false) + m.TotalDocuments(true), m.max_document_tokens);
  }
  if (result.text_bytes_processed > 0) {
    double mb = result.text_bytes_processed / 1e6;
    spdlog::info("throughput: {:.1f} MB of text in {:.2f} s on {} threads = {:.2f} MB/s; {:.2f} MB per CPU-second "
                 "(per core)",
                 mb, result.wall_seconds, result.threads, mb / result.wall_seconds, mb / result.cpu_seconds);
  }
}

}  // namespace

void AddPrepareCommand(CLI::App& app) {
  auto flags = std::make_shared<PrepareFlags>();
  PrepareOptions& o = flags->options;
  CLI::App* cmd = app.add_subcommand(
      "prepare", "Tokenize C4 JSON-lines files (.json.gz or plain) into token shards for training; resumable");
  cmd->add_option("--input,-i", o.inputs, "C4 source files or glob patterns (repeatable)");
  cmd->add_option("--val-input", o.val_inputs,
                  "Sources whose every document goes to the validation split (repeatable; files or globs)");
  auto* tokenizer = cmd->add_option("--tokenizer,-t", o.tokenizer, "SentencePiece .model file")->check(CLI::ExistingFile);
  auto* pretokenized = cmd->add_flag("--pretokenized", flags->pretokenized,
                                     "Inputs are token ids: JSON lines of id arrays (or {\"input_ids\": [...]}) or .npy "
                                     "(1-D: one document, 2-D: one per row); needs --vocab-size and --eos-id");
  auto* labelled = cmd->add_flag(
      "--labelled", flags->labelled,
      "Inputs are a benchmark's labelled records: JSON lines {\"input_ids\": [...], \"labels\": [...]} (labels "
      "aligned, -100 not scored) or x.input_ids.npy with x.labels.npy; shards keep the labels, one record per row; "
      "needs --vocab-size");
  cmd->add_option("--vocab-size", o.pretokenized_vocab_size, "With --pretokenized or --labelled: ids lie in [0, N)");
  tokenizer->excludes(pretokenized);
  tokenizer->excludes(labelled);
  cmd->add_option("--output,-o", o.output_dir, "Output directory for shards and manifest.yaml")->required();
  cmd->add_option("--val-fraction", o.val_fraction,
                  "Fraction of --input documents held out for validation, chosen by seed")
      ->capture_default_str();
  cmd->add_option("--max-document-tokens", o.max_document_tokens,
                  "Keep each document's first N tokens and drop the rest (0: whole documents; not with --labelled)")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "Seed of the validation split")->capture_default_str();
  cmd->add_option("--threads,-j", o.threads, "Worker threads over source files (0: one per core)")
      ->capture_default_str();
  cmd->add_option("--bos-id", flags->bos_id, "BOS id recorded for the loader (default: the tokenizer's; -1: none)");
  cmd->add_option("--eos-id", flags->eos_id, "EOS id recorded for the loader (default: the tokenizer's)");
  cmd->callback([flags]() { RunPrepareCommand(*flags); });
}

}  // namespace darkformer
