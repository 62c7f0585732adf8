"""One module per kernel, named as the kernel (the binary's registry name): the kernel's Python port.

A port defines
- `shapes(option, heads, head_dim)`: {tensor name under the layer's kernel prefix: shape} of one
  layer's kernel state, as the C++ kernel registers it (`option(key)` is the exported block's
  value, else the binary's default);
- for a positive kernel, `log_features(state, option, x, is_query)`: log phi (BHLM);
- for a signed kernel, `signed_features(state, option, x)`: (f, c) with phi = exp(c) f (c None
  when phi = f), and `SCALES_INPUTS = False` when the map sees q itself (slay);
- `PARITY_CASES`: [(label, kernel options)] that tests/tools/test_hf_plugin.py runs against the
  binary (a tiny model of each family's first case).
Which family a kernel is comes from the binary (kernels.jsonl), not from the port. Ports import
torch only inside their feature functions: spec.py (no torch) reads their shapes.
"""

import importlib


def port(name):
    """The port module of kernel `name`; KeyError naming it when there is none."""
    try:
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise KeyError(f"darkformer_hf has no port of kernel '{name}' (darkformer_hf/ports/{name}.py)") from None


def draw_shapes(num_features, dim):
    """FeatureKernelBase::RegisterDraw: the projection W (m x dim) and its draw counters."""
    return {"projection": (num_features, dim), "draw_seed": (1,), "draw_count": (1,)}
