// Multi-query associative recall (MQAR), the synthetic task of Zoology (Arora et al., 2023,
// "Zoology: Measuring and Improving Recall in Efficient Language Models"), generated as its
// `multiquery_ar` does: key-value pairs first, then queries of those keys at power-law gaps; the
// model must output each queried key's value. Only the answer positions carry a label.
//
//   example (length L + 1):  k0 v0 k1 v1 ... k_{n-1} v_{n-1} | 0 .. k_j 0 .. k_i ...
//   inputs = example[0, L), labels = answers shifted by one: labels[t] = v_j where inputs[t] = k_j
//   queried, kIgnoreIndex elsewhere.
// Keys come from [1, V/2), values from [V/2, V), both without repeats within an example; the query
// of the j-th key sits at offset 2 g_j after the pairs, the gaps g_j drawn without replacement
// from [0, (L - 2n) / 2) with P(g) proportional to a (g + 1)^(a - 1).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace darkformer {

struct MqarOptions {
  int64_t vocab_size = 8192;         // V: keys from [1, V/2), values from [V/2, V); 0 is filler
  int64_t seq_len = 64;              // L: input tokens per example (even)
  int64_t num_kv_pairs = 8;          // n: pairs per example, each queried once; 4 n <= L
  double power_a = 0.01;             // a: the power law of the query gaps (smaller: longer gaps)
  bool random_non_queries = false;   // replace the filler 0s after the pairs by random tokens
  uint64_t seed = 0;                 // example i is a function of (seed, i) alone

  // Throws naming `key_path`.<key> when the options cannot make a valid example. The length is the
  // run's data.seq_len: `seq_len_key` names it (default `key_path`.seq_len).
  void Check(const std::string& key_path, const std::string& seq_len_key = "") const;
};

struct MqarExamples {
  torch::Tensor input_ids_NL;  // int64 [N, L]
  torch::Tensor labels_NL;     // int64 [N, L]: the value at answer positions, kIgnoreIndex elsewhere
};

// Examples [first, first + count) of the stream `options` defines; deterministic, so any range
// is the same bytes whichever way it is generated.
MqarExamples GenerateMqar(const MqarOptions& options, int64_t first, int64_t count);

// P(g) of the gap law over [0, space), normalised; the second form for a task's own space.
std::vector<double> MqarGapProbabilities(double power_a, int64_t space);
std::vector<double> MqarGapProbabilities(const MqarOptions& options);

// Example `index` of the stream (a function of (seed, index) alone) into seq_len inputs and
// labels: what GenerateMqar writes for that row, without holding any other example.
void WriteMqarExample(const MqarOptions& options, const std::vector<double>& gap_p, int64_t index, int64_t* inputs,
                      int64_t* labels);

}  // namespace darkformer
