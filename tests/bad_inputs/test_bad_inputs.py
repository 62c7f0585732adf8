"""Bad inputs end in a clean error, never a crash or a false success.

Each case drives the real `darkformer` binary. A bad input must exit 2 with exactly one error line
on stderr that names the culprit (a path, config key path or tensor), no traceback or
"terminate called", nothing on stdout, and no summary.json for a run that never started.
Hostile run directories (reruns, resumes, a full disk, a second trainer): test_bad_run_dirs.py.

    python test_bad_inputs.py CASE     # one case: exit 0 pass, 1 fail
    python test_bad_inputs.py --list   # the case names (tests/CMakeLists.txt lists the same)
"""

import json
import os
import re
import shutil
import sys
import zlib

import h5py
import numpy as np
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import testkit as tk  # noqa: E402
from badkit import (CASES, case, check, error_lines, expect_bad, expect_ok, failures,  # noqa: E402
                    setup_run, train, train_steps)

# ---- Cases -------------------------------------------------------------------------------------

@case
def config_is_directory(tmp):
    directory = os.path.join(tmp, "configs.d")
    os.mkdir(directory)
    expect_bad(train(directory), directory, what="--config is a directory")


@case
def prepare_output_is_file(tmp):
    shards = tk.tiny_shards(tmp)
    source = os.path.join(tmp, "c4.json.gz")
    tk.write_c4(source, tk.corpus_documents(20))
    target = os.path.join(tmp, "out-file")
    open(target, "w").write("keep me\n")
    res = tk.run(["prepare", "-i", source, "-t", shards["tokenizer"], "-o", target, "-j", "1"])
    expect_bad(res, target, what="prepare -o is a regular file")
    check(open(target).read() == "keep me\n", "the file is left as it was")


@case
def base_list(tmp):
    _, run_dir, full = setup_run(tmp, train={"steps": 2})
    a = dict(full, train=dict(full["train"], seed=5, lr=0.001, min_lr_ratio=0.3, weight_decay=0.2))
    tk.write_yaml(os.path.join(tmp, "a.yaml"), a)
    tk.write_yaml(os.path.join(tmp, "b.yaml"), {"train": {"lr": 0.002, "min_lr_ratio": 0.4}})
    main = os.path.join(tmp, "main.yaml")
    tk.write_yaml(main, {"base": ["a.yaml", "b.yaml"], "train": {"min_lr_ratio": 0.5, "weight_decay": 0.05}})
    if not expect_ok(train(main), "train with base: [a.yaml, b.yaml]"):
        return
    resolved = yaml.safe_load(open(os.path.join(run_dir, "config.yaml")))
    t = resolved.get("train", {})
    check(t.get("seed") == 5, "a key only in the first base is kept (train.seed %s)" % t.get("seed"))
    check(t.get("lr") == 0.002, "the later base overrides the earlier (train.lr %s)" % t.get("lr"))
    check(t.get("min_lr_ratio") == 0.5, "the including file overrides both (train.min_lr_ratio %s)"
          % t.get("min_lr_ratio"))
    check(t.get("weight_decay") == 0.05, "the including file overrides the first base (train.weight_decay %s)"
          % t.get("weight_decay"))
    check("base" not in resolved, "config.yaml has no base key left")
    check(train_steps(run_dir) == [1, 2], "the run trained steps 1..2")


@case
def base_map(tmp):
    path, run_dir, config = setup_run(tmp)
    tk.write_yaml(path, dict(config, base={"a": 1}))
    expect_bad(train(path), "base", run_dir=run_dir, what="base: {a: 1}")


@case
def vocab_too_small(tmp):
    shards = tk.tiny_shards(tmp, vocab_size=200)
    check(shards["vocab_size"] == 200, "the tokenizer has 200 pieces (%d)" % shards["vocab_size"])
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=shards["tokenizer"])
    largest = max(max(ids) for ids in sp.encode(tk.corpus_documents(200)))
    path, run_dir, _ = setup_run(tmp)
    res = train(path, "model.vocab_size=100")
    expect_bad(res, ("200", str(largest)), "100", "vocab", run_dir=run_dir, what="model.vocab_size 100 < 200")
    check(train_steps(run_dir) == [], "no step was trained")


def rewrite_dataset(path, name, data, dtype_attribute):
    """Replaces dataset `name` with `data`, keeping the file's other datasets and attributes. The
    file's checksums attribute goes: it is then a file from before checksums, read unverified, so
    the loader's own checks (not a checksum mismatch) meet the edit."""
    with h5py.File(path, "r+") as f:
        if "checksums" in f.attrs:
            del f.attrs["checksums"]
        attrs = {k: v for k, v in f[name].attrs.items() if k != "dtype"}
        del f[name]
        ds = f.create_dataset(name, data=data)
        for k, v in attrs.items():
            ds.attrs[k] = v
        if dtype_attribute:
            ds.attrs["dtype"] = dtype_attribute


@case
def int_weights(tmp):
    path, run_dir, _ = setup_run(tmp, train={"steps": 1, "checkpoint_every": 0})
    if not expect_ok(train(path), "1-step run that writes a checkpoint"):
        return
    source = os.path.join(run_dir, "checkpoints", "step_00000001.h5")
    with h5py.File(source, "r") as f:
        check("norm.weight" in f, "the checkpoint holds dataset norm.weight")
        values = np.asarray(f["norm.weight"])
    for label, data, attribute in (("int32, no dtype attribute", values.astype(np.int32), None),
                                   ("int64, dtype attribute int64", values.astype(np.int64), "int64")):
        weights = os.path.join(tmp, "int-weights-%s.h5" % (attribute or "none"))
        shutil.copy(source, weights)
        rewrite_dataset(weights, "norm.weight", data, attribute)
        finetune = os.path.join(tmp, "finetune-%s" % (attribute or "none"))
        res = train(path, "log.dir=" + finetune, "train.init_from=" + weights)
        expect_bad(res, "norm.weight", "floating", run_dir=finetune, what="init_from with norm.weight " + label)


@case
def truncated_gzip(tmp):
    shards = tk.tiny_shards(tmp)
    source = os.path.join(tmp, "c4-broken.json.gz")
    tk.write_c4(source, tk.corpus_documents(2000, seed=3))
    blob = open(source, "rb").read()
    cut = blob[:int(len(blob) * 0.6)]
    open(source, "wb").write(cut)
    complete = zlib.decompressobj(wbits=31).decompress(cut).count(b"\n")  # lines readable before the cut
    out = os.path.join(tmp, "shards-broken")
    res = tk.run(["prepare", "-i", source, "-t", shards["tokenizer"], "-o", out, "-j", "1"])
    expect_bad(res, source, "after line", what="prepare on a truncated gzip")
    m = re.search(r"after line (\d+)", "\n".join(error_lines(res.stderr)))
    n = int(m.group(1)) if m else -1
    check(0 < n <= complete, "'after line N' with 0 < N <= %d complete lines (N = %d)" % (complete, n))
    check(not os.path.exists(os.path.join(out, "manifest.yaml")), "no manifest.yaml written")


@case
def labelled_bad_records(tmp):
    good = '{"input_ids": [1, 2], "labels": [2, -100]}\n'
    bad = {"length mismatch": ('{"input_ids": [1, 2, 3], "labels": [2, 3]}', "3 input_ids but 2 labels"),
           "label beyond the vocabulary": ('{"input_ids": [1, 2], "labels": [2, 50]}', "labels[1] = 50"),
           "input id beyond the vocabulary": ('{"input_ids": [1, 50], "labels": [2, 3]}', "input_ids[1] = 50"),
           "non-integer label": ('{"input_ids": [1, 2], "labels": [2, 0.5]}', "not an integer"),
           "missing labels": ('{"input_ids": [1, 2]}', 'missing field "labels"')}
    for i, (what, (line, needle)) in enumerate(bad.items()):
        source = os.path.join(tmp, "bench-%d.jsonl" % i)
        open(source, "w").write(good + line + "\n")
        out = os.path.join(tmp, "labelled-%d" % i)
        res = tk.run(["prepare", "--labelled", "--vocab-size", "50", "--val-input", source, "-o", out, "-j", "1"])
        expect_bad(res, source + ":2:", needle, what="prepare --labelled, " + what)
        check(not os.path.exists(os.path.join(out, "manifest.yaml")), what + ": no manifest.yaml written")


@case
def negative_warmup(tmp):
    path, run_dir, _ = setup_run(tmp)
    expect_bad(train(path, "train.warmup_steps=-1"), "train.warmup_steps", run_dir=run_dir,
               what="train.warmup_steps -1")


@case
def negative_checkpoint_every(tmp):
    path, run_dir, _ = setup_run(tmp)
    expect_bad(train(path, "train.checkpoint_every=-1"), "train.checkpoint_every", run_dir=run_dir,
               what="train.checkpoint_every -1")


@case
def unused_kernel_options(tmp):
    path, run_dir, _ = setup_run(tmp, attention={"kernel": "exact", "performer": {"bogus_option": 1}})
    expect_bad(train(path), "attention.performer.bogus_option", run_dir=run_dir,
               what="unknown option of an unused kernel")


@case
def eval_stdout_json(tmp):
    path, run_dir, _ = setup_run(tmp, train={"steps": 2})
    if not expect_ok(train(path), "2-step run"):
        return
    res = tk.run(["eval", "--config", path])
    expect_ok(res, "eval")
    lines = res.stdout.splitlines()
    check(len(lines) == 1, "stdout is exactly one line (%d)" % len(lines), res.stdout[:300])
    try:
        record = json.loads(lines[0]) if lines else {}
    except ValueError:
        record = None
    check(isinstance(record, dict), "the line parses as a JSON object", lines[0][:300] if lines else "")
    missing = [k for k in ("loss", "accuracy", "perplexity", "tokens") if k not in (record or {})]
    check(not missing, "it has loss, accuracy, perplexity, tokens (missing %s)" % missing)
    check(any("[info]" in l for l in res.stderr.splitlines()), "log lines go to stderr")


@case
def yaml_type_error(tmp):
    path, run_dir, config = setup_run(tmp)
    tk.write_yaml(path, dict(config, train=[1, 2]))
    expect_bad(train(path), "train", run_dir=run_dir, what="train: [1, 2]")
    tk.write_yaml(path, dict(config, train=dict(config["train"], steps="many")))
    expect_bad(train(path), "train.steps", run_dir=run_dir, what="train.steps: many")
    tk.write_yaml(path, dict(config, data=dict(config["data"], batch_size=[4])))
    expect_bad(train(path), "data.batch_size", run_dir=run_dir, what="data.batch_size: [4]")


@case
def generate_bad_inputs(tmp):
    path, run_dir, _ = setup_run(tmp, train={"steps": 2})
    if not expect_ok(train(path), "2-step run"):
        return
    res = tk.run(["generate", "--config", path, "--prompt", "the", "--max-new-tokens", "5", "--greedy"])
    expect_ok(res, "generate")
    check(res.stdout.startswith("the"), "stdout starts with the prompt", res.stdout[:200])
    check(any("tokens/s" in l for l in res.stderr.splitlines()), "tokens/s logged to stderr")
    expect_bad(tk.run(["generate", "--config", path, "--prompt", ""]), "--prompt is empty", what="empty prompt")
    long_prompt = " ".join(["word"] * 200)  # the tiny model has 64 positions
    expect_bad(tk.run(["generate", "--config", path, "--prompt", long_prompt]), "max_position_embeddings is 64",
               what="prompt longer than the model's positions")
    missing = os.path.join(tmp, "no-such-checkpoint.h5")
    expect_bad(tk.run(["generate", "--config", path, "--checkpoint", missing, "--prompt", "the"]),
               "--checkpoint", missing, what="unknown checkpoint")
    prompts = os.path.join(tmp, "prompts.txt")
    with open(prompts, "w") as f:
        f.write("the\n\nthe\n")
    expect_bad(tk.run(["generate", "--config", path, "--prompt-file", prompts]), prompts + ":2",
               what="empty line in a prompt file")
    expect_bad(tk.run(["generate", "--config", path, "--prompt", "the", "--top-p", "0"]), "--top-p",
               what="--top-p 0")


def main(argv):
    return tk.run_case_main(argv, CASES, failures, "df-bad")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
