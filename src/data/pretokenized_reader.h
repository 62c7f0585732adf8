// Documents of token ids a user brings (a benchmark's own token files), for
// `darkformer prepare --pretokenized`:
//   *.jsonl / *.json / *.jsonl.gz: one document per line, a JSON array of ids or an object whose
//       "input_ids" is one; blank lines skipped, malformed lines counted and skipped (as for C4);
//   *.npy: a 1-D integer array (one document) or a 2-D [N, L] one (N documents of L ids).
// Every id must lie in [0, vocab_size): a larger one is an error naming file and line (row).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/c4_reader.h"

namespace darkformer {

class PretokenizedReader {
 public:
  PretokenizedReader(std::string path, int64_t vocab_size);
  ~PretokenizedReader();

  // The next document's ids; false at the end of the file.
  bool Next(std::vector<int>* ids);
  // lines = documents seen (rows for .npy); text_bytes counts ids x 4, the size they stand for.
  const C4ReadCounts& counts() const { return counts_; }
  const std::vector<std::string>& first_errors() const { return first_errors_; }

 private:
  bool NextJsonLine(std::vector<int>* ids);
  bool NextNpyRow(std::vector<int>* ids);
  void CheckIds(const std::vector<int64_t>& ids);

  std::string path_;
  int64_t vocab_size_;
  std::unique_ptr<LineReader> lines_;  // JSON lines
  std::vector<int64_t> npy_;           // .npy: all ids, row-major
  int64_t npy_rows_ = 0, npy_cols_ = 0, npy_next_ = 0;
  C4ReadCounts counts_;
  std::vector<std::string> first_errors_;
};

// Reads a .npy file of integers (little-endian i1/i2/i4/i8/u1/u2/u4/u8, C order, 1-D or 2-D).
// Returns the ids row-major and sets rows/cols (a 1-D array is one row).
std::vector<int64_t> ReadNpyIntegers(const std::string& path, int64_t* rows, int64_t* cols);

}  // namespace darkformer
