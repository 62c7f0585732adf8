"""The `darkformer` block of an exported config.json and the kernel tensors each layer carries.

Pure Python (no torch): tools/convert_hf_gemma.py imports it too. Names and shapes follow the C++
kernels (src/attention/*_kernel.cpp); the option defaults below are theirs, and
tests/tools/test_hf_plugin.py checks both lists against `darkformer inspect --kernels --json`.
"""

BLOCK_KEY = "darkformer"
BLOCK_VERSION = 1
KERNELS = ("exact", "performer", "darkformer", "lfk", "gerf", "saderf", "aderf", "sderf", "trig", "slay",
           "flexformer", "random", "constant")
DRAW = ("projection", "draw_seed", "draw_count")  # FeatureKernelBase::RegisterDraw

# The defaults of every kernel option the plug-in reads (an option absent from an exported block
# takes the binary's default). Only these keys; the test compares each with the binary's.
_FEATURES = {"num_features": 256, "seed": 0}
OPTION_DEFAULTS = {
    "exact": {}, "random": {"seed": 0}, "constant": {},
    "performer": _FEATURES, "lfk": _FEATURES, "gerf": _FEATURES, "saderf": _FEATURES, "aderf": _FEATURES,
    "sderf": _FEATURES,
    "darkformer": {**_FEATURES, "rank": 0, "share_across_heads": False},
    "trig": {**_FEATURES, "normaliser_floor": 1e-6},
    "slay": {"num_features": 16, "seed": 0, "normaliser_floor": 1e-6, "sketch_dim": 16, "epsilon": 0.1, "nodes": 3},
    "flexformer": {**_FEATURES, "normaliser_floor": 1e-6, "variant": "stationary"},
}


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
    d = head_dim
    if name in ("exact", "random", "constant"):
        return {}
    m = int(option(name, options, "num_features"))
    if name == "lfk":
        return {"W": (m, d)}
    if name == "flexformer":
        freq = (heads, 2, m, d) if option(name, options, "variant") == "nonstationary" else (heads, m, d)
        return {"frequencies": freq, "tau": (heads,)}
    rank = int(option(name, options, "rank") or d) if name == "darkformer" else d
    shapes = {"projection": (m, rank), "draw_seed": (1,), "draw_count": (1,)}
    if name == "darkformer":
        shared = bool(option(name, options, "share_across_heads"))
        shapes["M"] = (1 if shared else heads, rank, d)
    elif name in ("gerf", "saderf"):
        shapes["a"] = (1,)
        if name == "saderf":
            shapes["psi"] = (d,)
    elif name in ("aderf", "sderf"):
        shapes.update({"a": (d,), "p_query": (d, d), "p_key": (d, d)})
    elif name == "slay":
        p = int(option(name, options, "sketch_dim"))
        if p > 0:
            shapes["sketch"] = (2, p, d)
    return shapes


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
