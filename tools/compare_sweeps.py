#!/usr/bin/env python3
"""The same sweep run by two binaries (or two versions of a setting), point by point.

Both sweep folders hold runs of the same names (the same grid; the seed a prefix `seed0_...` or a
suffix `..._seed0`). For each grid point without its seed, over the seeds both have: the final
eval accuracy of each side (mean and 95 % Student-t interval), their paired, seed-matched difference A - B (mean and interval), with --baseline POINT
that difference less the baseline point's of the same seed (did this point gain more from B to A
than the baseline did: a kernel's gap to constant attention, say), the median step time
of each side (median over seeds of each run's median step_ms after step 1, which pays one-off
costs) and its ratio, and the skipped updates (non-finite gradients) of each side.

Usage: compare_sweeps.py --a runs/new --b runs/old [--label-a new --label-b old] [--baseline POINT] [--json FILE]
Output: a Markdown table on stdout.
"""
import argparse
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_statistics import interval  # noqa: E402


def read_run(path):
    train, evals = [], []
    with open(os.path.join(path, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            (train if row.get("type") == "train" else evals if row.get("type") == "eval" else []).append(row)
    later = [r["step_ms"] for r in train[1:]] or [r["step_ms"] for r in train]
    return {"accuracy": evals[-1]["accuracy"] if evals else None, "step_ms": statistics.median(later),
            "skipped": sum(1 for r in train if r.get("skipped"))}


def runs_of(folder):
    runs = {}
    for name in sorted(os.listdir(folder)):
        if os.path.exists(os.path.join(folder, name, "metrics.jsonl")):
            runs[name] = read_run(os.path.join(folder, name))
    return runs


def point_of(name):
    """The grid point of a run name: the name without its seed, a prefix or a suffix."""
    return re.sub(r"^seed\d+_|_seed\d+$", "", name)


def fmt(values, signed=False):
    i = interval(values)
    number = "%+.4f" if signed else "%.4f"
    if i["low"] is None:
        return number % i["mean"]
    return (number + " [" + number + ", " + number + "]") % (i["mean"], i["low"], i["high"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--a", required=True)
    parser.add_argument("--b", required=True)
    parser.add_argument("--label-a", default="A")
    parser.add_argument("--label-b", default="B")
    parser.add_argument("--baseline", help="a point whose paired A - B each point's is taken from, seed by seed")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    for side in (args.a, args.b):
        if not os.path.isdir(side):
            print("compare_sweeps.py: %s is not a sweep folder" % side, file=sys.stderr)
            return 2
    a, b = runs_of(args.a), runs_of(args.b)
    points = {}
    for name in sorted(set(a) & set(b)):
        points.setdefault(point_of(name), []).append(name)
    if args.baseline is not None and args.baseline not in points:
        print("compare_sweeps.py: --baseline %s is no point both sweeps ran; points: %s"
              % (args.baseline, ", ".join(sorted(points))), file=sys.stderr)
        return 2
    # Seed-matched: the baseline's A - B of the run whose name differs only in its point.
    baseline = {} if args.baseline is None else {
        n.replace(args.baseline, "", 1): a[n]["accuracy"] - b[n]["accuracy"] for n in points[args.baseline]}
    rows = []
    less = "" if args.baseline is None else " less %s's |" % args.baseline
    print("| point | seeds | accuracy %s | accuracy %s | %s - %s (paired) |%s step ms %s / %s | ratio | skipped %s / %s |"
          % (args.label_a, args.label_b, args.label_a, args.label_b, less, args.label_a, args.label_b, args.label_a,
             args.label_b))
    print("|---|---|---|---|---|%s---|---|---|" % ("---|" if less else ""))
    for point, names in points.items():
        acc_a = [a[n]["accuracy"] for n in names]
        acc_b = [b[n]["accuracy"] for n in names]
        ms_a = statistics.median(a[n]["step_ms"] for n in names)
        ms_b = statistics.median(b[n]["step_ms"] for n in names)
        diff = [x - y for x, y in zip(acc_a, acc_b)]
        skipped = (sum(a[n]["skipped"] for n in names), sum(b[n]["skipped"] for n in names))
        row = {"point": point, "seeds": len(names), "accuracy_a": acc_a, "accuracy_b": acc_b,
               "step_ms_a": ms_a, "step_ms_b": ms_b, "skipped_a": skipped[0], "skipped_b": skipped[1]}
        cell = ""
        if args.baseline is not None:
            seeds = [n.replace(point, "", 1) for n in names]
            row["less_baseline"] = [d - baseline[k] for d, k in zip(diff, seeds) if k in baseline]
            cell = " %s |" % (fmt(row["less_baseline"], signed=True) if row["less_baseline"] else "n/a")
        print("| %s | %d | %s | %s | %s |%s %.1f / %.1f | %.2fx | %d / %d |" % (
            point, len(names), fmt(acc_a), fmt(acc_b), fmt(diff, signed=True), cell, ms_a, ms_b, ms_a / ms_b,
            *skipped))
        rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
