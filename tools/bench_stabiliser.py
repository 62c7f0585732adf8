#!/usr/bin/env python3
"""Ordinary against sharp rows, and this binary against another (issue 52): a benchmark, not a test.

For each kernel, length and row norm, runs `kernel-check --bench` (forward + backward against exact
attention, SDPA) with each binary in turn, round after round, so that both binaries and both norms
see the same machine state; each run's figure is kernel-check's own median of --repeats timed calls
after a warm-up, and the report keeps the median over rounds. --norm 0 is N(0, 1) entries; a norm
N > 0 makes sharp, opposed attention (queries near u, keys near -u, rows of norm N).

Prints one line per figure and writes every run's rows as JSON lines:
  sharp / ordinary time and peak memory, per binary (the first --norms value is the ordinary one);
  new / old time and memory at each norm;
  GFLOP/s against SDPA's (kernel-check's model FLOPs), the efficiency ratio.

  bench_stabiliser.py --new build/darkformer --old /tmp/old/build/darkformer --kernels performer,darkformer \\
      --lengths 2048,8192 --norms 3,60 --rounds 3 --json runs/bench/stabiliser.jsonl
"""

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run_bench(binary, kernel, length, norm, args):
    with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as f:
        path = f.name
    cmd = [binary, "kernel-check", "--bench", "--kernel", kernel, "--heads", str(args.heads), "--kv-heads",
           str(args.kv_heads), "--bench-head-dims", str(args.head_dim), "--bench-lengths", str(length),
           "--op", args.op, "--options", "{num_features: %d}" % args.features, "--repeats", str(args.repeats),
           "--bench-norm", str(norm), "--exact-max-length", str(args.exact_max_length), "--json", path]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        print("%s failed (exit %d): %s" % (" ".join(cmd), result.returncode, result.stderr[-2000:]), file=sys.stderr)
        sys.exit(2)
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    os.unlink(path)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--new", required=True, help="this tree's binary")
    parser.add_argument("--old", help="the binary to compare with (optional)")
    parser.add_argument("--kernels", default="performer,darkformer")
    parser.add_argument("--lengths", default="2048,8192")
    parser.add_argument("--norms", default="3,60", help="the first is the ordinary one")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--op", default="auto")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--exact-max-length", type=int, default=16384)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    binaries = {"new": args.new}
    if args.old:
        binaries["old"] = args.old
    for binary in binaries.values():
        if not os.access(binary, os.X_OK):
            print("bench_stabiliser.py: %s is not an executable darkformer binary" % binary, file=sys.stderr)
            sys.exit(2)
    norms = [float(n) for n in args.norms.split(",")]
    ms = collections.defaultdict(list)
    mib = collections.defaultdict(list)
    gflops = collections.defaultdict(list)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as out:
        for round_index in range(args.rounds):
            for kernel in args.kernels.split(","):
                for length in [int(x) for x in args.lengths.split(",")]:
                    for norm in norms:
                        for name, binary in binaries.items():
                            for row in run_bench(binary, kernel, length, norm, args):
                                row.update(binary=name, norm=norm, round=round_index)
                                out.write(json.dumps(row) + "\n")
                                key = (name, kernel, length, norm, row["impl"])
                                ms[key].append(row["ms_median"])
                                mib[key].append(row["peak_mib"])
                                gflops[key].append(row["gflops"])
    med = lambda d, k: statistics.median(d[k])
    print("%s, H=%d, KV=%d, D=%d, m=%d, op %s, %d rounds x %d repeats; medians over rounds" % (
        args.kernels, args.heads, args.kv_heads, args.head_dim, args.features, args.op, args.rounds, args.repeats))
    for (name, kernel, length, norm, impl) in sorted(ms):
        if impl == "exact":
            continue
        key = (name, kernel, length, norm, impl)
        line = "%-4s %-10s L=%-6d norm=%-4g %-14s %9.1f ms %8.1f MiB %7.1f GFLOP/s" % (
            name, kernel, length, norm, impl, med(ms, key), med(mib, key), med(gflops, key))
        exact = (name, kernel, length, norm, "exact")
        if exact in ms:
            line += "  | SDPA %.1f ms, %.1f GFLOP/s: %.2fx its speed, %.0f %% of its efficiency" % (
                med(ms, exact), med(gflops, exact), med(ms, exact) / med(ms, key),
                100 * med(gflops, key) / med(gflops, exact))
        ordinary = (name, kernel, length, norms[0], impl)
        if norm != norms[0] and ordinary in ms:
            line += "  | sharp/ordinary: time %.2fx, memory %.2fx" % (med(ms, key) / med(ms, ordinary),
                                                                     med(mib, key) / med(mib, ordinary))
        old = ("old", kernel, length, norm, impl)
        if name == "new" and old in ms:
            line += "  | new/old: time %.2fx, memory %.2fx" % (med(ms, key) / med(ms, old), med(mib, key) / med(mib, old))
        print(line)


if __name__ == "__main__":
    main()
