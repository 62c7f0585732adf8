#!/usr/bin/env python3
"""What document masking changes (issue 40): a sweep with data.document_masking false and true,
each run evaluated afterwards with masking on (masked_eval.json, the JSON line `darkformer eval`
prints), so both arms are scored on the same masked task.

Prints, as Markdown:
- per kernel, the masked-eval accuracy of each arm and the seed-paired change masked - unmasked
  (beside the unmasked arm's own, unmasked, final eval: what leakage does at evaluation);
- per contrast (exact - constant, darkformer - performer), the difference in each arm and the
  seed-paired change of that difference;
- what leakage costs at evaluation: the unmasked arm's masked eval minus its own, unmasked, final
  eval, per kernel and per contrast (does one kernel lose more to the other documents?);
with 95 % Student-t intervals (n - 1 dof) and a plain verdict (an interval that excludes 0).

Usage: masking_effect.py --sweep runs/experiments/cpu/c4_long_masking [--json FILE]
"""
import argparse
import json
import os
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from aggregate_runs import interval  # noqa: E402

CONTRASTS = [("exact", "constant"), ("darkformer", "performer")]


def own_eval(run):
    """The run's last validation accuracy in its own setting (metrics.jsonl), None without one."""
    rows = []
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            if row.get("type") == "eval":
                rows.append(row)
    return rows[-1]["accuracy"] if rows else None


def load_runs(sweep, own=None):
    """{(kernel, masked, seed): masked-eval accuracy} of every run with a masked_eval.json; `own`
    (a dict) also gets each run's accuracy in its own setting."""
    runs = {}
    for name in sorted(os.listdir(sweep)):
        run = os.path.join(sweep, name)
        result = os.path.join(run, "masked_eval.json")
        if not os.path.isfile(result):
            continue
        with open(os.path.join(run, "config.yaml")) as f:
            config = yaml.safe_load(f)
        with open(result) as f:
            line = [l for l in f.read().splitlines() if l.strip().startswith("{")][-1]
        key = (config["attention"]["kernel"], bool(config["data"].get("document_masking", False)),
               int(config["train"].get("seed", 0)))
        runs[key] = json.loads(line)["accuracy"]
        if own is not None:
            own[key] = own_eval(run)
    return runs


def seeds_of(runs, kernel, masked):
    return {s: v for (k, m, s), v in runs.items() if k == kernel and m == masked}


def row(label, diffs):
    iv = interval(diffs)
    verdict = "n/a"
    if iv["low"] is not None:
        verdict = "up" if iv["low"] > 0 else "down" if iv["high"] < 0 else "no change shown"
    return {"label": label, "differences": diffs, **iv, "verdict": verdict}


def fmt(r):
    ci = "n/a" if r["low"] is None else f"[{r['low']:+.4f}, {r['high']:+.4f}]"
    mean = "n/a" if r["mean"] is None else f"{r['mean']:+.4f}"
    return f"| {r['label']} | {', '.join(f'{d:+.4f}' for d in r['differences'])} | {mean} | {ci} | {r['verdict']} |"


def print_evaluation_leakage(runs, own, kernels):
    """Prints and returns, per kernel and contrast, the unmasked arm's masked eval minus its own
    unmasked eval, paired by seed: what the other documents in a window cost at evaluation."""
    cost = {}
    for k in kernels:
        off = seeds_of(runs, k, False)
        cost[k] = {s: v - own[(k, False, s)] for s, v in off.items() if own.get((k, False, s)) is not None}
    print("\nLeakage at evaluation: the unmasked arm scored masked − unmasked (its own final eval), per seed:\n")
    print("| kernel or contrast | per-seed values | mean | 95 % interval | verdict |")
    print("|---|---|--:|---|---|")
    rows = []
    for k in kernels:
        rows.append(row(k, [cost[k][s] for s in sorted(cost[k])]))
    for a, b in CONTRASTS:
        if a in cost and b in cost:
            seeds = sorted(set(cost[a]) & set(cost[b]))
            rows.append(row(f"{a} − {b}", [cost[a][s] - cost[b][s] for s in seeds]))
    for r in rows:
        print(fmt(r))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", required=True)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    own = {}
    runs = load_runs(args.sweep, own)
    if not runs:
        raise SystemExit(f"masking_effect.py: no run in {args.sweep} has a masked_eval.json")
    kernels = sorted({k for k, _, _ in runs})
    out = {"kernels": [], "contrasts": []}
    print("Masked-eval accuracy per kernel (mean over seeds) and the change from masking in training:\n")
    print("| kernel | unmasked training, unmasked eval | unmasked training | masked training | masked − unmasked per seed "
          "| mean | 95 % interval | verdict |")
    print("|---|--:|--:|--:|---|--:|---|---|")
    for k in kernels:
        off, on = seeds_of(runs, k, False), seeds_of(runs, k, True)
        seeds = sorted(set(off) & set(on))
        r = row(k, [on[s] - off[s] for s in seeds])
        r["unmasked_mean"] = interval([off[s] for s in seeds])["mean"]
        r["masked_mean"] = interval([on[s] for s in seeds])["mean"]
        r["unmasked_own_eval_mean"] = interval([own.get((k, False, s)) for s in seeds])["mean"]
        out["kernels"].append(r)
        line = fmt(r).split(" | ", 1)[1]
        own_mean = "n/a" if r["unmasked_own_eval_mean"] is None else f"{r['unmasked_own_eval_mean']:.4f}"
        print(f"| {k} | {own_mean} | {r['unmasked_mean']:.4f} | {r['masked_mean']:.4f} | {line}")
    print("\nContrasts in each arm and the change of the contrast (masked − unmasked training), per seed:\n")
    print("| contrast | per-seed values | mean | 95 % interval | verdict |")
    print("|---|---|--:|---|---|")
    for a, b in CONTRASTS:
        if a not in kernels or b not in kernels:
            continue
        per_arm = {}
        for masked in (False, True):
            sa, sb = seeds_of(runs, a, masked), seeds_of(runs, b, masked)
            per_arm[masked] = {s: sa[s] - sb[s] for s in sa if s in sb}
            r = row(f"{a} − {b}, {'masked' if masked else 'unmasked'} training", [per_arm[masked][s] for s in sorted(per_arm[masked])])
            out["contrasts"].append(r)
            print(fmt(r))
        seeds = sorted(set(per_arm[False]) & set(per_arm[True]))
        r = row(f"change of {a} − {b}", [per_arm[True][s] - per_arm[False][s] for s in seeds])
        out["contrasts"].append(r)
        print(fmt(r))
    out["evaluation_leakage"] = print_evaluation_leakage(runs, own, kernels)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
