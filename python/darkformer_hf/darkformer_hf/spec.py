"""The `darkformer` block of an exported config.json and the kernel tensors each layer carries.

Pure Python (no torch): tools/convert_hf_gemma.py imports it too. What the binary knows of its
kernels (names in the tables' order, families, every option's default) comes from kernels.jsonl,
the output of `darkformer inspect --kernels --json` shipped with the plug-in
(tests/tools/test_plugin_ports.py checks it is current); each kernel's tensors and features come
from its port (ports/<name>.py).
"""

import json
import os

from .ports import port

BLOCK_KEY = "darkformer"
BLOCK_VERSION = 1
_KERNELS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels.jsonl")
with open(_KERNELS_FILE) as _fh:
    REGISTRY = {k["name"]: k for k in (json.loads(line) for line in _fh if line.strip())}
KERNELS = tuple(REGISTRY)
# {kernel: {option: the binary's default}}: an option absent from an exported block takes it.
OPTION_DEFAULTS = {name: dict(k["options"]) for name, k in REGISTRY.items()}


def family(name):
    """exact | positive | signed | baseline, as the binary's traits say."""
    return REGISTRY[name]["family"]


def option(name, options, key):
    """A kernel option as the binary reads it: the block's value, else the binary's default."""
    value = options.get(key)
    return OPTION_DEFAULTS[name][key] if value is None else value


class KernelStateError(ValueError):
    """An exported directory whose kernel block or tensors do not fit together."""


def kernel_prefix(layer):
    return f"layers.{layer}.self_attn.kernel."


def layer_kernels(block, num_layers):
    """The kernel name of every layer: the block's default, then its per-layer overrides."""
    names = [block.get("kernel", "exact")] * num_layers
    for key, name in (block.get("per_layer") or {}).items():
        layer = int(key)
        if not 0 <= layer < num_layers:
            raise KernelStateError(f"darkformer.per_layer: layer {layer} out of range [0, {num_layers})")
        names[layer] = name
    for name in names:
        if name not in KERNELS:
            raise KernelStateError(f"darkformer: unknown kernel '{name}' (known: {', '.join(KERNELS)})")
    return names


def options_of(block, name):
    return dict((block.get("options") or {}).get(name) or {})


def expected_shapes(name, options, heads, head_dim):
    """{tensor name (relative to the layer's kernel prefix): shape} of one layer's kernel state."""
    return port(name).shapes(lambda key: option(name, options, key), heads, head_dim)


def all_expected_shapes(block, num_layers, heads, head_dim):
    """{full tensor name: shape} over every layer of a model with this block."""
    out = {}
    for layer, name in enumerate(layer_kernels(block, num_layers)):
        for key, shape in expected_shapes(name, options_of(block, name), heads, head_dim).items():
            out[kernel_prefix(layer) + key] = shape
    return out


def kernel_seed(option_seed, layer, run_seed):
    """KernelSeed of attention_kernel.h: per layer, per run."""
    return int(option_seed) + 1000 * int(layer) + 1000003 * int(run_seed)
