"""Reads an exported directory's kernel state (config.json's `darkformer` block and the ".kernel."
tensors of model.safetensors) and attaches one LayerKernel per attention layer as `self_attn.kernel`,
so the model's state_dict keeps our names (model.layers.i.self_attn.kernel.*)."""

import json
import os

import torch

from . import spec


class LayerKernel(torch.nn.Module):
    """One layer's kernel: its name, options and tensors (buffers, kept in the dtype they were
    trained in: the features are computed in fp32 whatever the model's dtype)."""

    def __init__(self, name, options, layer, run_seed, tensors):
        super().__init__()
        self.kernel_name, self.options, self.layer = name, dict(options), layer
        for key, tensor in tensors.items():
            self.register_buffer(key, tensor)
        if name == "random":  # RandomKernelImpl: a CPU generator per layer, drawn from in forward
            self.generator = torch.Generator().manual_seed(
                spec.kernel_seed(spec.option(name, self.options, "seed"), layer, run_seed))

    def tensors(self, dtype, device):
        return {k: (b.to(device, dtype) if b.is_floating_point() else b.to(device))
                for k, b in self.named_buffers()}

    def extra_repr(self):
        return f"{self.kernel_name}, layer {self.layer}"


def _text_config(config):
    return getattr(config, "text_config", None) or config


def block_of(config):
    """The config's darkformer block, or {} (every layer exact)."""
    block = getattr(_text_config(config), spec.BLOCK_KEY, None) or getattr(config, spec.BLOCK_KEY, None)
    return dict(block) if block else {}


def _read_kernel_tensors(model_dir, wanted):
    """{our name: tensor} for the `wanted` names, from model.safetensors or its index."""
    from safetensors import safe_open

    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as fh:
            weight_map = json.load(fh)["weight_map"]
    else:
        single = os.path.join(model_dir, "model.safetensors")
        if not os.path.exists(single):
            raise spec.KernelStateError(f"{model_dir}: no model.safetensors (not an exported directory)")
        with safe_open(single, framework="pt") as fh:
            weight_map = {k: "model.safetensors" for k in fh.keys()}
    out, by_file = {}, {}
    for name in wanted:
        if "model." + name in weight_map:
            by_file.setdefault(weight_map["model." + name], []).append(name)
    for file, names in by_file.items():
        with safe_open(os.path.join(model_dir, file), framework="pt") as fh:
            for name in names:
                out[name] = fh.get_tensor("model." + name)
    return out


def _attention_modules(model):
    return [m for _, m in model.named_modules() if hasattr(m, "q_proj") and hasattr(m, "layer_idx")]


def check_kernel(block, num_layers, kernel):
    """Refuses a kernel the directory was not trained with."""
    names = spec.layer_kernels(block, num_layers)
    if kernel is not None and kernel not in names:
        used = ", ".join(sorted(set(names)))
        raise spec.KernelStateError(f"kernel '{kernel}' asked for, but this model was trained with {used}")


def layer_kernels_for(config, model_dir, layers=None):
    """{layer: LayerKernel} read from `model_dir` and checked (missing or mis-shaped tensors name
    themselves)."""
    config = _text_config(config)
    block = block_of(config)
    n = int(config.num_hidden_layers)
    names = spec.layer_kernels(block, n)
    want = spec.all_expected_shapes(block, n, int(config.num_attention_heads), int(config.head_dim))
    layers = range(n) if layers is None else layers
    wanted = [k for k in want if int(k.split(".")[1]) in layers]
    found = _read_kernel_tensors(model_dir, wanted) if wanted else {}
    for name in wanted:
        if name not in found:
            raise spec.KernelStateError(f"{model_dir}: missing kernel tensor 'model.{name}' "
                                        f"(kernel {names[int(name.split('.')[1])]})")
        if tuple(found[name].shape) != want[name]:
            raise spec.KernelStateError(f"{model_dir}: kernel tensor 'model.{name}' has shape "
                                        f"{tuple(found[name].shape)}, expected {want[name]}")
    out = {}
    for layer in layers:
        prefix = spec.kernel_prefix(layer)
        tensors = {k[len(prefix):]: found[k] for k in wanted if k.startswith(prefix)}
        out[layer] = LayerKernel(names[layer], spec.options_of(block, names[layer]), layer,
                                 int(block.get("run_seed", 0)), tensors)
    return out


def attach(model, model_dir, kernel=None):
    """Attaches every layer's kernel to `model` (loaded from `model_dir`)."""
    config = _text_config(model.config)
    check_kernel(block_of(config), int(config.num_hidden_layers), kernel)
    kernels = layer_kernels_for(config, model_dir)
    device = next(model.parameters()).device
    for module in _attention_modules(model):
        module.kernel = kernels[module.layer_idx].to(device)
    return model


def kernel_of(module, device):
    """module.kernel, loaded on first use when the model came from AutoModelForCausalLM directly
    (its config knows the directory it was read from)."""
    kernel = getattr(module, "kernel", None)
    if isinstance(kernel, LayerKernel):
        return kernel
    model_dir = getattr(module.config, "_name_or_path", "")
    if not os.path.isdir(model_dir):
        if not block_of(module.config):  # no kernel block: plain exact attention
            module.kernel = LayerKernel("exact", {}, module.layer_idx, 0, {})
            return module.kernel
        raise spec.KernelStateError(f"layer {module.layer_idx}: no kernel attached and the config's "
                                    f"directory '{model_dir}' is not local; use darkformer_hf.from_pretrained")
    module.kernel = layer_kernels_for(module.config, model_dir, [module.layer_idx])[module.layer_idx].to(device)
    return module.kernel
