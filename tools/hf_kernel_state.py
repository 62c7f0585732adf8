"""The attention kernel's state across the conversion (used by convert_hf_gemma.py).

to-hf: the checkpoint's `attention_yaml` (the run's attention section) becomes a `darkformer` block
in config.json and every ".kernel." tensor goes into the safetensors under its own name with the
"model." prefix. A model whose every layer is exact gets neither, as before.
to-h5: the block and those tensors come back unchanged (bit for bit), with attention_yaml.
"""

import importlib
import os
import sys
import types

import yaml


def _plugin_spec():
    """The plug-in's spec.py (pure Python) without its package's __init__, which imports
    transformers' models (about 40 % of a conversion's time on 2 cores): the package's modules are
    loaded under a bare parent package of another name. A process that imported darkformer_hf
    first gets that package's spec; otherwise the converter raises and catches its own copy's
    KernelStateError."""
    if "darkformer_hf" in sys.modules:
        return importlib.import_module("darkformer_hf.spec")
    name = "_darkformer_hf_spec_only"
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python",
                                          "darkformer_hf", "darkformer_hf")]
        sys.modules[name] = package
    return importlib.import_module(name + ".spec")


spec = _plugin_spec()


def block_from_attention_yaml(text, num_layers, run_seed):
    """The config.json block of an attention section, or None when every layer is exact."""
    section = yaml.safe_load(text) if text else None
    section = section or {}
    if not isinstance(section, dict):
        raise spec.KernelStateError(f"attention_yaml is not a mapping: {text!r}")
    block = {"version": spec.BLOCK_VERSION, "kernel": section.get("kernel", "exact"),
             "per_layer": {str(k): v for k, v in (section.get("per_layer") or {}).items()}}
    names = spec.layer_kernels(block, num_layers)
    if all(n == "exact" for n in names):
        return None
    block["options"] = {n: dict(section.get(n) or {}) for n in sorted(set(names)) if n != "exact"}
    block["run_seed"] = int(run_seed)
    block["attention_yaml"] = text  # kept verbatim so to-h5 restores the attribute as it was
    return block


def run_seed_near(h5_path):
    """train.seed of the run a checkpoint belongs to (RUN/checkpoints/step_N.h5 next to
    RUN/config.yaml), else 0: only the random baseline's in-forward draws depend on it."""
    run_dir = os.path.dirname(os.path.dirname(os.path.abspath(h5_path)))
    path = os.path.join(run_dir, "config.yaml")
    if os.path.isfile(path):
        with open(path) as fh:
            config = yaml.safe_load(fh) or {}
        return int((config.get("train") or {}).get("seed", 0) or 0)
    return 0


def check_tensors(block, tensors, cfg, where):
    """Every tensor the block's kernels need, with its shape, and no other kernel tensor."""
    want = spec.all_expected_shapes(block, cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["head_dim"])
    problems = [f"missing kernel tensor '{n}'" for n in sorted(set(want) - set(tensors))]
    problems += [f"unexpected kernel tensor '{n}'" for n in sorted(set(tensors) - set(want))]
    problems += [f"kernel tensor '{n}' has shape {tuple(t.shape)}, expected {want[n]}"
                 for n, t in sorted(tensors.items()) if n in want and tuple(t.shape) != want[n]]
    if problems:
        raise spec.KernelStateError(f"{where}: " + "; ".join(problems[:8]))
