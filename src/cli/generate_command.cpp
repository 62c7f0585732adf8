// `darkformer generate --config run.yaml [--checkpoint path] (--prompt TEXT | --prompt-file F)
// [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S] [--greedy]`:
// SentencePiece-encodes each prompt (BOS when the model was trained with one), streams the
// decoded continuation to stdout as tokens are chosen, stops at EOS or N new tokens, and logs
// tokens/s to stderr. A prompt file holds one prompt per line; they run one after another.
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "cli/commands.h"
#include "data/tokenizer.h"
#include "model/generation.h"
#include "train/model_loading.h"
#include "util/error.h"
#include "util/mixed_precision.h"

namespace darkformer {

namespace {

struct GenerateArgs {
  std::string config_path, checkpoint, prompt_file, tokenizer;
  std::optional<std::string> prompt;
  std::vector<std::string> overrides;
  SamplingOptions sampling;
  bool ignore_eos = false;
};

std::vector<std::string> ReadPrompts(const GenerateArgs& a) {
  DF_CHECK(a.prompt.has_value() != !a.prompt_file.empty(), "generate: give exactly one of --prompt and --prompt-file");
  if (!a.prompt_file.empty()) {
    DF_CHECK(std::filesystem::exists(a.prompt_file), "--prompt-file " << a.prompt_file << ": no such file");
    DF_CHECK(!std::filesystem::is_directory(a.prompt_file), "--prompt-file " << a.prompt_file << ": is a directory");
    std::ifstream in(a.prompt_file);
    DF_CHECK(in, "--prompt-file " << a.prompt_file << ": cannot be read");
    std::vector<std::string> prompts;
    std::string line;
    for (int64_t number = 1; std::getline(in, line); ++number) {
      if (!line.empty() && line.back() == '\r') line.pop_back();  // a CRLF file gives the same prompts as LF
      DF_CHECK(!line.empty(), "--prompt-file " << a.prompt_file << ":" << number << ": empty prompt line");
      prompts.push_back(line);
    }
    DF_CHECK(!prompts.empty(), "--prompt-file " << a.prompt_file << ": no prompts");
    return prompts;
  }
  DF_CHECK(!a.prompt->empty(), "--prompt is empty");
  return {*a.prompt};
}

void RunGenerate(const GenerateArgs& a) {
  const auto config = RunConfig::Load(a.config_path, a.overrides);
  if (config.train.threads > 0) torch::set_num_threads(static_cast<int>(config.train.threads));
  const std::string tokenizer_path = a.tokenizer.empty() ? config.data.tokenizer : a.tokenizer;
  DF_CHECK(!tokenizer_path.empty(), "generate: the config has no data.tokenizer; pass --tokenizer");
  const Tokenizer tokenizer(tokenizer_path);
  const auto prompts = ReadPrompts(a);
  const std::string weights = a.checkpoint.empty() ? config.log.dir : a.checkpoint;
  auto model = BuildModelFrom(config, weights, a.checkpoint.empty() ? "config key 'log.dir'" : "--checkpoint");
  DF_CHECK(tokenizer.vocab_size() <= model->config().vocab_size,
           "generate: tokenizer " << tokenizer_path << " has " << tokenizer.vocab_size()
                                  << " pieces, more than the model's vocab_size " << model->config().vocab_size);
  const auto device = ResolveDevice(config);
  ApplyTf32(config.train.tf32, device);
  model->to(device);
  model->eval();
  // train.precision holds for generation too: bf16 GEMMs under autocast, random-feature states in
  // fp32. No weight changes while generating, so one scope (one cast cache) serves every prompt.
  AutocastScope autocast(device.type(), config.train.precision == Precision::kBf16Autocast);
  auto sampling = a.sampling;
  sampling.eos_id = a.ignore_eos ? -1 : tokenizer.eos_id();
  const bool with_bos = config.data.bos_per_document && tokenizer.bos_id() >= 0;

  // Every prompt is encoded and checked before anything is generated or printed.
  const int64_t max_positions = model->config().max_position_embeddings;
  std::vector<std::vector<int64_t>> encoded;
  for (size_t n = 0; n < prompts.size(); ++n) {
    std::vector<int> ids;
    tokenizer.Encode(prompts[n], &ids);
    DF_CHECK(!ids.empty(), "generate: prompt " << n + 1 << " encodes to no tokens");
    std::vector<int64_t> prompt(ids.begin(), ids.end());
    if (with_bos) prompt.insert(prompt.begin(), tokenizer.bos_id());
    DF_CHECK(static_cast<int64_t>(prompt.size()) < max_positions,
             "generate: prompt " << n + 1 << " has " << prompt.size()
                                 << " tokens; the model's max_position_embeddings is " << max_positions);
    // As documented, the model's positions end a generation too; said once, with the option named
    // (subtracting, never adding: --max-new-tokens may be near int64's maximum).
    const int64_t room = max_positions - static_cast<int64_t>(prompt.size());
    if (sampling.max_new_tokens > room) {
      spdlog::warn("prompt {}: --max-new-tokens {} does not fit the model's max_position_embeddings {} after {} prompt "
                   "tokens; at most {} new tokens",
                   n + 1, sampling.max_new_tokens, max_positions, prompt.size(), room);
    }
    encoded.push_back(std::move(prompt));
  }

  int64_t total_tokens = 0;
  double total_ms = 0.0;
  for (size_t n = 0; n < prompts.size(); ++n) {
    const auto& prompt = encoded[n];
    // Stream: decode the prompt and everything produced so far and print what is new (a piece
    // decodes differently at the start of a text than after others, e.g. its leading space).
    std::vector<int> produced(prompt.begin() + (with_bos ? 1 : 0), prompt.end());
    std::string printed = tokenizer.Decode(produced);
    std::cout << printed << std::flush;
    const auto result = Generate(model, prompt, sampling, [&](int64_t token) {
      if (token == tokenizer.eos_id() && sampling.eos_id >= 0) return;
      produced.push_back(static_cast<int>(token));
      const auto text = tokenizer.Decode(produced);
      if (text.size() > printed.size() && text.compare(0, printed.size(), printed) == 0) {
        std::cout << text.substr(printed.size()) << std::flush;
        printed = text;
      }
    });
    std::cout << std::endl;
    const double ms = result.prefill_ms + result.decode_ms;
    spdlog::info("prompt {}: {} prompt tokens, {} new tokens in {:.1f} ms ({:.1f} tokens/s; prefill {:.1f} ms){}",
                 n + 1, prompt.size(), result.tokens.size(), ms, 1000.0 * result.tokens.size() / ms,
                 result.prefill_ms, result.tokens.back() == sampling.eos_id ? ", stopped at EOS" : "");
    total_tokens += static_cast<int64_t>(result.tokens.size());
    total_ms += ms;
  }
  spdlog::info("generated {} tokens in {:.2f} s: {:.1f} tokens/s", total_tokens, total_ms / 1000.0,
               1000.0 * total_tokens / total_ms);
}

}  // namespace

void AddGenerateCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Generate text from a trained model");
  static GenerateArgs a;
  cmd->add_option("--config", a.config_path, "run config YAML")->required();
  cmd->add_option("--checkpoint", a.checkpoint, "weights .h5 or a run directory (default: the config's log.dir)");
  cmd->add_option("--prompt", a.prompt, "the prompt text");
  cmd->add_option("--prompt-file", a.prompt_file, "a file of prompts, one per line");
  cmd->add_option("--tokenizer", a.tokenizer, "SentencePiece .model (default: the config's data.tokenizer)");
  cmd->add_option("--max-new-tokens", a.sampling.max_new_tokens, "stop after this many new tokens (default 64)");
  cmd->add_option("--temperature", a.sampling.temperature, "divide logits by T before sampling (default 1)");
  cmd->add_option("--top-k", a.sampling.top_k, "sample among the K most likely tokens (0: all)");
  cmd->add_option("--top-p", a.sampling.top_p, "sample from the smallest set with probability >= P (default 1)");
  cmd->add_option("--seed", a.sampling.seed, "sampling seed (default 0)");
  cmd->add_flag("--greedy", a.sampling.greedy, "always take the most likely token");
  cmd->add_flag("--ignore-eos", a.ignore_eos, "do not stop at EOS (benchmarks: always N new tokens)");
  cmd->add_option("--set", a.overrides, "override a config key: a.b.c=value (repeatable)");
  cmd->callback([] {
    ValidateSampling(a.sampling);
    RunGenerate(a);
  });
}

}  // namespace darkformer
