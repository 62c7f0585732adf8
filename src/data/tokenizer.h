// A SentencePiece tokenizer (any .model: Gemma's tokenizer.model or one trained with spm_train)
// with the identity that token shards record: a hash of the .model bytes and the vocab size.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace darkformer {

// What token shards and configs compare to decide two tokenizers are the same.
struct TokenizerIdentity {
  std::string hash;        // "fnv1a64:<16 hex digits>" of the .model file's bytes
  int64_t vocab_size = 0;  // number of pieces
  std::string path;        // where it was read from (informational; not compared)

  // Shards of token ids brought by the user (`prepare --pretokenized`) carry this hash.
  static constexpr const char* kPretokenizedHash = "pretokenized";
  bool IsPretokenized() const { return hash == kPretokenizedHash; }

  bool SameAs(const TokenizerIdentity& other) const {
    return hash == other.hash && vocab_size == other.vocab_size;
  }
  std::string Describe() const;  // "hash fnv1a64:..., vocab 256000 (path)"
};

// 64-bit FNV-1a of a file's bytes, as "fnv1a64:<16 hex digits>". Not cryptographic: it tells
// tokenizers apart, it does not defend against a crafted collision.
std::string HashFileFnv1a64(const std::string& path);

class Tokenizer {
 public:
  // Loads the SentencePiece model at `model_path`; throws darkformer::Error naming it on failure.
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();

  // Token ids of `text`, without BOS/EOS (the loader adds those). Thread-safe.
  void Encode(std::string_view text, std::vector<int>* ids) const;
  std::string Decode(const std::vector<int>& ids) const;

  const TokenizerIdentity& identity() const { return identity_; }
  int64_t vocab_size() const { return identity_.vocab_size; }
  // The model's special ids: those its spec declares, else those of the pieces named <bos>/<s>,
  // <eos>/</s>, <pad>; -1 where there is none.
  int bos_id() const;
  int eos_id() const;
  int pad_id() const;

 private:
  int FindSpecial(int declared, const char* gemma_piece, const char* spm_piece) const;

  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  TokenizerIdentity identity_;
};

}  // namespace darkformer
