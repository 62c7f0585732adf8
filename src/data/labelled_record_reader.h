// A benchmark's own labelled examples, for `darkformer prepare --labelled`: each record is
// {"input_ids": [...], "labels": [...]}, labels[t] the target scored at position t (already
// aligned, as the MQAR generator makes them), -100 where nothing is scored.
//   *.jsonl / *.json / *.jsonl.gz: one record per line (blank lines skipped);
//   *input_ids*.npy: 1-D (one record) or 2-D [N, L] (N records), its labels in the file of the
//       same name with "input_ids" replaced by "labels" (same shape).
// Unlike the unlabelled readers nothing is skipped: a malformed line, a missing or non-integer
// field, lengths that differ, or an id or label outside the vocabulary throw naming file and line
// (the row for .npy), since dropping a benchmark's example would change its score.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/c4_reader.h"

namespace darkformer {

struct LabelledRecord {
  std::vector<int> input_ids;
  std::vector<int> labels;  // same length; -100 or an id in [0, vocab_size)
};

// The labels .npy paired with an input_ids .npy ("a/x.input_ids.npy" -> "a/x.labels.npy"); throws
// when the file name holds no "input_ids".
std::string PairedLabelsNpyPath(const std::string& input_ids_path);

class LabelledRecordReader {
 public:
  LabelledRecordReader(std::string path, int64_t vocab_size);
  ~LabelledRecordReader();

  // The next record; false at the end of the file. Throws on a bad record (see above).
  bool Next(LabelledRecord* record);
  // The source line (or 1-based .npy row) of the last record.
  int64_t line() const { return counts_.lines; }
  // lines, documents, blank; text_bytes counts ids x 4.
  const C4ReadCounts& counts() const { return counts_; }
  // Always empty (no record is skipped); here so prepare treats every reader alike.
  const std::vector<std::string>& first_errors() const { return no_errors_; }

 private:
  bool NextJsonLine(LabelledRecord* record);
  bool NextNpyRow(LabelledRecord* record);
  // Checks lengths and ranges, naming `where` ("file:line").
  void Check(const LabelledRecord& record, const std::string& where) const;

  std::string path_;
  int64_t vocab_size_;
  std::unique_ptr<LineReader> lines_;
  std::string labels_path_;               // .npy: the paired labels file
  std::vector<int64_t> npy_ids_, npy_labels_;
  int64_t npy_rows_ = 0, npy_cols_ = 0, npy_next_ = 0;
  C4ReadCounts counts_;
  std::vector<std::string> no_errors_;
};

}  // namespace darkformer
