"""Converts Hugging Face Gemma 1/2/3 checkpoints to and from darkformer's single-file HDF5 weights."""

import argparse
import json
import os
import sys

import h5py
import numpy as np
import torch
import yaml

import h5_checksums as h5sum
import hf_config_fields as cfields
import hf_kernel_state as kstate
from hf_config_mapping import (  # noqa: F401 (CONFIG_KEYS, normalise_config: re-exported for the tests)
    CONFIG_KEYS, ConversionError, config_yaml, hf_config_from_ours, normalise_config, our_config_from_hf)

FORMAT_NAME = "darkformer-weights"
FORMAT_VERSION = 1

TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
                "float16": torch.float16}
DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
BITS16 = ("bfloat16", "float16")  # HDF5 has no bfloat16: 16-bit floats are stored as their raw bits
# Non-float dtypes our binary writes (kernel buffers, trainer state); never model weights.
OTHER_DTYPES = ("int64", "uint8")

# Checkpoint-name prefixes of the language model, most specific first so that the multimodal
# layouts (new "model.language_model.", old "language_model.model.") win over plain "model.".
TEXT_PREFIXES = ("model.language_model.", "language_model.model.", "model.")
LM_HEAD_NAMES = ("lm_head.weight", "language_model.lm_head.weight")
# Gemma 3 multimodal parts that a text-only model does not use.
SKIPPED_PREFIXES = ("model.vision_tower.", "vision_tower.", "model.multi_modal_projector.",
                    "multi_modal_projector.")


# ----------------------------------------------------------------------------- weight names

def expected_shapes(cfg):
    """Our parameter names and shapes for a config; the converter checks checkpoints against it."""
    h, hd, f = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    shapes = {"embed_tokens.weight": (cfg["vocab_size"], h), "norm.weight": (h,)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
            p + "mlp.down_proj.weight": (h, f),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        })
        if cfg["family"] in ("gemma2", "gemma3"):
            shapes[p + "pre_feedforward_layernorm.weight"] = (h,)
            shapes[p + "post_feedforward_layernorm.weight"] = (h,)
        if cfg["family"] == "gemma3":
            shapes[p + "self_attn.q_norm.weight"] = (hd,)
            shapes[p + "self_attn.k_norm.weight"] = (hd,)
    return shapes


def _one_line(error):
    return " ".join(str(error).split())


def _checkpoint_files(hf_dir):
    """Maps each checkpoint tensor name to the safetensors file holding it."""
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        try:
            with open(index) as fh:
                weight_map = json.load(fh)["weight_map"]
            return {str(name): os.path.join(hf_dir, f) for name, f in weight_map.items()}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConversionError(f"{index}: not a safetensors index (no valid weight_map: "
                                  f"{_one_line(e)})") from None
    single = os.path.join(hf_dir, "model.safetensors")
    if not os.path.exists(single):
        raise ConversionError(f"{hf_dir} has neither model.safetensors nor "
                              "model.safetensors.index.json")
    return {name: single for name in _TensorReader().keys(single)}


def _our_name(hf_name):
    """Our name for a checkpoint tensor, "lm_head" for the head, or None for skipped parts."""
    if hf_name in LM_HEAD_NAMES:
        return "lm_head"
    if hf_name.startswith(SKIPPED_PREFIXES):
        return None
    for prefix in TEXT_PREFIXES:
        if hf_name.startswith(prefix):
            return hf_name[len(prefix):]
    raise ConversionError(f"unrecognised checkpoint tensor '{hf_name}'")


class _TensorReader:
    """Reads single tensors from a set of safetensors files, keeping each file open once; a missing,
    truncated or corrupt file is a ConversionError naming it."""

    def __init__(self):
        self._open = {}

    def _file(self, path):
        from safetensors import SafetensorError, safe_open
        if path not in self._open:
            try:
                self._open[path] = safe_open(path, framework="pt")
            except (OSError, SafetensorError) as e:
                raise ConversionError(f"{path}: unreadable safetensors file ({_one_line(e)})") from None
        return self._open[path]

    def keys(self, path):
        return list(self._file(path).keys())

    def get(self, path, name):
        from safetensors import SafetensorError
        try:
            return self._file(path).get_tensor(name)
        except (OSError, SafetensorError) as e:
            raise ConversionError(f"{path}: cannot read tensor '{name}' ({_one_line(e)})") from None


# ----------------------------------------------------------------------------- to-h5 / to-hf

def _write_dataset(writer, name, tensor):
    tensor = tensor.contiguous()
    # Kernel state may be integer (draw seeds and counts): kept as our binary writes it.
    dtype_name = DTYPE_NAMES.get(tensor.dtype) or {torch.int64: "int64", torch.uint8: "uint8"}.get(tensor.dtype)
    if dtype_name is None:
        raise ConversionError(f"tensor '{name}' has unsupported dtype {tensor.dtype}")
    # 16-bit floats are stored as their raw bits so nothing is rounded.
    array = tensor.view(torch.uint16).numpy() if dtype_name in BITS16 else tensor.numpy()
    writer.dataset(name, array, dtype_name)


def _dataset_dtype(reader, ds, name):
    """The dtype a dataset holds: its `dtype` attribute (inferred from the HDF5 type when absent, as
    our binary does), checked against how it is stored. Errors name the tensor."""
    stored = ds.dtype
    dtype_name = reader.string_attr(ds, "dtype")
    if dtype_name is None:
        dtype_name = {("f", 8): "float64", ("f", 4): "float32", ("u", 1): "uint8"}.get(
            (stored.kind, stored.itemsize), "int64" if stored.kind in "iu" else None)
    fits = (stored.kind in "iu" and stored.itemsize == 2 if dtype_name in BITS16
            else stored.kind == "f" if dtype_name in ("float32", "float64")
            else stored.kind in "iu" if dtype_name in OTHER_DTYPES else False)
    if not fits:
        raise ConversionError(f"tensor '{name}' is stored as {stored} with dtype attribute "
                              f"{dtype_name!r}, which do not fit together")
    return dtype_name


def _read_dataset(reader, name, dtype_name):
    """A tensor of the file, verified (Fletcher32 by HDF5) and checked finite."""
    array = reader.read(reader.get(name), name)
    if dtype_name in BITS16:
        tensor = torch.from_numpy(np.ascontiguousarray(array, dtype=np.uint16)).view(TORCH_DTYPES[dtype_name])
    else:
        tensor = torch.from_numpy(np.ascontiguousarray(array, dtype=np.dtype(dtype_name)))
    h5sum.check_finite(tensor, reader.path, name)
    return tensor


def _load_hf_config(hf_dir):
    """The transformers config of a local checkpoint directory (never a Hub download), its fields
    checked first (hf_config_fields.py), and the note to print on success (None if none)."""
    import transformers

    if not os.path.isdir(hf_dir):
        raise ConversionError(f"{hf_dir}: " + ("not a directory (expected a Hugging Face checkpoint "
                                               "directory)" if os.path.exists(hf_dir) else
                                               "no such directory"))
    config_json = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(config_json):
        raise ConversionError(f"{hf_dir} has no config.json (not a Hugging Face checkpoint directory)")
    defaulted = cfields.check(config_json)
    try:
        hf = transformers.AutoConfig.from_pretrained(hf_dir, local_files_only=True)
    except Exception as e:  # transformers' validation raises errors of many types, all about the file
        raise ConversionError(f"{config_json}: unusable config ({_one_line(e)})") from None
    return hf, cfields.check_defaults(hf, defaulted, config_json)


def hf_to_h5(hf_dir, out_path, dtype="keep"):
    hf_config, note = _load_hf_config(hf_dir)
    cfg = our_config_from_hf(hf_config)
    files = _checkpoint_files(hf_dir)
    block = getattr(hf_config, kstate.spec.BLOCK_KEY, None)
    names, kernel_names, head_name, skipped = {}, {}, None, 0
    for hf_name in files:
        ours = _our_name(hf_name)
        if ours is None:
            skipped += 1
        elif ours == "lm_head":
            head_name = hf_name
        elif ".kernel." in ours:  # attention kernel state (hf_kernel_state.py)
            kernel_names[ours] = hf_name
        else:
            names[ours] = hf_name

    shapes = expected_shapes(cfg)
    missing = sorted(set(shapes) - set(names))
    unexpected = sorted(set(names) - set(shapes))
    if missing or unexpected:
        raise ConversionError(f"checkpoint does not match its config: missing {missing[:8]}, "
                              f"unexpected {unexpected[:8]}")
    reader = _TensorReader()

    def read(hf_name):  # every tensor is checked finite once, as it is read
        tensor = reader.get(files[hf_name], hf_name)
        h5sum.check_finite(tensor, files[hf_name], hf_name)
        return tensor

    kernel_tensors = {ours: read(n) for ours, n in sorted(kernel_names.items())}
    if kernel_tensors and not block:
        raise ConversionError(f"{hf_dir}: kernel tensors ({', '.join(list(kernel_tensors)[:3])}, ...) but no "
                              f"'{kstate.spec.BLOCK_KEY}' block in config.json: cannot tell which kernel")
    if block:
        try:
            kstate.check_tensors(block, kernel_tensors, cfg, hf_dir)
        except kstate.spec.KernelStateError as e:
            raise ConversionError(str(e)) from None
    if head_name is not None:
        # Only a tied head is representable: an identical copy is dropped, anything else refused.
        head, embed = read(head_name), read(names["embed_tokens.weight"])
        if head.shape != embed.shape or not torch.equal(head, embed):
            raise ConversionError(f"untied lm_head.weight ('{head_name}' differs from the "
                                  "embedding); only tied output heads are supported")
        del head, embed

    target = None if dtype == "keep" else TORCH_DTYPES[dtype]
    tmp_path = out_path + ".partial"  # a failed run must not leave a plausible-looking file
    try:
        with h5py.File(tmp_path, "w", libver=h5sum.LIBVER) as h5:  # the checksummed layout: h5_checksums.py
            writer = h5sum.Writer(h5)
            writer.string_attr(h5, "format", FORMAT_NAME)
            h5.attrs["format_version"] = FORMAT_VERSION  # an int: in the checksummed object header
            writer.string_attr(h5, "source", os.path.abspath(hf_dir))
            writer.string_attr(h5, "config_yaml", config_yaml(cfg))
            if block:
                writer.string_attr(h5, "attention_yaml", block["attention_yaml"])
            for ours, tensor in kernel_tensors.items():  # as stored: never cast (bit-identical round trip)
                _write_dataset(writer, ours, tensor)
            for ours in sorted(names):
                tensor = read(names[ours])
                if tuple(tensor.shape) != shapes[ours]:
                    raise ConversionError(f"'{ours}' has shape {tuple(tensor.shape)}, "
                                          f"expected {shapes[ours]}")
                if target is not None:
                    tensor = tensor.to(target)
                _write_dataset(writer, ours, tensor)
            writer.finish()
        os.replace(tmp_path, out_path)
    finally:
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
    if note:
        print(note, file=sys.stderr)
    print(f"wrote {out_path}: {cfg['family']}, {len(names)} tensors"
          + (f", {len(kernel_tensors)} kernel tensors ({block['kernel']})" if block else "")
          + (f", skipped {skipped} vision/projector tensors" if skipped else ""))
    return cfg


def _open_h5(path):
    if not os.path.exists(path):
        raise ConversionError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ConversionError(f"{path}: is a directory, not a {FORMAT_NAME} .h5 file")
    try:
        return h5py.File(path, "r")
    except OSError as e:
        what = "checksum mismatch in the file's HDF5 metadata" if "checksum" in str(e) else "not a readable HDF5 file"
        raise ConversionError(f"{path}: {what} ({_one_line(e)})") from None


def _model_tensors_of(reader, cfg, where):
    """Reads the model weights of an open file after checking them against `cfg`: every parameter
    present, none extra, shapes right, floating point. Kernel tensors (".kernel.") come back
    separately; groups (a checkpoint's trainer/ state) are skipped, and said so on stderr.
    Returns (model tensors by HF name, kernel tensors by our name)."""
    shapes = expected_shapes(cfg)
    found, kernel, groups, problems = {}, [], [], []
    names = reader.names()
    for name in names:
        obj = reader.get(name)
        if not isinstance(obj, h5py.Dataset):
            groups.append(name + "/")
        elif ".kernel." in name:  # attention kernel state: exported beside the weights
            kernel.append(name)
        elif name not in shapes:
            problems.append(f"unexpected tensor '{name}' (no such parameter in a {cfg['family']} "
                            "model of this config)")
        elif tuple(obj.shape) != shapes[name]:
            problems.append(f"tensor '{name}' has shape {tuple(obj.shape)}, expected {shapes[name]}")
        else:
            try:
                dtype_name = _dataset_dtype(reader, obj, name)
            except ConversionError as e:
                problems.append(str(e))
                continue
            if dtype_name not in TORCH_DTYPES:
                problems.append(f"tensor '{name}' is {dtype_name}, not floating point")
            found[name] = (obj, dtype_name)
    problems = [f"missing tensor '{n}'" for n in sorted(set(shapes) - set(names))] + problems
    if problems:
        more = f" (and {len(problems) - 8} more)" if len(problems) > 8 else ""
        raise ConversionError(f"{where}: cannot export: " + "; ".join(problems[:8]) + more)
    if groups:
        print(f"note: skipping group(s) {', '.join(groups)} (trainer state): not model weights", file=sys.stderr)
    model = {"model." + name: _read_dataset(reader, name, dtype_name) for name, (_, dtype_name) in sorted(found.items())}
    kernel_tensors = {name: _read_dataset(reader, name, _dataset_dtype(reader, reader.get(name), name))
                      for name in sorted(kernel)}
    return model, kernel_tensors


def h5_to_hf(h5_path, out_dir, run_seed=None):
    from safetensors.torch import save_file

    with _open_h5(h5_path) as h5:
        reader = h5sum.Reader(h5, h5_path)  # every string attribute and tensor read is verified
        if reader.string_attr(h5, "format") != FORMAT_NAME:
            raise ConversionError(f"{h5_path} is not a {FORMAT_NAME} file (no format attribute "
                                  f"'{FORMAT_NAME}')")
        version = reader.attr(h5, "format_version")
        if version != FORMAT_VERSION:
            raise ConversionError(f"{h5_path}: unsupported format_version {version}")
        text = reader.string_attr(h5, "config_yaml")
        try:
            if not isinstance(text, str):
                raise KeyError("no string attribute of that name")
            cfg = yaml.safe_load(text)
        except (KeyError, yaml.YAMLError) as e:
            raise ConversionError(f"{h5_path}: no readable config_yaml attribute "
                                  f"({_one_line(e)})") from None
        cfg = normalise_config(cfg, f"{h5_path} (config_yaml)")
        tensors, kernel_tensors = _model_tensors_of(reader, cfg, h5_path)
        attention_yaml = reader.string_attr(h5, "attention_yaml") or ""
        trained_by = reader.string_attr(h5, "darkformer_version")  # checkpoints since 2026-12-02
    dtypes = {t.dtype for t in tensors.values()}
    hf = hf_config_from_ours(cfg, DTYPE_NAMES[dtypes.pop()] if len(dtypes) == 1 else None)
    if trained_by:  # beside transformers_version: the binary that wrote the checkpoint
        hf.darkformer_version = trained_by
    try:
        block = kstate.block_from_attention_yaml(
            attention_yaml, cfg["num_hidden_layers"],
            kstate.run_seed_near(h5_path) if run_seed is None else run_seed)
        if block is None and kernel_tensors:
            raise ConversionError(f"{h5_path}: kernel tensors ({', '.join(list(kernel_tensors)[:3])}, ...) but "
                                  "no attention_yaml naming a kernel: exporting would silently give softmax")
        if block is not None:
            kstate.check_tensors(block, kernel_tensors, cfg, h5_path)
            setattr(hf, kstate.spec.BLOCK_KEY, block)
            tensors.update({"model." + n: t for n, t in kernel_tensors.items()})
    except (kstate.spec.KernelStateError, yaml.YAMLError) as e:
        raise ConversionError(_one_line(e)) from None
    os.makedirs(out_dir, exist_ok=True)
    hf.save_pretrained(out_dir)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    if not reader.verified:  # said once all went well, so that an error stays one line
        print(f"note: {h5_path}: {h5sum.UNVERIFIED}", file=sys.stderr)
    print(f"wrote {out_dir}: {hf.model_type}, {len(tensors)} tensors"
          + (f" (kernel {block['kernel']}: load with darkformer_hf)" if block else ""))
    return hf


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("to-h5", help="Hugging Face checkpoint directory -> darkformer HDF5")
    p.add_argument("hf_dir")
    p.add_argument("out_h5")
    p.add_argument("--dtype", choices=["keep", "float32", "bfloat16"], default="keep",
                   help="storage dtype of the weights (default: the checkpoint's own)")
    p = sub.add_parser("to-hf", help="darkformer HDF5 -> Hugging Face checkpoint directory")
    p.add_argument("in_h5")
    p.add_argument("out_dir")
    p.add_argument("--run-seed", type=int, default=None,
                   help="the run's train.seed (default: read from the run's config.yaml, else 0); "
                        "only the random baseline's draws use it")
    args = parser.parse_args(argv)
    try:
        if args.command == "to-h5":
            hf_to_h5(args.hf_dir, args.out_h5, args.dtype)
        else:
            h5_to_hf(args.in_h5, args.out_dir, args.run_seed)
    except (ConversionError, h5sum.IntegrityError, cfields.ConfigFieldError, OSError) as e:
        # bad input or unwritable output: one line, no traceback
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
