// MQAR generation (see mqar.h).
#include "data/mqar.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "util/error.h"
#include "util/hashing.h"
#include "util/labels.h"

namespace darkformer {

namespace {

// A uniform index in [0, n) from a 64-bit engine, without modulo bias (Lemire's method), so the
// bytes are fixed by the seed alone and not by a standard library's distribution code.
int64_t UniformIndex(std::mt19937_64& rng, int64_t n) {
  const auto range = static_cast<uint64_t>(n);
  while (true) {
    const unsigned __int128 product = static_cast<unsigned __int128>(rng()) * range;
    const auto low = static_cast<uint64_t>(product);
    if (low >= (-range) % range) return static_cast<int64_t>(product >> 64);
  }
}

// `count` distinct values from [lo, hi), in draw order.
std::vector<int64_t> DistinctUniform(std::mt19937_64& rng, int64_t lo, int64_t hi, int64_t count) {
  std::vector<int64_t> out;
  while (static_cast<int64_t>(out.size()) < count) {
    const int64_t v = lo + UniformIndex(rng, hi - lo);
    if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
  }
  return out;
}

// `count` distinct gaps drawn one after another from `p`, each draw renormalised over the gaps
// not yet taken (numpy's choice(replace=False, p=p)).
std::vector<int64_t> DistinctWeighted(std::mt19937_64& rng, std::vector<double> p, int64_t count) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < count; ++i) {
    double total = 0.0;
    for (const double w : p) total += w;
    double u = UnitInterval(rng()) * total;
    int64_t pick = static_cast<int64_t>(p.size()) - 1;
    for (size_t g = 0; g < p.size(); ++g) {
      if (p[g] > 0 && u < p[g]) {
        pick = static_cast<int64_t>(g);
        break;
      }
      u -= p[g];
    }
    while (p[pick] == 0) --pick;  // rounding past the end lands on the last gap still open
    out.push_back(pick);
    p[pick] = 0.0;
  }
  return out;
}

}  // namespace

void MqarOptions::Check(const std::string& key_path, const std::string& seq_len_key) const {
  auto key = [&](const char* k) { return key_path + "." + k; };
  const std::string length = seq_len_key.empty() ? key("seq_len") : seq_len_key;
  DF_CHECK(seq_len > 0 && seq_len % 2 == 0, "config key '" << length << "' must be positive and even for MQAR, got " << seq_len);
  // Divided, not multiplied: 4 * num_kv_pairs may overflow.
  DF_CHECK(num_kv_pairs > 0 && num_kv_pairs <= seq_len / 4,
           "config key '" << key("num_kv_pairs") << "' (" << num_kv_pairs << ") must be in [1, " << length
                          << " / 4 = " << seq_len / 4 << "]: the pairs and their queries must fit the length");
  DF_CHECK(vocab_size > seq_len && vocab_size / 2 - 1 >= num_kv_pairs,
           "config key '" << key("vocab_size") << "' must exceed " << length << " (" << seq_len << ") and hold "
                          << num_kv_pairs << " distinct keys, got " << vocab_size);
  DF_CHECK(power_a > 0, "config key '" << key("power_a") << "' must be positive, got " << power_a);
}

std::vector<double> MqarGapProbabilities(double power_a, int64_t space) {
  std::vector<double> p(space);
  double total = 0.0;
  for (int64_t g = 0; g < space; ++g) total += p[g] = power_a * std::pow(static_cast<double>(g + 1), power_a - 1.0);
  for (auto& v : p) v /= total;
  return p;
}

std::vector<double> MqarGapProbabilities(const MqarOptions& o) {
  return MqarGapProbabilities(o.power_a, (o.seq_len - 2 * o.num_kv_pairs) / 2);
}

void WriteMqarExample(const MqarOptions& o, const std::vector<double>& gap_p, int64_t index, int64_t* in,
                      int64_t* lab) {
  const int64_t L = o.seq_len, n = o.num_kv_pairs, context = 2 * n;
  const int64_t key_vocab = o.vocab_size / 2;
  std::vector<int64_t> example(L + 1, 0), answer(L + 1, kIgnoreIndex);
  std::mt19937_64 rng(SplitMix64(o.seed + kSplitMix64Gamma * static_cast<uint64_t>(index)));
  const auto keys = DistinctUniform(rng, 1, key_vocab, n);
  const auto values = DistinctUniform(rng, key_vocab, o.vocab_size, n);
  const auto gaps = DistinctWeighted(rng, gap_p, n);
  for (int64_t j = 0; j < n; ++j) {
    example[2 * j] = keys[j];
    example[2 * j + 1] = values[j];
    example[context + 2 * gaps[j]] = keys[j];           // the query
    answer[context + 2 * gaps[j] + 1] = values[j];      // its answer, one position later
  }
  for (int64_t t = 0; t < L; ++t) {
    int64_t token = example[t];
    if (o.random_non_queries && t >= context && token == 0) token = UniformIndex(rng, o.vocab_size);
    in[t] = token;
    lab[t] = answer[t + 1];  // labels[t] is the target of position t
  }
}

MqarExamples GenerateMqar(const MqarOptions& o, int64_t first, int64_t count) {
  o.Check("mqar");
  const int64_t L = o.seq_len;
  const auto gap_p = MqarGapProbabilities(o);
  auto inputs = torch::zeros({count, L}, torch::kInt64);
  auto labels = torch::full({count, L}, kIgnoreIndex, torch::kInt64);
  for (int64_t e = 0; e < count; ++e) {
    WriteMqarExample(o, gap_p, first + e, inputs.data_ptr<int64_t>() + e * L, labels.data_ptr<int64_t>() + e * L);
  }
  return {inputs, labels};
}

}  // namespace darkformer
