"""The `darkformer` block of an exported config.json and the kernel tensors each layer carries.

Pure Python (no torch): tools/convert_hf_gemma.py imports it too. Names and shapes follow the C++
kernels (src/attention/*_kernel.cpp); option defaults are theirs (feature_kernel_base.cpp etc.).
"""

BLOCK_KEY = "darkformer"
BLOCK_VERSION = 1
KERNELS = ("exact", "performer", "darkformer", "lfk", "gerf", "saderf", "aderf", "sderf", "trig", "slay",
           "flexformer", "random", "constant")
DRAW = ("projection", "draw_seed", "draw_count")  # FeatureKernelBase::RegisterDraw


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
    m = int(options.get("num_features", 16 if name == "slay" else 256))
    d = head_dim
    if name in ("exact", "random", "constant"):
        return {}
    if name == "lfk":
        return {"W": (m, d)}
    if name == "flexformer":
        freq = (heads, 2, m, d) if options.get("variant", "stationary") == "nonstationary" else (heads, m, d)
        return {"frequencies": freq, "tau": (heads,)}
    rank = int(options.get("rank", 0) or d) if name == "darkformer" else d
    shapes = {"projection": (m, rank), "draw_seed": (1,), "draw_count": (1,)}
    if name == "darkformer":
        shared = bool(options.get("share_across_heads", False))
        shapes["M"] = (1 if shared else heads, rank, d)
    elif name in ("gerf", "saderf"):
        shapes["a"] = (1,)
        if name == "saderf":
            shapes["psi"] = (d,)
    elif name in ("aderf", "sderf"):
        shapes.update({"a": (d,), "p_query": (d, d), "p_key": (d, d)})
    elif name == "slay":
        p = int(options.get("sketch_dim", 16))
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
