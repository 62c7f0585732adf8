#!/usr/bin/env python3
"""Data-parallel scaling on this machine (a benchmark, not a test; run it on a quiet machine).

Trains the demo model (configs/demo/pretrain.yaml's shape, demo corpus) for a few steps as
  1proc-1thread   one process, one intra-op thread
  1proc-2threads  one process, two threads (the single-process way to use both cores)
  2ranks          torchrun --no-python, 2 ranks x 1 thread, Gloo on loopback
at the same global batch, alternating the three each round, and reports the median over rounds
of each run's median tokens/s (steps after the first few) and the scaling efficiency
tokens/s(2 ranks) / (2 x tokens/s(1 process, 1 thread)).

    tools/bench_data_parallel.py [--rounds 3] [--steps 30] [--batch 16] [--kernel exact] [--out DIR]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BINARY = os.environ.get("DF", os.path.join(ROOT, "build", "darkformer"))
TORCHRUN = os.path.join(ROOT, ".venv", "bin", "torchrun")
SKIP = 5  # first steps: allocation and warm-up


def run(out, name, kernel, steps, batch, threads, ranks):
    run_dir = os.path.join(out, name)
    shutil.rmtree(run_dir, ignore_errors=True)
    sets = ["log.dir=" + run_dir, "train.steps=%d" % steps, "train.threads=%d" % threads,
            "data.batch_size=%d" % batch, "attention.kernel=" + kernel, "train.checkpoint_every=0",
            "eval.every=0", "log.every=0", "train.device=cpu"]
    args = [BINARY, "train", "--config", os.path.join(ROOT, "configs", "demo", "pretrain.yaml")]
    for s in sets:
        args += ["--set", s]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = str(threads)
    if ranks > 1:
        args = [TORCHRUN, "--standalone", "--nproc-per-node", str(ranks), "--no-python"] + args
    r = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("%s failed (exit %d):\n%s" % (name, r.returncode, r.stderr[-3000:]))
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rates = [row["tokens_per_s"] for row in rows if row.get("type") == "train" and row["step"] > SKIP]
    return statistics.median(rates)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--kernel", default="exact")
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "bench", "data_parallel"))
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    configs = [("1proc-1thread", 1, 1), ("1proc-2threads", 2, 1), ("2ranks", 1, 2)]
    rates = {name: [] for name, _, _ in configs}
    for r in range(a.rounds):
        for name, threads, ranks in configs:
            rates[name].append(run(a.out, name, a.kernel, a.steps, a.batch, threads, ranks))
        print("round %d: %s" % (r + 1, ", ".join("%s %.0f" % (n, v[-1]) for n, v in rates.items())))
    med = {n: statistics.median(v) for n, v in rates.items()}
    efficiency = med["2ranks"] / (2 * med["1proc-1thread"])
    print("\n| setup | tokens/s (median of %d rounds) | vs 1 process, 1 thread |" % a.rounds)
    print("|---|---|---|")
    for n, v in med.items():
        print("| %s | %.0f | %.2fx |" % (n, v, v / med["1proc-1thread"]))
    print("\nscaling efficiency (2 ranks / 2 x 1 process 1 thread): %.2f" % efficiency)
    print("2 ranks / 1 process with 2 threads: %.2fx" % (med["2ranks"] / med["1proc-2threads"]))
    with open(os.path.join(a.out, "results.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps({"kernel": a.kernel, "batch": a.batch, "steps": a.steps, "rounds": a.rounds,
                            "tokens_per_s": med, "all": rates, "scaling_efficiency": efficiency}) + "\n")


if __name__ == "__main__":
    main()
