"""Hostile run directories: the trainer fails cleanly or recovers, and loses nothing.

A log.dir that cannot be made or written, a disk that fills, stray and corrupt files among the
checkpoints, a second trainer on the same directory, a rerun of a finished run, an interrupted
run's summary. A refusal follows test_bad_inputs.py (badkit.py): exit 2, one error line naming
the culprit; the cases about reruns, resumes and interruptions check the run directory's files.

    python test_bad_run_dirs.py CASE     # one case: exit 0 pass, 1 fail
    python test_bad_run_dirs.py --list   # the case names (tests/CMakeLists.txt lists the same)
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from badkit import (CASES, case, check, checkpoints, expect_bad, expect_ok, failures, setup_run, tk,  # noqa: E402
                    train, train_steps)


@case
def log_dir_under_file(tmp):
    blocker = os.path.join(tmp, "plain-file")
    open(blocker, "w").write("not a directory\n")
    path, _, _ = setup_run(tmp, log={"dir": blocker + "/sub"})
    expect_bad(train(path), blocker + "/sub", what="log.dir under a regular file")


@case
def log_dir_is_file(tmp):
    blocker = os.path.join(tmp, "plain-file")
    open(blocker, "w").write("not a directory\n")
    path, _, _ = setup_run(tmp, log={"dir": blocker})
    expect_bad(train(path), blocker, what="log.dir is a regular file")
    check(open(blocker).read() == "not a directory\n", "the file is left as it was")


@case
def metrics_unwritable(tmp):
    path, run_dir, _ = setup_run(tmp)
    os.makedirs(os.path.join(run_dir, "metrics.jsonl"))
    expect_bad(train(path), "metrics.jsonl", run_dir=run_dir, what="metrics.jsonl is a directory")


@case
def disk_full(tmp):
    mount = os.path.join(tmp, "small-fs")
    os.mkdir(mount)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", mount],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        print("SKIP: cannot mount a tmpfs here: " + mounted.stderr.strip())
        return
    try:
        run_dir = os.path.join(mount, "run")
        shards = tk.tiny_shards(tmp)
        model = {"family": "gemma", "vocab_size": shards["vocab_size"], "hidden_size": 64,
                 "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
                 "num_key_value_heads": 1, "head_dim": 32, "max_position_embeddings": 64}
        path = os.path.join(tmp, "run.yaml")
        tk.write_yaml(path, tk.run_config(run_dir, shards, model=model))
        res = train(path)
        expect_bad(res, "no space left", run_dir, what="checkpoint on a full 256 KiB disk")
        left = checkpoints(run_dir)
        check(left == [], "no (truncated) checkpoint under a final name (%s)" % left)
        # A disk already full: the first small write (run dir, config.yaml, metrics) fails, not a pre-check.
        shutil.rmtree(run_dir, ignore_errors=True)
        try:
            with open(os.path.join(mount, "filler"), "wb") as f:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
        except OSError:
            pass
        tk.write_yaml(path, tk.run_config(run_dir, shards, model=model))
        expect_bad(train(path), "no space left", run_dir, what="a run on a disk with no space at all")
    finally:
        subprocess.run(["umount", mount], check=False)


@case
def stray_checkpoint_files(tmp):
    path, run_dir, _ = setup_run(tmp, train={"steps": 2})
    if not expect_ok(train(path), "first run (2 steps)"):
        return
    for name in ("step_abc.h5", "step_.h5", "notes.txt"):
        open(os.path.join(run_dir, "checkpoints", name), "w").write("stray\n")
    res = train(path, "train.steps=4")
    expect_ok(res, "rerun to 4 steps beside stray files")
    steps = train_steps(run_dir)
    check(steps == [1, 2, 3, 4], "resumed: metrics.jsonl has steps 1..4 once each (got %s)" % steps)


@case
def rerun_finished(tmp):
    path, run_dir, _ = setup_run(tmp)
    if not expect_ok(train(path), "first run"):
        return

    def snapshot():
        files = {n: open(os.path.join(run_dir, n), "rb").read() for n in ("summary.json", "metrics.jsonl")}
        ckpts = {n: os.stat(os.path.join(run_dir, "checkpoints", n)).st_mtime_ns for n in checkpoints(run_dir)}
        return files, ckpts

    before = snapshot()
    time.sleep(0.05)  # so a rewritten checkpoint would get a new mtime
    expect_ok(train(path), "identical rerun of a finished run")
    after = snapshot()
    for name in before[0]:
        check(before[0][name] == after[0][name], "%s is byte-identical" % name)
    check(before[1] == after[1], "checkpoints unchanged (names and mtimes): %s" % sorted(before[1]),
          "after: %s" % after[1])


@case
def interrupted_summary(tmp):
    path, run_dir, _ = setup_run(tmp)
    res = train(path, "train.fault_injection.stop_at_step=2")
    check(res.returncode == 130, "stop at step 2 exits 130 (got %s)" % res.returncode,
          " | ".join(res.stderr.strip().splitlines()[-2:]))
    summary_path = os.path.join(run_dir, "summary.json")
    if not check(os.path.exists(summary_path), "summary.json written"):
        return
    summary = json.load(open(summary_path))
    losses = {r["step"]: r["loss"] for r in tk.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
              if r.get("type") == "train"}
    print("     summary: %s; step losses %s" % (summary, losses))
    check(summary.get("steps") == 2, "summary steps == 2 (%s)" % summary.get("steps"))
    final, loss2 = summary.get("final_loss") or 0.0, losses.get(2)
    check(loss2 is not None and final != 0 and abs(final - loss2) <= 1e-6 * abs(loss2),
          "summary final_loss %s == step-2 loss %s" % (final, loss2))
    check((summary.get("mean_tokens_per_s") or 0) > 0, "mean_tokens_per_s > 0 (%s)" % summary.get("mean_tokens_per_s"))


@case
def concurrent_trainers(tmp):
    path, run_dir, _ = setup_run(tmp, train={"steps": 1000000, "checkpoint_every": 0})
    first = subprocess.Popen([tk.BINARY, "train", "--config", path], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while not train_steps(run_dir) and time.time() < deadline and first.poll() is None:
            time.sleep(0.1)
        if not check(bool(train_steps(run_dir)), "the first trainer logs a step (rc %s)" % first.poll()):
            return
        start = time.time()
        res = train(path, timeout=60)
        took = time.time() - start
        expect_bad(res, run_dir, ("lock", "another"), what="second trainer on the same log.dir")
        check(took < 15, "the second trainer gives up within seconds (%.1f s)" % took)
        check(first.poll() is None, "the first trainer is still running")
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGTERM)
            try:
                first.wait(timeout=30)
            except subprocess.TimeoutExpired:
                first.kill()
                first.wait()
    steps = train_steps(run_dir)
    check(len(steps) == len(set(steps)) and steps == sorted(steps),
          "metrics.jsonl of the first run: no duplicated steps (%d lines, last %s)" % (len(steps), steps[-1:]))


@case
def corrupt_newest_checkpoint(tmp):
    path, run_dir, _ = setup_run(tmp, train={"steps": 4, "checkpoint_every": 2, "keep_last": 2})
    if not expect_ok(train(path), "first run (4 steps)"):
        return
    names = checkpoints(run_dir)
    if not check(names == ["step_00000002.h5", "step_00000004.h5"], "checkpoints at steps 2 and 4 (%s)" % names):
        return
    newest = os.path.join(run_dir, "checkpoints", "step_00000004.h5")
    size = os.path.getsize(newest)
    open(newest, "wb").write((b"garbage!" * (size // 8 + 1))[:size])
    res = train(path, "train.steps=6")
    expect_ok(res, "rerun to 6 steps with a corrupt newest checkpoint")
    warnings = [l for l in res.stderr.splitlines() if "step_00000004.h5" in l and ("[warn" in l or "warn" in l.lower())]
    check(bool(warnings), "a warning names step_00000004.h5", (warnings or [""])[0])
    print("     warning: " + (warnings[0] if warnings else ""))
    steps = train_steps(run_dir)
    check(steps == [1, 2, 3, 4, 5, 6], "resumed from step 2: steps 1..6 once each (got %s)" % steps)


def main(argv):
    return tk.run_case_main(argv, CASES, failures, "df-bad-run-dirs")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
