// SentencePiece wrapper and tokenizer identity (see tokenizer.h).
#include "data/tokenizer.h"

// The pinned header marks some of its own virtual methods deprecated and its inline wrappers call
// them: 14 warnings about SentencePiece, none about us, in every build.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <sentencepiece_processor.h>
#pragma GCC diagnostic pop

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "util/error.h"

namespace darkformer {

std::string TokenizerIdentity::Describe() const {
  return "hash " + hash + ", vocab " + std::to_string(vocab_size) + (path.empty() ? "" : " (" + path + ")");
}

std::string HashFileFnv1a64(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  DF_CHECK(f != nullptr, path << ": cannot open: " << std::strerror(errno));
  constexpr uint64_t kOffsetBasis = 14695981039346656037ULL;
  constexpr uint64_t kPrime = 1099511628211ULL;
  uint64_t h = kOffsetBasis;
  std::vector<unsigned char> chunk(1 << 16);
  size_t got = 0;
  while ((got = std::fread(chunk.data(), 1, chunk.size(), f)) > 0) {
    for (size_t i = 0; i < got; ++i) {
      h ^= chunk[i];
      h *= kPrime;
    }
  }
  bool failed = std::ferror(f) != 0;
  std::fclose(f);
  DF_CHECK(!failed, path << ": read error while hashing");
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016" PRIx64, h);
  return std::string("fnv1a64:") + hex;
}

Tokenizer::Tokenizer(const std::string& model_path)
    : processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  auto status = processor_->Load(model_path);
  DF_CHECK(status.ok(), model_path << ": cannot load SentencePiece model: " << status.ToString());
  identity_.hash = HashFileFnv1a64(model_path);
  identity_.vocab_size = processor_->GetPieceSize();
  identity_.path = model_path;
}

Tokenizer::~Tokenizer() = default;

void Tokenizer::Encode(std::string_view text, std::vector<int>* ids) const {
  auto status = processor_->Encode(text, ids);
  DF_CHECK(status.ok(), identity_.path << ": encoding failed: " << status.ToString());
}

std::string Tokenizer::Decode(const std::vector<int>& ids) const {
  std::string text;
  auto status = processor_->Decode(absl::MakeConstSpan(ids), &text);  // the vector overload is deprecated
  DF_CHECK(status.ok(), identity_.path << ": decoding failed: " << status.ToString());
  return text;
}

int Tokenizer::FindSpecial(int declared, const char* gemma_piece, const char* spm_piece) const {
  // Some rebuilt Gemma models carry the <bos>/<eos> pieces without declaring their ids in the
  // trainer spec; the piece names are then the authority.
  if (declared >= 0) return declared;
  for (const char* piece : {gemma_piece, spm_piece}) {
    if (!piece) continue;
    int id = processor_->PieceToId(piece);
    if (id >= 0 && processor_->IdToPiece(id) == piece) return id;
  }
  return -1;
}

int Tokenizer::bos_id() const { return FindSpecial(processor_->bos_id(), "<bos>", "<s>"); }
int Tokenizer::eos_id() const { return FindSpecial(processor_->eos_id(), "<eos>", "</s>"); }
int Tokenizer::pad_id() const { return FindSpecial(processor_->pad_id(), "<pad>", nullptr); }

}  // namespace darkformer
