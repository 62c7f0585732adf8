#!/usr/bin/env python3
"""Paired, seed-matched differences between two points of a darkformer sweep.

Runs of two points with the same train.seed share the data order and, for performer vs
darkformer with `init: identity`, the random features at step 0 (darkformer's M starts at I), so
the per-seed difference removes that shared noise. Prints, per pair of labels, the per-seed
differences of a metric, their mean and the 95 % Student-t interval (n - 1 dof) of the mean.

Usage: paired_diff.py --sweep runs/experiments/cpu/mqar_kernels \
           --pair "darkformer m=64 identity" "performer m=64" [--pair A B ...] [--metric final_eval_accuracy]
           [--step 50 [--step 100 ...]]
--step N compares the eval row at step N instead of the final one (accuracy or loss, as --metric
names), so the gap can be followed along training.
Labels are the ones tools/aggregate_runs.py prints. Output: a Markdown table on stdout (and, with
--json FILE, the numbers).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from aggregate_runs import group_runs, interval, load_sweep, run_metrics  # noqa: E402


def at_step(run, metric, step):
    """The eval accuracy (or loss) of a run at `step`, None when it logged no eval there."""
    field = "loss" if metric.endswith("loss") else "accuracy"
    row = next((r for r in run["eval"] if r["step"] == step), None)
    return None if row is None else row.get(field)


def by_seed(group, metric, step=None):
    return {r["seed"]: run_metrics(r)[metric] if step is None else at_step(r, metric, step) for r in group["done"]}


def paired(groups, a, b, metric, step=None):
    labels = {g["label"]: g for g in groups}
    missing = [x for x in (a, b) if x not in labels]
    if missing:
        raise SystemExit(f"paired_diff.py: no point labelled {missing[0]!r}; points: {sorted(labels)}")
    sa, sb = by_seed(labels[a], metric, step), by_seed(labels[b], metric, step)
    seeds = sorted(s for s in sa if s in sb and sa[s] is not None and sb[s] is not None)
    diffs = [sa[s] - sb[s] for s in seeds]
    return {"a": a, "b": b, "metric": metric, "step": step, "seeds": seeds, "differences": diffs, **interval(diffs)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", required=True, help="one sweep folder (run directories inside)")
    parser.add_argument("--pair", nargs=2, action="append", required=True, metavar=("A", "B"),
                        help="labels of two points: reports A - B per seed")
    parser.add_argument("--metric", default="final_eval_accuracy", help="a metric of aggregate_runs.py")
    parser.add_argument("--step", type=int, action="append", help="an eval step instead of the final eval (repeatable)")
    parser.add_argument("--json", help="write the numbers to this file")
    args = parser.parse_args(argv)
    groups = group_runs(load_sweep(args.sweep))
    rows = [paired(groups, a, b, args.metric, step) for a, b in args.pair for step in (args.step or [None])]
    print(f"| A − B ({args.metric}) | step | seeds | per-seed differences | mean | 95 % interval |")
    print("|---|--:|--:|---|--:|---|")
    for r in rows:
        ci = "n/a" if r["low"] is None else f"[{r['low']:+.4f}, {r['high']:+.4f}]"
        mean = "n/a" if r["mean"] is None else f"{r['mean']:+.4f}"
        step = "final" if r["step"] is None else r["step"]
        print(f"| {r['a']} − {r['b']} | {step} | {len(r['seeds'])} | {', '.join(f'{d:+.4f}' for d in r['differences'])} | "
              f"{mean} | {ci} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
