#!/usr/bin/env python3
"""How much of each trained random-feature model fits its own draw: from the JSON lines that
run_experiments.sh cpu-c4-importance writes (one eval per model and draw: {"point", "seed",
"draw_from", "eval": {"accuracy", ...}}; draw_from = seed is the model's own draw, any other seed's
draw is a fresh one from the same law, swapped in by tools/swap_draws.py), per point over seeds:
the own-draw accuracy, the fresh-draw accuracy (mean over the fresh draws of each seed), the drop,
and for --pair A B the seed-matched difference A - B on their own draws and under fresh draws,
each with its 95 % Student-t interval (n - 1 dof). Several --evals files are read as one (points
of two sweeps paired by seed: cpu-c4-redraw's arms against cpu-c4-importance's).

  redraw_table.py --evals redraw.jsonl [more.jsonl ...] [--pair A B ...]

A line that is not JSON or lacks a field: exit 2 naming the file and line.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_statistics import interval  # noqa: E402


def load(path, table):
    """Adds path's lines to table: {point: {seed: {"own": accuracy, "fresh": [accuracy, ...]}}}"""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                point, seed, draw, accuracy = row["point"], row["seed"], row["draw_from"], row["eval"]["accuracy"]
            except (ValueError, KeyError, TypeError) as e:
                print(f"error: {path}:{number}: not an eval line ({e!r})", file=sys.stderr)
                sys.exit(2)
            entry = table.setdefault(point, {}).setdefault(seed, {"own": None, "fresh": []})
            if draw == seed:
                entry["own"] = accuracy
            else:
                entry["fresh"].append(accuracy)


def fresh(entry):
    return sum(entry["fresh"]) / len(entry["fresh"]) if entry["fresh"] else None


def cell(values, sign=""):
    s = interval(values)
    if s["mean"] is None:
        return "—"
    if s["half_width"] is None:
        return f"{s['mean']:{sign}.4f}"
    return f"{s['mean']:{sign}.4f} [{s['low']:{sign}.4f}, {s['high']:{sign}.4f}]"


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evals", required=True, nargs="+")
    parser.add_argument("--pair", nargs=2, action="append", default=[], metavar=("A", "B"))
    args = parser.parse_args(argv)
    table = {}
    for path in args.evals:
        load(path, table)
    print("| point (seeds) | own draw | fresh draws | fresh − own |\n|---|--:|--:|--:|")
    for point, seeds in table.items():
        own = [e["own"] for e in seeds.values()]
        new = [fresh(e) for e in seeds.values()]
        drop = [None if o is None or n is None else n - o for o, n in zip(own, new)]
        print(f"| {point} ({len(seeds)}) | {cell(own)} | {cell(new)} | {cell(drop, '+')} |")
    if args.pair:
        print("\n| A − B (paired by seed) | own draws | fresh draws |\n|---|--:|--:|")
    for a, b in args.pair:
        for name in (a, b):
            if name not in table:
                print(f"error: {', '.join(args.evals)}: no point '{name}' (points: {', '.join(table)})", file=sys.stderr)
                return 2
        seeds = sorted(set(table[a]) & set(table[b]))
        own = [table[a][s]["own"] - table[b][s]["own"] for s in seeds
               if table[a][s]["own"] is not None and table[b][s]["own"] is not None]
        new = [fresh(table[a][s]) - fresh(table[b][s]) for s in seeds
               if table[a][s]["fresh"] and table[b][s]["fresh"]]
        print(f"| {a} − {b} | {cell(own, '+')} | {cell(new, '+')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
