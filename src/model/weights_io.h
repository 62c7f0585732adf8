// Our weights file: one HDF5 file, one dataset per parameter or persistent buffer under its
// module path (e.g. "layers.0.self_attn.q_proj.weight"), the model config as a YAML string
// attribute. 16-bit floats are stored losslessly as their uint16 bit patterns with a `dtype`
// attribute. tools/convert_hf_gemma.py writes and reads the same layout.
#pragma once

#include <map>
#include <string>

#include "model/gemma_model.h"
#include "model/h5_tensor_io.h"

namespace darkformer {

struct WeightsLoadOptions {
  // Random-feature kernel state ("*.kernel.*") absent from the file keeps the kernel's own
  // initialisation, and kernel state in the file that the model lacks is skipped: the
  // finetuning swap of an exact checkpoint to another kernel. Everything else stays strict.
  bool kernel_state_optional = false;
};

// Config stored in a weights file.
GemmaConfig ReadWeightsConfig(const std::string& path);
// Attention section stored with our own checkpoints ("" when the file has none, e.g. converted HF).
std::string ReadWeightsAttentionYaml(const std::string& path);

// Strict load: a missing, unexpected or mis-shaped tensor, or a config field that differs from the
// model's, is an error naming it. Values are cast to each parameter's dtype.
void LoadWeights(const std::string& path, GemmaModelImpl& model, const WeightsLoadOptions& options = {});

// Writes every parameter and persistent buffer with its dtype, atomically (temp file + rename).
void SaveWeights(const std::string& path, GemmaModelImpl& model, const std::string& attention_yaml = "");

// Low-level pieces, shared with checkpoints: named tensors to/from one HDF5 file.
void WriteTensorsH5(const std::string& path, const std::map<std::string, torch::Tensor>& tensors,
                    const std::map<std::string, std::string>& string_attributes,
                    const std::map<std::string, int64_t>& int_attributes = {},
                    const H5WriteOptions& options = {});
std::map<std::string, torch::Tensor> ReadTensorsH5(const std::string& path);
std::string ReadStringAttributeH5(const std::string& path, const std::string& name);
// One dataset by its path inside the file (e.g. "grad/embed_tokens.weight").
torch::Tensor ReadTensorH5(const std::string& path, const std::string& dataset);

}  // namespace darkformer
