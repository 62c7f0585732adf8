"""tools/metrics_to_tensorboard.py round trip: a short run of the binary converted to event files,
read back with the tensorboard package's own reader, gives the logged train and eval losses,
learning rates and memory peaks; converting again does not duplicate them."""

import os
import subprocess
import sys
import tempfile

import testkit

TOOL = os.path.join(testkit.SOURCE_DIR, "tools", "metrics_to_tensorboard.py")


def read_back(folder):
    """Every scalar series, as TensorBoard's own reader loads it (the v2 writer stores scalars as
    0-d tensor summaries)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util
    acc = EventAccumulator(folder, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    out = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    for tag in acc.Tags()["tensors"]:
        out[tag] = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]
    return out


def main():
    failures = []
    with tempfile.TemporaryDirectory(prefix="tensorboard-") as work:
        shards = testkit.tiny_shards(work)
        run_dir = os.path.join(work, "run")
        config = testkit.run_config(run_dir, shards, train={"steps": 6, "checkpoint_every": 0},
                                    eval={"every": 3, "batches": 1})
        path = os.path.join(work, "run.yaml")
        testkit.write_yaml(path, config)
        testkit.run(["train", "--config", path], check=True)
        logged = testkit.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
        with open(os.path.join(run_dir, "rewinds.jsonl"), "w") as f:  # as a rewind writes it (tests/train)
            f.write('{"rewind": 1, "step": 5, "from_step": 5, "to_step": 2, "batches_skipped": 7}\n')
        for _ in range(2):  # the second conversion rewrites, never appends
            subprocess.run([sys.executable, TOOL, run_dir], check=True, capture_output=True, text=True)
        got = read_back(os.path.join(run_dir, "tensorboard"))
        for kind, key in (("train", "loss"), ("train", "lr"), ("eval", "loss"), ("eval", "accuracy")):
            want = [(r["step"], r[key]) for r in logged if r.get("type") == kind]
            have = got.get("%s/%s" % (kind, key), [])
            ok = len(want) == len(have) and all(s == t and abs(a - b) <= 1e-6 * max(1.0, abs(a))
                                                for (s, a), (t, b) in zip(want, have))
            print("[tensorboard] %s/%s: %d logged, %d read back" % (kind, key, len(want), len(have)))
            if not ok or not want:
                failures.append("%s/%s: logged %s, read back %s" % (kind, key, want, have))
        if got.get("rewinds/to_step") != [(5, 2.0)] or got.get("rewinds/batches_skipped") != [(5, 7.0)]:
            failures.append("the rewind marker: %s, %s" % (got.get("rewinds/to_step"), got.get("rewinds/batches_skipped")))
        memory = got.get("train/peak_memory_bytes", [])
        if len(memory) != 6 or min(v for _, v in memory) <= 0:
            failures.append("train/peak_memory_bytes: %s" % memory)
        bad = subprocess.run([sys.executable, TOOL, work], capture_output=True, text=True)
        if bad.returncode == 0 or "no metrics.jsonl" not in bad.stderr:
            failures.append("a folder without metrics.jsonl: exit %d, %s" % (bad.returncode, bad.stderr))
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
