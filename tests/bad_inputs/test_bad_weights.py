"""Weights and checkpoints that changed on disk, or hold NaN/Inf, and resumes whose config changed.

Every loader (eval, generate, train.init_from, a resume) verifies the per-tensor checksums and the
finiteness of what it reads. A refusal names the tensor (or attribute) and the file; a resume
falls back to the previous checkpoint instead. A resume whose config differs from the run's
config.yaml is refused naming the key, and leaves the run directory byte-identical.

    python test_bad_weights.py CASE     # one case: exit 0 pass, 1 fail
    python test_bad_weights.py --list
"""

import hashlib
import json
import os
import random
import shutil
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from badkit import (CASES, case, check, error_lines, expect_bad, expect_ok, failures, setup_run, tk,  # noqa: E402
                    train, train_steps)


def trained_run(tmp, steps=2, **train_keys):
    """A tiny run trained `steps` steps with a checkpoint each step: (config path, run dir)."""
    path, run_dir, _ = setup_run(tmp, train=dict({"steps": steps, "checkpoint_every": 1, "keep_last": 5}, **train_keys))
    return (path, run_dir) if expect_ok(train(path), "%d-step run" % steps) else (None, None)


def checkpoint(run_dir, step):
    return os.path.join(run_dir, "checkpoints", "step_%08d.h5" % step)


def flip_byte_in_tensor(path, name):
    """Inverts one byte in the middle of a dataset's stored data (its first chunk)."""
    with h5py.File(path, "r") as f:
        ds = f[name]
        if ds.chunks:
            info = ds.id.get_chunk_info(0)
            offset, size = info.byte_offset, info.size
        else:
            offset, size = ds.id.get_offset(), ds.id.get_storage_size()
    with open(path, "r+b") as fh:
        fh.seek(offset + size // 2)
        byte = fh.read(1)[0]
        fh.seek(offset + size // 2)
        fh.write(bytes([byte ^ 0xFF]))


def without_checksums(path, edit=None):
    """Drops the file's checksums attribute (a file from before checksums) and applies `edit`."""
    with h5py.File(path, "r+") as f:
        del f.attrs["checksums"]
        if edit:
            edit(f)


def poison(name, value):
    def edit(f):
        data = np.asarray(f[name]).copy()
        data.flat[data.size // 3] = value
        f[name][...] = data
    return edit


def loaders(path, weights, what):
    """eval, generate and a train.init_from run on `weights`: (label, result, run dir or None)."""
    finetune = os.path.join(os.path.dirname(weights), "finetune-" + os.path.basename(weights))
    return [("eval " + what, tk.run(["eval", "--config", path, "--checkpoint", weights]), None),
            ("generate " + what, tk.run(["generate", "--config", path, "--checkpoint", weights, "--prompt", "the",
                                         "--max-new-tokens", "4", "--greedy"]), None),
            ("init_from " + what, train(path, "log.dir=" + finetune, "train.init_from=" + weights), finetune)]


@case
def nonfinite_weights(tmp):
    path, run_dir = trained_run(tmp, steps=1)
    if not path:
        return
    for label, value in (("NaN", np.nan), ("Inf", np.inf)):
        weights = os.path.join(tmp, "weights-%s.h5" % label)
        shutil.copy(checkpoint(run_dir, 1), weights)
        without_checksums(weights, poison("layers.1.mlp.down_proj.weight", value))
        for what, res, run in loaders(path, weights, "of weights with one " + label):
            expect_bad(res, weights, "'layers.1.mlp.down_proj.weight'", "non-finite", run_dir=run, what=what)
            check("carries no checksums" in res.stderr, what + ": the file without checksums is noted")


@case
def flipped_byte(tmp):
    path, run_dir = trained_run(tmp, steps=1)
    if not path:
        return
    for tensor in ("layers.0.self_attn.q_proj.weight", "embed_tokens.weight"):
        weights = os.path.join(tmp, "flipped-%s.h5" % tensor)
        shutil.copy(checkpoint(run_dir, 1), weights)
        flip_byte_in_tensor(weights, tensor)
        for what, res, run in loaders(path, weights, "with a byte flipped in " + tensor):
            expect_bad(res, weights, "checksum mismatch in tensor '%s'" % tensor, run_dir=run, what=what)


@case
def resume_falls_back(tmp):
    """A newest checkpoint with a flipped byte, or a NaN AdamW moment: the run resumes from the one before."""
    moment = "trainer/adamw/state/layers.0.mlp.up_proj.weight/exp_avg"
    for label, damage in (("a flipped byte", lambda p: flip_byte_in_tensor(p, moment)),
                          ("a NaN moment", lambda p: without_checksums(p, poison(moment, np.nan)))):
        sub = os.path.join(tmp, label.replace(" ", "-"))
        os.makedirs(sub)
        path, run_dir = trained_run(sub, steps=2)
        if not path:
            return
        damage(checkpoint(run_dir, 2))
        res = train(path, "train.steps=3")
        expect_ok(res, "resume past " + label)
        warned = [l for l in res.stderr.splitlines() if "[warning]" in l and "step_00000002.h5" in l]
        check(len(warned) == 1 and moment in warned[0], "resume past %s: one warning names %s" % (label, moment),
              " | ".join(warned) or res.stderr[-300:])
        check("resumed from %s at step 1" % checkpoint(run_dir, 1) in res.stderr,
              "resume past %s: resumed from step 1" % label)
        check(train_steps(run_dir) == [1, 2, 3], "resume past %s: steps 1..3 logged once each (got %s)"
              % (label, train_steps(run_dir)))


def eval_loss(res):
    lines = [l for l in res.stdout.splitlines() if l.startswith("{")]
    return json.loads(lines[-1]).get("loss") if lines else None


@case
def fuzzed_checkpoints(tmp):
    """20 copies with 1..512 random bytes overwritten: each evaluates exactly as the original, or is
    refused with one error line. Never a crash, never a silently different model."""
    path, run_dir = trained_run(tmp, steps=1)
    if not path:
        return
    source = checkpoint(run_dir, 1)
    reference = tk.run(["eval", "--config", path, "--checkpoint", source])
    if not expect_ok(reference, "eval of the intact checkpoint"):
        return
    blob = open(source, "rb").read()
    rng = random.Random(29)
    same = refused = 0
    for copy in range(20):
        data = bytearray(blob)
        count = rng.randint(1, 512)
        start = rng.randrange(len(data) - count)
        data[start:start + count] = bytes(rng.randrange(256) for _ in range(count))
        if data == bytearray(blob):
            continue
        fuzzed = os.path.join(tmp, "fuzzed-%02d.h5" % copy)
        open(fuzzed, "wb").write(data)
        res = tk.run(["eval", "--config", path, "--checkpoint", fuzzed])
        crash = [m for m in ("terminate called", "Segmentation fault", "Aborted", "frame #0") if m in res.stderr]
        if res.returncode == 0:
            same += eval_loss(res) == eval_loss(reference)
            check(eval_loss(res) == eval_loss(reference) and not crash,
                  "copy %d (%d bytes at %d): loads, so it evaluates exactly as the original" % (copy, count, start),
                  "%s vs %s" % (eval_loss(res), eval_loss(reference)))
        else:
            refused += 1
            check(res.returncode == 2 and len(error_lines(res.stderr)) == 1 and not crash,
                  "copy %d (%d bytes at %d): refused with exit 2 and one error line" % (copy, count, start),
                  res.stderr.strip()[-300:])
    print("fuzzed copies: %d evaluate as the original, %d refused" % (same, refused))


def tree_digest(directory):
    """Every file's path and bytes under `directory`: equal digests, byte-identical trees."""
    digest = hashlib.sha256()
    for root, _, files in sorted(os.walk(directory)):
        for name in sorted(files):
            full = os.path.join(root, name)
            digest.update(os.path.relpath(full, directory).encode() + b"\0" + open(full, "rb").read())
    return digest.hexdigest()


@case
def resume_with_changed_config(tmp):
    path, run_dir = trained_run(tmp, steps=2)
    if not path:
        return
    before = tree_digest(run_dir)
    for change, key, old, new in (("data.batch_size=8", "data.batch_size", "4", "8"),
                                  ("data.seq_len=24", "data.seq_len", "32", "24"),
                                  ("data.seed=9", "data.seed", None, "9"),
                                  ("model.hidden_size=48", "model.hidden_size", "32", "48"),
                                  ("attention.kernel=performer", "attention.kernel", "exact", "performer")):
        res = train(path, change, "train.steps=3")
        needles = ["config key '%s'" % key, os.path.join(run_dir, "config.yaml"), new] + ([old] if old else [])
        expect_bad(res, *needles, what="resume with " + change)
        check(tree_digest(run_dir) == before, "resume with %s: the run directory is byte-identical" % change)
    # Keys that say how long and how a run trains may change; lr = 1e-3 written another way is no change.
    res = train(path, "train.steps=3", "train.checkpoint_every=5", "train.threads=1", "log.every=2")
    expect_ok(res, "resume with train.steps, checkpoint_every, threads and log.every changed")
    check(train_steps(run_dir)[-1] == 3, "the resumed run reached step 3")


def main(argv):
    return tk.run_case_main(argv, CASES, failures, "df-bad-weights")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
