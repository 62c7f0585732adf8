// Activation checkpointing of one decoder layer: the forward runs the layer without recording
// anything and keeps only its input; the backward recomputes the layer under the forward's
// autocast state and random-generator states, then backpropagates through the recomputation.
// The layer's trainable parameters are inputs of the node, so their gradients reach them through
// the outer graph (gradient hooks, data parallelism's reducer) even when the layer's input needs
// no gradient (q/k/v-only finetuning of a frozen embedding).
#pragma once

#include <torch/torch.h>

#include "model/decoder_layer.h"

namespace darkformer {

// layer(x_BLE, rope) with only x_BLE (and the RoPE tables) saved for the backward.
torch::Tensor CheckpointedLayerForward(const DecoderLayer& layer, const torch::Tensor& x_BLE, const RotaryTables& rope);

}  // namespace darkformer
