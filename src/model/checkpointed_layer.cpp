// Activation checkpointing of a decoder layer (see checkpointed_layer.h).
#include "model/checkpointed_layer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include "util/mixed_precision.h"

namespace darkformer {

namespace {

// The generators a layer's forward may draw from: the default one of the input's device (and the
// CPU's) and the kernel's own (the random baseline).
std::vector<at::Generator> LayerGenerators(const DecoderLayer& layer, const torch::Device& device) {
  std::vector<at::Generator> generators = {at::detail::getDefaultCPUGenerator()};
  if (!device.is_cpu()) generators.push_back(at::globalContext().defaultGenerator(device));
  for (const auto& g : layer->self_attn->kernel()->forward_generators()) generators.push_back(g);
  return generators;
}

std::vector<torch::Tensor> States(const std::vector<at::Generator>& generators) {
  std::vector<torch::Tensor> states;
  for (const auto& g : generators) states.push_back(g.get_state());
  return states;
}

void SetStates(const std::vector<at::Generator>& generators, const std::vector<torch::Tensor>& states) {
  for (size_t i = 0; i < generators.size(); ++i) {
    auto g = generators[i];
    g.set_state(states[i]);
  }
}

// What the backward needs besides the saved tensors.
struct LayerCapsule : torch::CustomClassHolder {
  LayerCapsule(DecoderLayer l, AutocastState a, std::vector<torch::Tensor> r, bool x_grad)
      : layer(std::move(l)), autocast(a), rng_states(std::move(r)), x_needs_grad(x_grad) {}
  DecoderLayer layer;
  AutocastState autocast;
  std::vector<torch::Tensor> rng_states;
  bool x_needs_grad;
};

class CheckpointedLayerFunction : public torch::autograd::Function<CheckpointedLayerFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x_BLE,
                               at::TensorList params, DecoderLayer layer, const RotaryTables& rope) {
    const auto generators = LayerGenerators(layer, x_BLE.device());
    auto capsule = c10::make_intrusive<LayerCapsule>(layer, AutocastState::Current(), States(generators),
                                                     x_BLE.requires_grad());
    std::vector<torch::Tensor> saved = {x_BLE, rope.cos_LD, rope.sin_LD, rope.document_ids_BL};
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["layer"] = c10::IValue::make_capsule(std::move(capsule));
    return layer->forward(x_BLE, rope);  // grad mode is off inside a custom function's forward
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto capsule = c10::static_intrusive_pointer_cast<LayerCapsule>(ctx->saved_data["layer"].toCapsule());
    const RotaryTables rope{saved[1], saved[2], saved[3]};
    const std::vector<torch::Tensor> params(saved.begin() + 4, saved.end());
    const auto x_leaf = saved[0].detach().requires_grad_(capsule->x_needs_grad);
    // Recompute as the forward ran: same autocast state, same draws; the generators then go on
    // from where they were before the recomputation.
    const auto generators = LayerGenerators(capsule->layer, x_leaf.device());
    const auto now = States(generators);
    SetStates(generators, capsule->rng_states);
    torch::Tensor out_BLE;
    {
      AutocastReplay autocast(capsule->autocast);
      torch::AutoGradMode grad(true);
      out_BLE = capsule->layer->forward(x_leaf, rope);
    }
    SetStates(generators, now);
    std::vector<torch::Tensor> inputs;
    if (capsule->x_needs_grad) inputs.push_back(x_leaf);
    inputs.insert(inputs.end(), params.begin(), params.end());
    const auto grads = torch::autograd::grad({out_BLE}, inputs, {grad_outputs[0]}, /*retain_graph=*/false,
                                             /*create_graph=*/false, /*allow_unused=*/true);
    torch::autograd::variable_list result;
    result.push_back(capsule->x_needs_grad ? grads[0] : torch::Tensor());
    // A parameter the layer did not use (constant attention's q/k) keeps no gradient, as without
    // checkpointing.
    result.insert(result.end(), grads.begin() + (capsule->x_needs_grad ? 1 : 0), grads.end());
    result.push_back({});  // layer
    result.push_back({});  // rope
    return result;
  }
};

}  // namespace

torch::Tensor CheckpointedLayerForward(const DecoderLayer& layer, const torch::Tensor& x_BLE, const RotaryTables& rope) {
  std::vector<torch::Tensor> trainable;
  for (const auto& p : layer->parameters()) {
    if (p.requires_grad()) trainable.push_back(p);
  }
  return CheckpointedLayerFunction::apply(x_BLE, at::TensorList(trainable), layer, rope);
}

}  // namespace darkformer
