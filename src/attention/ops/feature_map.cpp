// Names of the causal operator's forms (see feature_map.h).
#include "attention/ops/feature_map.h"

#include "util/error.h"

namespace darkformer {

CausalOp ParseCausalOp(const std::string& name, const std::string& key_path) {
  if (name == "auto") return CausalOp::kAuto;
  if (name == "naive") return CausalOp::kNaive;
  if (name == "chunk_loop") return CausalOp::kChunkLoop;
  if (name == "chunk_parallel") return CausalOp::kChunkParallel;
  if (name == "raw_cpu") return CausalOp::kRawCpu;
  if (name == "cuda") return CausalOp::kCuda;
  Fail("config key '" + key_path + "': unknown op '" + name + "'; valid: auto, naive, chunk_loop, chunk_parallel, raw_cpu, cuda");
}

std::string CausalOpName(CausalOp op) {
  switch (op) {
    case CausalOp::kAuto: return "auto";
    case CausalOp::kNaive: return "naive";
    case CausalOp::kChunkLoop: return "chunk_loop";
    case CausalOp::kChunkParallel: return "chunk_parallel";
    case CausalOp::kRawCpu: return "raw_cpu";
    case CausalOp::kCuda: return "cuda";
  }
  return "auto";
}

}  // namespace darkformer
