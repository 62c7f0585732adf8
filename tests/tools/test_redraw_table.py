"""Tests of tools/redraw_table.py on a fake evals file with known values (no binary).

Two points, three seeds, each model evaluated with its own draw and the two other seeds' draws:
performer own 0.20 + 0.001 s, fresh 0.19 + 0.001 s and 0.19 + 0.001 s + 0.002 (mean 0.191 + 0.001
s, drop -0.009); darkformer own 0.22, fresh 0.20 + 0.002 s (both draws). Paired darkformer -
performer on their own draws: 0.020 - 0.001 s, mean +0.019; under fresh draws: 0.009 + 0.001 s,
mean +0.010. The same lines split over two files give the same table. A broken line: exit 2
naming it.
"""

import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testkit as tk  # noqa: E402
from test_aggregate_runs import TOOLS, check, failures  # noqa: E402

TOOL = os.path.join(TOOLS, "redraw_table.py")


def line(point, seed, draw, accuracy):
    return json.dumps({"point": point, "seed": seed, "draw_from": draw, "eval": {"accuracy": accuracy, "loss": 4}})


def main():
    with tempfile.TemporaryDirectory(prefix="redraw-table-") as work:
        path = os.path.join(work, "redraw.jsonl")
        rows = []
        for s in range(3):
            others = [d for d in range(3) if d != s]
            rows.append(line("performer", s, s, 0.20 + 0.001 * s))
            rows += [line("performer", s, d, 0.19 + 0.001 * s + 0.002 * i) for i, d in enumerate(others)]
            rows.append(line("darkformer", s, s, 0.22))
            rows += [line("darkformer", s, d, 0.20 + 0.002 * s) for d in others]
        with open(path, "w") as f:
            f.write("\n".join(rows) + "\n")
        out = subprocess.run([sys.executable, TOOL, "--evals", path, "--pair", "darkformer", "performer"],
                             capture_output=True, text=True)
        print(out.stdout)
        check(out.returncode == 0, f"runs ({out.stderr.strip()})")
        check("| performer (3) | 0.2010 [" in out.stdout, "performer's own-draw mean 0.201")
        check("| 0.1920 [" in out.stdout and "| -0.0090 [-0.0090, -0.0090] |" in out.stdout,
              "performer's fresh-draw mean 0.192 and its drop -0.009 on every seed")
        check("| darkformer (3) | 0.2200 |" in out.stdout or "| darkformer (3) | 0.2200 [0.2200, 0.2200] |" in out.stdout,
              "darkformer's own draw 0.22")
        check("| darkformer − performer | +0.0190 [+0.0165, +0.0215] | +0.0100 [+0.0075, +0.0125] |" in out.stdout,
              "paired differences +0.019 on own draws and +0.010 under fresh draws (t(2) 4.303 x 0.001 / sqrt 3)")
        halves = [os.path.join(work, "a.jsonl"), os.path.join(work, "b.jsonl")]
        for half, part in zip(halves, (rows[:len(rows) // 2], rows[len(rows) // 2:])):
            with open(half, "w") as f:
                f.write("\n".join(part) + "\n")
        split = subprocess.run([sys.executable, TOOL, "--evals", *halves, "--pair", "darkformer", "performer"],
                               capture_output=True, text=True)
        check(split.returncode == 0 and split.stdout == out.stdout, "two files read as one give the same table")
        with open(path, "a") as f:
            f.write('{"point": "performer", "seed": 0}\n')
        bad = subprocess.run([sys.executable, TOOL, "--evals", path], capture_output=True, text=True)
        check(bad.returncode == 2 and f"{path}:19" in bad.stderr, f"a broken line: exit 2 naming it ({bad.stderr.strip()})")
        missing = subprocess.run([sys.executable, TOOL, "--evals", path.replace(".jsonl", "x"), "--pair", "a", "b"],
                                 capture_output=True, text=True)
        check(missing.returncode != 0, "a missing file fails")
    return tk.report(failures)


if __name__ == "__main__":
    sys.exit(main())
