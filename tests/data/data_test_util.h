// Helpers for the data tests: temporary directories, tiny generated C4 files (gzip or plain),
// and tiny SentencePiece models trained in-process once per test binary.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace darkformer::testing {

// A fresh directory under the system temp dir, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// `text` as a JSON string literal (quotes included), escaping what JSON requires.
std::string JsonString(const std::string& text);
// One C4 record line (without '\n'): {"text": ..., "timestamp": ..., "url": ...}.
std::string C4Line(const std::string& text, int index = 0);

// `count` deterministic English-like documents (a few sentences each) from `seed`.
std::vector<std::string> MakeDocuments(int count, uint64_t seed);

void WriteGzip(const std::string& path, const std::string& content);
void WritePlain(const std::string& path, const std::string& content);
// A .npy file of int32 values with shape rows x cols (1-D of cols when rows == 0).
void WriteNpy(const std::string& path, const std::vector<int32_t>& values, int64_t rows, int64_t cols);
std::string ReadFile(const std::string& path);

// Joins records as C4 lines, each ending in '\n'.
std::string C4Content(const std::vector<std::string>& texts);

// A tiny SentencePiece model (Gemma's special ids: pad 0, eos 1, bos 2, unk 3) trained once per
// process on MakeDocuments text; `vocab_size` picks one of several cached models.
const std::string& TinyTokenizer(int vocab_size = 320);

}  // namespace darkformer::testing
