"""Finetuned kernel models in Python: `to-hf` exports the kernel state and darkformer_hf runs it
in transformers (needs build/darkformer).

For tiny Gemma models (a random base, converted, finetuned 3 steps by our binary with each kernel):
  - `darkformer eval` loss = transformers + darkformer_hf loss on the whole validation split
    (one batch), within 1e-5 relative, and (kernels only) != the same weights under softmax;
  - greedy generation of 32 tokens: our `generate` text = transformers' `generate` text;
  - AutoModelForCausalLM(attn_implementation="darkformer") after the import = from_pretrained;
  - h5 -> hf -> h5 gives bit-identical kernel tensors; an exact model exports as before;
  - bad input: missing / mis-shaped kernel tensors, a kernel the model was not trained with.
"""

import contextlib
import os
import sys
import tempfile

import h5py
import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_plugin_cases as hc  # noqa: E402
import testkit as tk  # noqa: E402

REL_TOL = 1e-5
failures = []
check = tk.checker(failures)

# (family, label, attention section). Gemma 1 covers every kernel; Gemma 2 / 3 add softcaps,
# sliding windows, q/k norms and local RoPE around a few.
# (family, label, attention section): each kernel port's own cases (ports/<name>.py's PARITY_CASES,
# on gemma), then the cases about layers and families rather than one kernel.
CASES = [("gemma", label, {"kernel": name, **({name: options} if options else {})})
         for name in hc.darkformer_hf.spec.KERNELS
         for label, options in hc.darkformer_hf.ports.port(name).PARITY_CASES] + [
    ("gemma", "per-layer", {"kernel": "darkformer", "per_layer": {0: "exact"}, "darkformer": {"num_features": 32}}),
    ("gemma2", "darkformer", {"kernel": "darkformer", "darkformer": {"num_features": 32}}),
    ("gemma2", "trig", {"kernel": "trig", "trig": {"num_features": 32}}),
    ("gemma3", "gerf", {"kernel": "gerf", "gerf": {"num_features": 32, "a": "optimal"}}),
    ("gemma3", "flexformer", {"kernel": "flexformer", "flexformer": {"num_features": 32}}),
]



def load(out_dir):
    model = hc.darkformer_hf.from_pretrained(out_dir, dtype=torch.float32)
    model.train(False)
    return model


def parity_case(work, shards, inputs, labels, family, label, attention, measured):
    name = f"{family}/{label}"
    config_path, checkpoint = hc.finetune(work, shards, family, label, attention)
    out_dir = hc.export(checkpoint, os.path.join(work, f"{family}-{label}-hf"))
    if label == "random":
        want, got = random_losses(work, config_path, checkpoint, out_dir)
    else:
        want = hc.our_loss(config_path, checkpoint, inputs.shape[0])
        got = hc.hf_loss(load(out_dir), inputs, labels)
    rel = abs(got - want) / abs(want)
    measured[name] = rel
    check(rel <= REL_TOL, f"{name}: eval loss {want:.7f} = transformers + plug-in {got:.7f} (rel {rel:.1e})")
    softmax = transformers.AutoModelForCausalLM.from_pretrained(out_dir, attn_implementation="eager",
                                                                dtype=torch.float32)
    other = hc.hf_loss(softmax, inputs, labels)
    check(abs(other - want) > 1e-3 * abs(want), f"{name}: the kernel matters (softmax on the same weights: {other:.5f})")
    ours, theirs = hc.our_generate(config_path, checkpoint), hc.hf_generate(load(out_dir), shards["tokenizer"])
    check(ours == theirs, f"{name}: greedy 32 tokens agree" + ("" if ours == theirs else f"\n  ours: {ours!r}\n  hf:   {theirs!r}"))
    return config_path, checkpoint, out_dir


def random_losses(work, config_path, checkpoint, out_dir):
    """The random baseline's weights depend on each row's place in the batch, and the loader
    shuffles: on a two-row validation split our loss must be transformers' for one of the two row
    orders (each with fresh generators, as a fresh eval has)."""
    two = tk.tiny_shards(os.path.join(work, "two-rows"), documents=10)
    inputs, labels = hc.validation_rows(two["shards_dir"])
    want = hc.our_loss(config_path, checkpoint, inputs.shape[0], two)
    candidates = [hc.hf_loss(load(out_dir), inputs[order], labels[order]) for order in ([0, 1], [1, 0])]
    print(f"     random: the two row orders give {candidates[0]:.7f} / {candidates[1]:.7f}")
    return want, min(candidates, key=lambda c: abs(c - want))


def auto_case(out_dir, inputs, labels):
    a = hc.hf_loss(load(out_dir), inputs, labels)
    auto = transformers.AutoModelForCausalLM.from_pretrained(out_dir, attn_implementation="darkformer",
                                                             dtype=torch.float32)
    b = hc.hf_loss(auto, inputs, labels)
    check(a == b, f"AutoModelForCausalLM(attn_implementation='darkformer') = from_pretrained ({a} vs {b})")


def kernel_datasets(path):
    with h5py.File(path, "r") as h5:
        return {k: (h5[k][()], h5[k].attrs.get("dtype")) for k in h5 if ".kernel." in k}, h5.attrs.get("attention_yaml")


def roundtrip_case(work, checkpoint, out_dir, label):
    back = os.path.join(work, f"{label}-back.h5")
    check(hc.conv.main(["to-h5", out_dir, back]) == 0, f"{label}: to-h5 of the exported directory")
    (a, yaml_a), (b, yaml_b) = kernel_datasets(checkpoint), kernel_datasets(back)
    same = a.keys() == b.keys() and all(a[k][1] == b[k][1] and a[k][0].dtype == b[k][0].dtype
                                        and a[k][0].tobytes() == b[k][0].tobytes() for k in a)
    check(bool(a) and same and yaml_a == yaml_b,
          f"{label}: h5 -> hf -> h5 keeps {len(a)} kernel tensors bit for bit and attention_yaml")


def exact_case(work, shards):
    _, checkpoint = hc.finetune(work, shards, "gemma", "exact", {"kernel": "exact"}, steps=2)
    out_dir = hc.export(checkpoint, os.path.join(work, "exact-hf"))
    import json
    from safetensors import safe_open
    with open(os.path.join(out_dir, "config.json")) as fh:
        config = json.load(fh)
    with safe_open(os.path.join(out_dir, "model.safetensors"), framework="pt") as fh:
        names = list(fh.keys())
    check("darkformer" not in config and not any(".kernel." in n for n in names),
          "exact: no darkformer block and no kernel tensors in the export")
    with h5py.File(checkpoint, "r") as h5:
        same = all(np.array_equal(h5[n[len("model."):]][()], fh_tensor) for n, fh_tensor in
                   ((n, safe_open(os.path.join(out_dir, "model.safetensors"), framework="pt").get_tensor(n).numpy())
                    for n in names))
    check(same, "exact: exported tensors equal the checkpoint's bit for bit")


def bad_input_case(work, out_dir):
    from safetensors.torch import load_file, save_file
    tensors = load_file(os.path.join(out_dir, "model.safetensors"))
    victim = "model.layers.1.self_attn.kernel.projection"
    for label, change in (("missing", lambda t: t.pop(victim)),
                          ("mis-shaped", lambda t: t.__setitem__(victim, t[victim][:, :3].contiguous()))):
        broken = os.path.join(work, f"broken-{label}")
        os.makedirs(broken, exist_ok=True)
        for f in ("config.json",):
            with open(os.path.join(out_dir, f)) as src, open(os.path.join(broken, f), "w") as dst:
                dst.write(src.read())
        copy = dict(tensors)
        change(copy)
        save_file(copy, os.path.join(broken, "model.safetensors"), metadata={"format": "pt"})
        try:
            load(broken)
            check(False, f"{label} kernel tensor: loading should fail")
        except hc.darkformer_hf.KernelStateError as e:
            check(victim in str(e), f"{label} kernel tensor: error names it ({e})")
        rc = hc.conv.main(["to-h5", broken, os.path.join(work, f"broken-{label}.h5")])
        check(rc == 2, f"{label} kernel tensor: to-h5 refuses it (exit {rc})")
    try:
        hc.darkformer_hf.from_pretrained(out_dir, kernel="performer")
        check(False, "asking for a kernel the model was not trained with should fail")
    except hc.darkformer_hf.KernelStateError as e:
        check("performer" in str(e) and "darkformer" in str(e), f"wrong kernel asked for: {e}")


def main():
    if not os.path.exists(tk.BINARY):
        print(f"FAIL {tk.BINARY} not built")
        return 1
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)
    only = sys.argv[1:]  # optional labels "family/label" to run a subset
    measured = {}
    keep = os.environ.get("DARKFORMER_KEEP_TMP")
    with (contextlib.nullcontext(tempfile.mkdtemp(prefix="hf-plugin-")) if keep else tempfile.TemporaryDirectory()) as work:
        if keep:
            print("kept " + work)
        shards = tk.tiny_shards(work)
        inputs, labels = hc.validation_rows(shards["shards_dir"])
        first = None
        for family, label, attention in CASES:
            if only and f"{family}/{label}" not in only:
                continue
            result = parity_case(work, shards, inputs, labels, family, label, attention, measured)
            if family == "gemma" and label == "darkformer":
                first = result
        if first is not None:
            auto_case(first[2], inputs, labels)
            roundtrip_case(work, first[1], first[2], "gemma-darkformer")
            bad_input_case(work, first[2])
        if not only:
            exact_case(work, shards)
    print("max relative loss difference per case: " + ", ".join(f"{k} {v:.1e}" for k, v in measured.items()))
    return tk.report(failures)


if __name__ == "__main__":
    sys.exit(main())
