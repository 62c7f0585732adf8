"""One line on a run's metrics.jsonl for the benchmarks: steps, the median s/step of the steps
after the first (which pays one-off costs), the first step's time and the losses."""
import json
import statistics
import sys

try:
    rows = [json.loads(line) for line in open(sys.argv[1]) if '"train"' in line]
except FileNotFoundError:
    rows = []
ms = [r["step_ms"] for r in rows]
later = ms[1:] or ms
print("steps %d | s/step (median, steps 2+) %s | first step %s s | losses %s" % (
    len(ms), "%.1f" % (statistics.median(later) / 1000) if later else "-",
    "%.1f" % (ms[0] / 1000) if ms else "-", " ".join("%.4f" % r["loss"] for r in rows)))
