"""Tests of tools/convert_hf_gemma.py on the committed fixtures (no darkformer binary needed).

Proves: HF -> darkformer HDF5 -> HF is bit-exact for Gemma 1/2/3 (fp32, bf16, sharded multimodal);
query_pre_attn_scalar 0 means head_dim and HF configs always get the explicit number (Gemma 1 gets
none, and refuses any other value); to-hf refuses missing, extra, mis-shaped and non-float tensors
naming them, and skips a checkpoint's kernel tensors and trainer/ group; unreadable or wrong input
files are a one-line error and exit code 2, never a traceback.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch
import yaml
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from convert_testkit import (FIXTURES, SOURCE_DIR, add_dataset, attr, conv, fresh_h5,  # noqa: E402
                             one_error_line, quiet, run_cli, same_tensors, set_config)
from h5_checksums import rehash  # noqa: E402  (edits below re-hash, so the check they aim at is reached)
import testkit as tk  # noqa: E402
import transformers  # noqa: E402

# Expected config values beyond the plain sizes, as make_reference.py builds the fixtures.
EXPECTED = {
    "gemma": dict(family="gemma", num_hidden_layers=2, num_key_value_heads=1,
                  query_pre_attn_scalar=16.0, attn_logit_softcapping=0.0,
                  final_logit_softcapping=0.0, sliding_window=0, rope_theta=10000.0,
                  rope_local_theta=10000.0, rope_scaling_factor=1.0,
                  layer_types=["full_attention"] * 2),
    "gemma2": dict(family="gemma2", num_hidden_layers=4, num_key_value_heads=2,
                   query_pre_attn_scalar=24.0, attn_logit_softcapping=5.0,
                   final_logit_softcapping=3.0, sliding_window=8, rope_theta=10000.0,
                   rope_local_theta=10000.0, rope_scaling_factor=1.0,
                   layer_types=["sliding_attention", "full_attention"] * 2),
    "gemma3": dict(family="gemma3", num_hidden_layers=6, num_key_value_heads=2,
                   query_pre_attn_scalar=16.0, attn_logit_softcapping=0.0,
                   final_logit_softcapping=0.0, sliding_window=8, rope_theta=1000000.0,
                   rope_local_theta=10000.0, rope_scaling_factor=8.0,
                   layer_types=["sliding_attention"] * 5 + ["full_attention"]),
}
SIZES = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4,
             head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=256, pad_token_id=0,
             bos_token_id=2, eos_token_id=1)

failures = []
check = tk.checker(failures)


def model_tensors(model):
    # state_dict lists the tied head too; the checkpoint only has the embedding.
    return {k: v for k, v in model.state_dict().items() if not k.startswith("lm_head.")}


def check_h5(name, h5_path, src):
    with h5py.File(h5_path, "r") as h5:
        check(attr(h5, "format") == "darkformer-weights" and int(attr(h5, "format_version")) == 1,
              f"{name}: format attributes")
        check(attr(h5, "source") == os.path.abspath(os.path.join(FIXTURES, name)), f"{name}: source")
        cfg_text = attr(h5, "config_yaml")
        cfg = yaml.safe_load(cfg_text)
        check(list(cfg) == conv.CONFIG_KEYS, f"{name}: config_yaml keys in order")
        want = dict(SIZES, **EXPECTED[name])
        bad = {k: (cfg.get(k), v) for k, v in want.items() if cfg.get(k) != v}
        check(not bad, f"{name}: config_yaml values {bad or ''}")
        check(all(type(cfg[k]) is float for k in ("rms_norm_eps", "rope_theta", "query_pre_attn_scalar")),
              f"{name}: float keys parse as floats")
        expected_names = set(conv.expected_shapes(cfg))
        check(set(h5.keys()) == expected_names and "lm_head.weight" not in h5,
              f"{name}: {len(expected_names)} datasets named as our parameters, no lm_head")
        stored = {k: h5[k] for k in h5.keys()}
        check(all(attr(ds, "dtype") == "float32" and ds.dtype == np.float32 for ds in stored.values()),
              f"{name}: float32 datasets with dtype attribute")
        check(all(torch.equal(torch.from_numpy(stored[k[len('model.'):]][()]), v) for k, v in src.items()),
              f"{name}: dataset values equal the checkpoint")


def roundtrip_fixture(name, tmp):
    src_dir = os.path.join(FIXTURES, name)
    src = load_file(os.path.join(src_dir, "model.safetensors"))
    h5_path = os.path.join(tmp, f"{name}.h5")
    rc, _ = quiet(conv.main, ["to-h5", src_dir, h5_path])
    check(rc == 0, f"{name}: to-h5 exit code")
    check_h5(name, h5_path, src)

    # Kernel datasets without an attention_yaml naming their kernel are refused: dropping them
    # would export a different (softmax) model. (Exporting kernel state: test_hf_plugin.py.)
    with h5py.File(h5_path, "a") as h5:
        add_dataset(h5, "layers.0.self_attn.kernel.M", np.ones((4, 16), np.float32), "float32")
    out_dir = os.path.join(tmp, f"{name}_hf")
    rc, log = quiet(conv.main, ["to-hf", h5_path, out_dir])
    check(rc == 2 and "layers.0.self_attn.kernel.M" in log and not os.path.exists(out_dir),
          f"{name}: to-hf refuses kernel datasets of no named kernel, naming one")
    with h5py.File(h5_path, "a") as h5:
        del h5["layers.0.self_attn.kernel.M"]
        rehash(h5)
    rc, log = quiet(conv.main, ["to-hf", h5_path, out_dir])
    check(rc == 0, f"{name}: to-hf exit code")
    check(same_tensors(load_file(os.path.join(out_dir, "model.safetensors")), src),
          f"{name}: written safetensors bit-identical")
    with open(os.path.join(out_dir, "config.json")) as fh:
        written = json.load(fh)
    with open(os.path.join(src_dir, "config.json")) as fh:
        original = json.load(fh)
    keys = ("model_type", "architectures", "rope_parameters", "layer_types", "sliding_window",
            "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping")
    diff = {k: (written.get(k), original.get(k)) for k in keys if written.get(k) != original.get(k)}
    check(not diff, f"{name}: config.json matches the original {diff or ''}")

    model = transformers.AutoModelForCausalLM.from_pretrained(out_dir, attn_implementation="eager")
    model.train(False)
    check(same_tensors(model_tensors(model), src), f"{name}: loaded model tensors bit-identical")
    with h5py.File(os.path.join(src_dir, "reference.h5"), "r") as ref:
        ids = torch.from_numpy(ref["input_ids"][()])
        want = torch.from_numpy(ref["logits"][()])
    with torch.no_grad():
        got = model(input_ids=ids).logits
    err = (got - want).abs().max().item()
    check(err <= 1e-5, f"{name}: logits match reference (max abs diff {err:.3g})")


def bf16_case(tmp):
    src_dir = os.path.join(tmp, "gemma3_bf16")
    model = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(FIXTURES, "gemma3"))
    model.to(torch.bfloat16)
    quiet(model.save_pretrained, src_dir)
    src = load_file(os.path.join(src_dir, "model.safetensors"))
    check(all(t.dtype == torch.bfloat16 for t in src.values()), "bf16: source checkpoint is bfloat16")
    h5_path = os.path.join(tmp, "bf16.h5")
    rc, _ = quiet(conv.main, ["to-h5", src_dir, h5_path, "--dtype", "keep"])
    with h5py.File(h5_path, "r") as h5:
        ok = all(h5[k].dtype == np.uint16 and attr(h5[k], "dtype") == "bfloat16" for k in h5.keys())
        emb = h5["embed_tokens.weight"][()]
    check(rc == 0 and ok, "bf16: datasets stored as uint16 with dtype attr bfloat16")
    check(np.array_equal(emb, src["model.embed_tokens.weight"].view(torch.uint16).numpy()),
          "bf16: uint16 datasets hold the bfloat16 bit patterns")
    out_dir = os.path.join(tmp, "bf16_hf")
    rc, _ = quiet(conv.main, ["to-hf", h5_path, out_dir])
    check(rc == 0 and same_tensors(load_file(os.path.join(out_dir, "model.safetensors")), src),
          "bf16: round-trip safetensors bit-exact")
    back = transformers.AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.bfloat16)
    check(same_tensors(model_tensors(back), src), "bf16: loaded model bit-exact")

    # --dtype float32 widens exactly, so its values equal the bfloat16 ones.
    rc, _ = quiet(conv.main, ["to-h5", src_dir, h5_path, "--dtype", "float32"])
    with h5py.File(h5_path, "r") as h5:
        emb = torch.from_numpy(h5["embed_tokens.weight"][()])
        ok = attr(h5["embed_tokens.weight"], "dtype") == "float32"
    check(rc == 0 and ok and torch.equal(emb, src["model.embed_tokens.weight"].float()),
          "bf16: --dtype float32 widens exactly")


def multimodal_case(tmp):
    """A sharded gemma3 multimodal checkpoint: text weights kept, vision tower and projector skipped."""
    text = transformers.Gemma3TextConfig.from_pretrained(os.path.join(FIXTURES, "gemma3"))
    vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14)
    cfg = transformers.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                    mm_tokens_per_image=4)
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(cfg)
    src_dir = os.path.join(tmp, "gemma3_mm")
    quiet(lambda: model.save_pretrained(src_dir, max_shard_size="300KB"))
    check(os.path.exists(os.path.join(src_dir, "model.safetensors.index.json")),
          "multimodal: checkpoint is sharded")
    h5_path = os.path.join(tmp, "mm.h5")
    rc, _ = quiet(conv.main, ["to-h5", src_dir, h5_path])
    want = model.model.language_model.state_dict()
    with h5py.File(h5_path, "r") as h5:
        cfg_ours = yaml.safe_load(attr(h5, "config_yaml"))
        ok = set(h5.keys()) == set(want) and all(
            torch.equal(torch.from_numpy(h5[k][()]), v) for k, v in want.items())
    check(rc == 0 and ok and cfg_ours["family"] == "gemma3" and cfg_ours["rope_scaling_factor"] == 8.0,
          "multimodal: text_config and language-model weights taken, vision skipped")


def untied_head_case(tmp):
    src_dir = os.path.join(tmp, "untied")
    shutil.copytree(os.path.join(FIXTURES, "gemma"), src_dir)
    tensors = load_file(os.path.join(src_dir, "model.safetensors"))
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"] + 1.0
    save_file(tensors, os.path.join(src_dir, "model.safetensors"), metadata={"format": "pt"})
    h5_path = os.path.join(tmp, "untied.h5")
    rc, log = quiet(conv.main, ["to-h5", src_dir, h5_path])
    check(rc != 0 and "lm_head.weight" in log and not os.path.exists(h5_path),
          f"untied lm_head rejected naming lm_head.weight ({log.strip()!r})")

    # An identical (tied) copy of the head is accepted and dropped.
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, os.path.join(src_dir, "model.safetensors"), metadata={"format": "pt"})
    rc, _ = quiet(conv.main, ["to-h5", src_dir, h5_path])
    with h5py.File(h5_path, "r") as h5:
        check(rc == 0 and "lm_head.weight" not in h5, "tied lm_head copy dropped")


def query_scalar_case(tmp):
    """0 means head_dim: Gemma 1 exports 0 or head_dim (and nothing else), Gemma 2/3 get the number."""
    with h5py.File(fresh_h5("gemma2", os.path.join(tmp, "q.h5")), "r") as h5:
        cfg = yaml.safe_load(attr(h5, "config_yaml"))
    cfg["query_pre_attn_scalar"] = 0
    norm = conv.normalise_config(cfg)
    check(norm["query_pre_attn_scalar"] == 16.0 and conv.normalise_config(norm) == norm and cfg["query_pre_attn_scalar"] == 0,
          "qscale: normalise_config maps 0 to head_dim, idempotent, input untouched")
    # (family, value in our file, key in the written config.json (None: absent), logits must match the fixture)
    cases = [("gemma", 0, None, True), ("gemma", 16, None, False), ("gemma2", 0, 16, False),
             ("gemma3", 0, 16, True), ("gemma2", 24, 24, False)]
    for name, value, want, compare_logits in cases:
        h5_path = fresh_h5(name, os.path.join(tmp, f"q_{name}_{value}.h5"))
        set_config(h5_path, query_pre_attn_scalar=value)
        out_dir = os.path.join(tmp, f"q_{name}_{value}_hf")
        rc, _ = run_cli(["to-hf", h5_path, out_dir])
        with open(os.path.join(out_dir, "config.json")) as fh:
            written = json.load(fh)
        got = written.get("query_pre_attn_scalar")
        check(rc == 0 and got == want and ("query_pre_attn_scalar" in written) == (want is not None),
              f"qscale: {name} file with {value} exports config.json query_pre_attn_scalar "
              + ("absent" if got is None else str(got)))
        if compare_logits:
            model = transformers.AutoModelForCausalLM.from_pretrained(out_dir, attn_implementation="eager")
            with h5py.File(os.path.join(FIXTURES, name, "reference.h5"), "r") as ref:
                ids = torch.from_numpy(ref["input_ids"][()])
                ref_logits = torch.from_numpy(ref["logits"][()])
            with torch.no_grad():
                err = (model(input_ids=ids).logits - ref_logits).abs().max().item()
            check(err <= 1e-5, f"qscale: {name} exported from 0 reproduces the fixture logits ({err:.3g})")
    for name, value in (("gemma", 24), ("gemma", 8), ("gemma2", -1), ("gemma3", "big")):
        h5_path = fresh_h5(name, os.path.join(tmp, "q_bad.h5"))
        set_config(h5_path, query_pre_attn_scalar=value)
        rc, lines = run_cli(["to-hf", h5_path, os.path.join(tmp, "q_bad_hf")])
        check(one_error_line(rc, lines) and "query_pre_attn_scalar" in lines[0],
              f"qscale: {name} with {value!r} refused ({lines[-1] if lines else ''})")


def refusal_case(tmp):
    """to-hf refuses files whose tensors do not make the model, naming the tensor, writing nothing."""
    edits = {
        "missing": ("layers.1.mlp.up_proj.weight", lambda h5: h5.__delitem__("layers.1.mlp.up_proj.weight")),
        "extra": ("layers.0.self_attn.q_proj.bias",
                  lambda h5: add_dataset(h5, "layers.0.self_attn.q_proj.bias", np.zeros(64, np.float32), "float32")),
        "mis-shaped": ("norm.weight", lambda h5: add_dataset(h5, "norm.weight", np.zeros(63, np.float32), "float32")),
        "integer": ("layers.0.input_layernorm.weight",
                    lambda h5: add_dataset(h5, "layers.0.input_layernorm.weight", np.zeros(64, np.int64), "int64")),
        "uint8 bytes": ("layers.2.post_feedforward_layernorm.weight",
                        lambda h5: add_dataset(h5, "layers.2.post_feedforward_layernorm.weight",
                                               np.zeros(64, np.uint8), "uint8")),
        "attr vs storage": ("embed_tokens.weight",
                            lambda h5: h5["embed_tokens.weight"].attrs.__setitem__("dtype", "bfloat16")),
    }
    for what, (tensor, edit) in edits.items():
        h5_path = fresh_h5("gemma2", os.path.join(tmp, "refuse.h5"))
        with h5py.File(h5_path, "a") as h5:
            edit(h5)
            rehash(h5)
        out_dir = os.path.join(tmp, "refuse_hf_" + what.replace(" ", "_"))
        rc, lines = run_cli(["to-hf", h5_path, out_dir])
        check(one_error_line(rc, lines) and f"'{tensor}'" in lines[0] and not os.path.exists(out_dir),
              f"refuse {what}: names {tensor}, writes nothing ({lines[-1] if lines else ''})")

    # A training checkpoint of an exact model: the trainer/ group is not model weights.
    h5_path = fresh_h5("gemma2", os.path.join(tmp, "ckpt.h5"))
    with h5py.File(h5_path, "a") as h5:
        add_dataset(h5, "trainer/optimizer", np.arange(100, dtype=np.uint8), "uint8")
        add_dataset(h5, "trainer/rng_cpu", np.arange(50, dtype=np.uint8), "uint8")
    out_dir = os.path.join(tmp, "ckpt_hf")
    rc, lines = run_cli(["to-hf", h5_path, out_dir])
    src = load_file(os.path.join(FIXTURES, "gemma2", "model.safetensors"))
    check(rc == 0 and len(lines) == 1 and "trainer/" in lines[0]
          and same_tensors(load_file(os.path.join(out_dir, "model.safetensors")), src),
          f"checkpoint: trainer/ skipped in one stderr line ({lines})")

    # Kernel tensors (any dtype) with no attention_yaml naming their kernel: refused, since
    # dropping them would export softmax attention (exporting kernels: test_hf_plugin.py).
    with h5py.File(h5_path, "a") as h5:
        for layer in range(4):
            add_dataset(h5, f"layers.{layer}.self_attn.kernel.M", np.ones((2, 16, 16), np.float32), "float32")
            add_dataset(h5, f"layers.{layer}.self_attn.kernel.draw_seed", np.array([7], np.int64), "int64")
    out_dir = os.path.join(tmp, "ckpt_kernel_hf")
    rc, lines = run_cli(["to-hf", h5_path, out_dir])
    check(rc == 2 and lines and "layers.0.self_attn.kernel.M" in lines[-1] and not os.path.exists(out_dir),
          f"checkpoint: kernel tensors of no named kernel refused ({lines[-1:]})")


def bad_input_case(tmp):
    """Unreadable or wrong input files: exit code 2 and one line on stderr naming the path."""
    text = os.path.join(tmp, "notes.txt")
    with open(text, "w") as fh:
        fh.write("not a checkpoint\n")
    no_weights = os.path.join(tmp, "no_weights")
    os.makedirs(no_weights)
    shutil.copy(os.path.join(FIXTURES, "gemma", "config.json"), no_weights)
    empty = os.path.join(tmp, "empty_dir")
    os.makedirs(empty)
    trunc_st = os.path.join(tmp, "trunc_st")
    shutil.copytree(os.path.join(FIXTURES, "gemma"), trunc_st)
    with open(os.path.join(trunc_st, "model.safetensors"), "r+b") as fh:
        fh.truncate(os.path.getsize(fh.name) // 2)
    trunc_h5 = fresh_h5("gemma", os.path.join(tmp, "trunc.h5"))
    with open(trunc_h5, "r+b") as fh:
        fh.truncate(os.path.getsize(trunc_h5) // 2)
    bad_yaml = fresh_h5("gemma", os.path.join(tmp, "bad_yaml.h5"))
    with h5py.File(bad_yaml, "a") as h5:
        h5.attrs["config_yaml"] = "family: [gemma"
        rehash(h5)
    cases = [
        (["to-hf", os.path.join(tmp, "missing.h5")], "missing.h5"),
        (["to-hf", text], text),
        (["to-hf", empty], empty),
        (["to-hf", trunc_h5], trunc_h5),
        (["to-hf", bad_yaml], bad_yaml),
        (["to-h5", os.path.join(tmp, "missing_dir")], "missing_dir"),
        (["to-h5", text], text),
        (["to-h5", empty], empty),
        (["to-h5", no_weights], no_weights),
        (["to-h5", trunc_st], "model.safetensors"),
    ]
    for args, named in cases:
        out = os.path.join(tmp, "bad_out.h5" if args[0] == "to-h5" else "bad_out_hf")
        rc, lines = run_cli(args + [out])
        check(one_error_line(rc, lines) and named in lines[0] and not os.path.exists(out),
              f"bad input {args[0]} {os.path.basename(args[1])}: {lines[-1] if lines else 'no message'}")
    # The command line itself: exit status 2, one line, no traceback.
    proc = subprocess.run([sys.executable, os.path.join(SOURCE_DIR, "tools", "convert_hf_gemma.py"), "to-hf",
                           text, os.path.join(tmp, "cli_out")], capture_output=True, text=True, timeout=120)
    check(proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr,
          f"bad input via the command line: exit {proc.returncode}, stderr {proc.stderr.strip()!r}")


def main():
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        for name in EXPECTED:
            roundtrip_fixture(name, tmp)
        bf16_case(tmp)
        multimodal_case(tmp)
        untied_head_case(tmp)
        query_scalar_case(tmp)
        refusal_case(tmp)
        bad_input_case(tmp)
    return tk.report(failures)


if __name__ == "__main__":
    sys.exit(main())
