// c4_reader_bench: the C4 reader's own throughput (decompression + JSON record parsing), in MB
// of JSON-lines text per second, without tokenization. A benchmark, not a test.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "data/c4_reader.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: c4_reader_bench [--repeat N] FILE.json.gz...\n");
    return 2;
  }
  int repeat = 5;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--repeat" && i + 1 < argc) {
      repeat = std::stoi(argv[++i]);
    } else {
      files.push_back(arg);
    }
  }
  std::vector<double> rates;
  for (int r = 0; r < repeat; ++r) {
    const auto start = std::chrono::steady_clock::now();
    int64_t text_bytes = 0, documents = 0;
    std::string text;
    for (const auto& file : files) {
      darkformer::C4Reader reader(file);
      while (reader.Next(&text)) {
        ++documents;
        text_bytes += static_cast<int64_t>(text.size());
      }
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    rates.push_back(text_bytes / s / 1e6);
    std::printf("pass %d: %lld documents, %.2f MB text in %.3f s: %.1f MB/s\n", r, static_cast<long long>(documents),
                text_bytes / 1e6, s, text_bytes / s / 1e6);
  }
  std::sort(rates.begin(), rates.end());
  std::printf("median %.1f MB/s of decoded text over %d passes\n", rates[rates.size() / 2], repeat);
  return 0;
}
