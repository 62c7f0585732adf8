// The on-disk layout of a token shard: a token file (uint16 or uint32 ids) read by memory mapping,
// and a document index of token offsets. Both start with a 16-byte header; integers little-endian.
#pragma once

#include <cstdint>
#include <string>

namespace darkformer {

// <name>.tokens: kTokensMagic, uint32 bytes per token (2 or 4), uint32 zero; then the ids of
// every document back to back, without BOS/EOS (the loader adds those as configured).
inline constexpr char kTokensMagic[8] = {'D', 'F', 'T', 'O', 'K', 'v', '1', '\0'};
// <name>.docs: kDocsMagic, uint64 document count D; then D + 1 uint64 token offsets: document d
// holds tokens [offset[d], offset[d + 1]).
inline constexpr char kDocsMagic[8] = {'D', 'F', 'D', 'O', 'C', 'v', '1', '\0'};
inline constexpr int64_t kShardHeaderBytes = 16;
// <name>.labels (labelled shards only, `prepare --labelled`): kLabelsMagic, uint32 4, uint32 zero;
// then one int32 label per token of <name>.tokens, aligned with it (-100: not scored).
inline constexpr char kLabelsMagic[8] = {'D', 'F', 'L', 'A', 'B', 'v', '1', '\0'};

// uint16 while every id fits, else uint32.
inline int BytesPerTokenForVocab(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

// The two files of one split of one shard, e.g. "shard-00003.train".
inline std::string TokensFileName(const std::string& stem) { return stem + ".tokens"; }
inline std::string DocsFileName(const std::string& stem) { return stem + ".docs"; }
inline std::string LabelsFileName(const std::string& stem) { return stem + ".labels"; }

}  // namespace darkformer
