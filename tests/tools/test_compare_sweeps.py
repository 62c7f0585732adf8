"""Tests of tools/compare_sweeps.py (the same grid in two sweep folders, point by point) on fake
run directories with known values (a second, no binary).

Two sweeps, three seeds, runs named with the seed as a prefix (`seed0_performer-m64`, as grids that
vary the seed first name them) and as a suffix (`exact_seed0`). Final eval accuracy in A (the
longer runs): constant 0.17, performer 0.18 + 0.002 s; in B: constant 0.165 + 0.001 s, performer
0.172. A - B: constant +0.005 - 0.001 s, performer +0.008 + 0.002 s; less constant's, seed by seed:
+0.003 + 0.003 s. Each run is written under both names, so every point has six runs.
"""

import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testkit as tk  # noqa: E402
from test_aggregate_runs import TOOLS, check, close, failures  # noqa: E402

sys.path.insert(0, TOOLS)
import compare_sweeps  # noqa: E402

ACCURACY = {("a", "constant"): lambda s: 0.17, ("a", "performer-m64"): lambda s: 0.18 + 0.002 * s,
            ("b", "constant"): lambda s: 0.165 + 0.001 * s, ("b", "performer-m64"): lambda s: 0.172}


def write_run(folder, name, accuracy):
    os.makedirs(os.path.join(folder, name))
    with open(os.path.join(folder, name, "metrics.jsonl"), "w") as f:
        for step in (1, 2, 3):
            f.write(json.dumps({"type": "train", "step": step, "step_ms": 100.0 * step}) + "\n")
        f.write(json.dumps({"type": "eval", "step": 3, "accuracy": accuracy}) + "\n")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        folders = {side: os.path.join(tmp, side) for side in ("a", "b")}
        for (side, point), accuracy in ACCURACY.items():
            for seed in range(3):
                write_run(folders[side], f"seed{seed}_{point}", accuracy(seed))
                write_run(folders[side], f"{point}_seed{seed}", accuracy(seed))
        out_json = os.path.join(tmp, "compare.json")
        code = compare_sweeps.main(["--a", folders["a"], "--b", folders["b"], "--baseline", "constant",
                                    "--json", out_json])
        check(code in (0, None), "the command line runs")
        with open(out_json) as f:
            rows = {r["point"]: r for r in json.load(f)}
        check(sorted(rows) == ["constant", "performer-m64"] and all(r["seeds"] == 6 for r in rows.values()),
              f"a seed as prefix or suffix leaves the same point ({sorted(rows)})")
        performer = rows["performer-m64"]
        gains = [a - b for a, b in zip(performer["accuracy_a"], performer["accuracy_b"])]
        check(sorted(round(g, 6) for g in gains) == sorted(round(0.008 + 0.002 * s, 6) for s in (0, 0, 1, 1, 2, 2)),
              f"performer A - B +0.008 + 0.002 s ({gains})")
        expected = sorted(0.003 + 0.003 * s for s in (0, 0, 1, 1, 2, 2))
        check(all(close(x, y) for x, y in zip(sorted(performer["less_baseline"]), expected)),
              f"less constant's A - B of the same seed: +0.003 + 0.003 s ({performer['less_baseline']})")
        check(all(close(x, 0.0) for x in rows["constant"]["less_baseline"]), "the baseline less itself is 0")
        check(compare_sweeps.main(["--a", folders["a"], "--b", folders["b"], "--baseline", "exact"]) == 2,
              "a baseline no sweep ran exits 2")
    return tk.report(failures)


if __name__ == "__main__":
    sys.exit(main())
