// Helpers for the data tests (see data_test_util.h).
#include "data/data_test_util.h"

// As in src/data/tokenizer.cpp: the pinned SentencePiece headers warn about their own deprecations.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <sentencepiece_trainer.h>
#pragma GCC diagnostic pop
#include <stdlib.h>
#include <zlib.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>

#include "remove_tree.h"

namespace darkformer::testing {

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "darkformer-data-XXXXXX").string();
  if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() { RemoveTree(path_); }

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  return out + "\"";
}

std::string C4Line(const std::string& text, int index) {
  return "{\"text\":" + JsonString(text) + ",\"timestamp\":\"2019-04-2" + std::to_string(index % 10) +
         "T12:00:00Z\",\"url\":\"https://example.com/" + std::to_string(index) + "\"}";
}

std::vector<std::string> MakeDocuments(int count, uint64_t seed) {
  static const char* kWords[] = {"the", "data", "model", "learns", "from", "text", "and", "every", "token",
                                 "counts", "a", "small", "corpus", "of", "words", "makes", "tests", "fast",
                                 "attention", "is", "random", "feature", "kernel", "with", "packing"};
  std::mt19937_64 rng(seed);
  std::vector<std::string> docs;
  for (int d = 0; d < count; ++d) {
    std::string doc;
    int sentences = 1 + static_cast<int>(rng() % 4);
    for (int s = 0; s < sentences; ++s) {
      int words = 3 + static_cast<int>(rng() % 9);
      for (int w = 0; w < words; ++w) {
        std::string word = kWords[rng() % (sizeof(kWords) / sizeof(kWords[0]))];
        if (w == 0) word[0] = static_cast<char>(std::toupper(word[0]));
        doc += (w ? " " : "") + word;
      }
      doc += s + 1 < sentences ? ". " : ".";
      if (rng() % 5 == 0 && s + 1 < sentences) doc += "\n";
    }
    docs.push_back(doc);
  }
  return docs;
}

void WriteGzip(const std::string& path, const std::string& content) {
  gzFile f = gzopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error("gzopen " + path);
  if (!content.empty() && gzwrite(f, content.data(), static_cast<unsigned>(content.size())) <= 0) {
    throw std::runtime_error("gzwrite " + path);
  }
  gzclose(f);
}

void WritePlain(const std::string& path, const std::string& content) {
  std::ofstream(path, std::ios::binary) << content;
}

void WriteNpy(const std::string& path, const std::vector<int32_t>& values, int64_t rows, int64_t cols) {
  std::string header = "{'descr': '<i4', 'fortran_order': False, 'shape': (" +
                       (rows ? std::to_string(rows) + ", " + std::to_string(cols) : std::to_string(cols) + ",") + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8);
  const uint16_t length = static_cast<uint16_t>(header.size());
  bytes.append(reinterpret_cast<const char*>(&length), 2);
  bytes += header;
  bytes.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int32_t));
  WritePlain(path, bytes);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string C4Content(const std::vector<std::string>& texts) {
  std::string out;
  for (size_t i = 0; i < texts.size(); ++i) out += C4Line(texts[i], static_cast<int>(i)) + "\n";
  return out;
}

const std::string& TinyTokenizer(int vocab_size) {
  static std::mutex mutex;
  static std::map<int, std::string> models;
  static TempDir dir;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = models.find(vocab_size);
  if (it != models.end()) return it->second;
  std::string corpus = dir.File("corpus-" + std::to_string(vocab_size) + ".txt");
  std::string text;
  for (const auto& doc : MakeDocuments(400, 7)) text += doc + "\n";
  WritePlain(corpus, text);
  std::string prefix = dir.File("tiny-" + std::to_string(vocab_size));
  auto status = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + corpus + " --model_prefix=" + prefix + " --vocab_size=" + std::to_string(vocab_size) +
      " --model_type=bpe --character_coverage=1.0 --byte_fallback=true --pad_id=0 --eos_id=1 --bos_id=2"
      " --unk_id=3 --hard_vocab_limit=false --normalization_rule_name=identity"
      " --remove_extra_whitespaces=false --minloglevel=2");
  if (!status.ok()) throw std::runtime_error("training the tiny tokenizer failed: " + status.ToString());
  return models[vocab_size] = prefix + ".model";
}

}  // namespace darkformer::testing
