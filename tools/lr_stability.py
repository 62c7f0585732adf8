#!/usr/bin/env python3
"""How much a kernel's training-loss curve moves with the learning rate (DARKFormer fig. 5).

The paper's figure 5 draws, per kernel, the loss curves of seven learning rates and shades their
spread: a kernel that is stable across learning rates has a narrow band. Per kernel and seed this
takes the train-loss curves of every learning rate of a sweep (same steps), the standard
deviation across learning rates at each logged step, and its mean over steps: the across-lr
spread of that seed. Seeds are independent repeats, so the spread gets a mean and a 95 %
Student-t interval, and two kernels a paired (seed-matched) difference. Steps where some lr's loss
is not finite (a diverged or skipped update) are left out and counted. Spike counts (the trainer's
spike monitor, summed over the learning rates) are reported the same way.

Usage: lr_stability.py --sweep runs/experiments/cpu/mqar_lr_stability \
           --pair "darkformer m=64 identity" "performer m=64" [--lr 3e-4 --lr 1e-3 ...] [--json FILE]
--lr keeps only those learning rates (e.g. without the extremes, to see what dominates the spread).
Labels are aggregate_runs.py's without the lr (e.g. "performer m=64").
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from aggregate_runs import base_label, interval, load_sweep  # noqa: E402


def curves_by_kernel(runs):
    """{label without lr: {seed: {lr: {step: loss}}}} of the finished runs."""
    out = {}
    for run in runs:
        if not run["summary"]:
            continue
        label = base_label(run, with_lr=False)
        out.setdefault(label, {}).setdefault(run["seed"], {})[run["lr"]] = {
            r["step"]: r.get("loss") for r in run["train"]}
    return out


def spread(by_lr):
    """(mean over steps of the std across lrs, steps used, steps left out) of one seed."""
    steps = sorted(set.intersection(*(set(c) for c in by_lr.values())))
    stds, dropped = [], 0
    for step in steps:
        values = [c[step] for c in by_lr.values()]
        if any(v is None or not math.isfinite(v) for v in values):
            dropped += 1
            continue
        mean = sum(values) / len(values)
        stds.append(math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)))
    return (sum(stds) / len(stds) if stds else None), len(stds), dropped


def spikes_by_seed(runs, label):
    total = {}
    for run in runs:
        if run["summary"] and base_label(run, with_lr=False) == label:
            total[run["seed"]] = total.get(run["seed"], 0) + (run["summary"].get("spikes") or 0)
    return total


def analyse(runs, pairs):
    kernels = curves_by_kernel(runs)
    per_kernel = {}
    for label, seeds in sorted(kernels.items()):
        lr_counts = {len(v) for v in seeds.values()}
        per_seed = {s: spread(v) for s, v in sorted(seeds.items())}
        values = [v[0] for v in per_seed.values() if v[0] is not None]
        spikes = spikes_by_seed(runs, label)
        per_kernel[label] = {"learning_rates": sorted(lr_counts), "spread_by_seed": {s: v[0] for s, v in per_seed.items()},
                             "steps_left_out": sum(v[2] for v in per_seed.values()), "spread": interval(values),
                             "spikes_by_seed": spikes, "spikes": interval(list(spikes.values()))}
    paired = []
    for a, b in pairs:
        missing = [x for x in (a, b) if x not in per_kernel]
        if missing:
            raise SystemExit(f"lr_stability.py: no kernel labelled {missing[0]!r}; kernels: {sorted(per_kernel)}")
        for metric in ("spread", "spikes"):
            sa, sb = per_kernel[a][f"{metric}_by_seed"], per_kernel[b][f"{metric}_by_seed"]
            seeds = sorted(s for s in sa if s in sb and sa[s] is not None and sb[s] is not None)
            diffs = [sa[s] - sb[s] for s in seeds]
            paired.append({"a": a, "b": b, "metric": metric, "seeds": seeds, "differences": diffs, **interval(diffs)})
    return per_kernel, paired


def fmt(st, decimals=3):
    if st["mean"] is None:
        return "n/a"
    if st["low"] is None:
        return f"{st['mean']:.{decimals}f}"
    return f"{st['mean']:.{decimals}f} [{st['low']:.{decimals}f}, {st['high']:.{decimals}f}]"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", required=True, help="one sweep folder whose points differ in train.lr")
    parser.add_argument("--pair", nargs=2, action="append", default=[], metavar=("A", "B"),
                        help="kernel labels: reports A - B per seed")
    parser.add_argument("--lr", type=float, action="append", help="keep only this learning rate (repeatable)")
    parser.add_argument("--json", help="write the numbers to this file")
    args = parser.parse_args(argv)
    runs = [r for r in load_sweep(args.sweep) if not args.lr or any(math.isclose(r["lr"], lr) for lr in args.lr)]
    if not runs:
        raise SystemExit(f"lr_stability.py: no run directories in {args.sweep}")
    per_kernel, paired = analyse(runs, args.pair)
    print("| kernel | lrs | seeds | across-lr loss spread (mean std over steps) | steps left out | spikes (sum over lrs) |")
    print("|---|--:|--:|---|--:|---|")
    for label, k in per_kernel.items():
        print(f"| {label} | {','.join(map(str, k['learning_rates']))} | {k['spread']['n']} | {fmt(k['spread'])} | "
              f"{k['steps_left_out']} | {fmt(k['spikes'], 1)} |")
    if paired:
        print("\n| A − B | metric | seeds | per-seed differences | mean | 95 % interval |")
        print("|---|---|--:|---|--:|---|")
        for r in paired:
            ci = "n/a" if r["low"] is None else f"[{r['low']:+.3f}, {r['high']:+.3f}]"
            mean = "n/a" if r["mean"] is None else f"{r['mean']:+.3f}"
            print(f"| {r['a']} − {r['b']} | {r['metric']} | {len(r['seeds'])} | "
                  f"{', '.join(f'{d:+.3f}' for d in r['differences'])} | {mean} | {ci} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"kernels": per_kernel, "paired": paired}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
