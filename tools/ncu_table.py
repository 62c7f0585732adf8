"""Nsight Compute's raw CSV (`ncu --import R --csv --page raw --print-units base`, written by
tools/gpu_check.sh's stage ncu) as one row per kernel: its launches, their total and mean time, the
mean SM and memory throughput (percent of peak), registers per thread, and the warp stall reasons
that take most of its warps' cycles. The raw page's first row names the metrics, its second gives
their units, every later row is one launch. Metrics this ncu does not report stay None: the CSV
itself comes back in logs.tar.gz.

usage: ncu_table.py NCU_CSV   (prints the Markdown table)
"""
import csv
import re
import sys

TIME_UNITS_MS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0,
                 "second": 1e3, "s": 1e3}
DURATION = "gpu__time_duration.sum"
SM_THROUGHPUT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
MEMORY_THROUGHPUT = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
REGISTERS = "launch__registers_per_thread"
# Warp stall reasons as WarpStateStats reports them: warps stalled per issued instruction, by reason.
STALL = re.compile(r"^smsp__average_warps?_(?:latency_)?issue_stalled_(\w+?)_per_issue_active\.ratio$")
KERNEL = re.compile(r"(\w+Kernel)\b")


def number(text):
    text = (text or "").replace(",", "").strip()
    try:
        return float(text)
    except ValueError:
        return None


def read_launches(path):
    """One dict per launch: kernel (its short name), ms, and every metric as a float (or None)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    # ncu may print its own lines (==PROF== ...) before the table: it starts at the header row.
    start = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    header, units = rows[start], rows[start + 1]
    launches = []
    for row in rows[start + 2:]:
        if len(row) != len(header):
            continue
        cells = dict(zip(header, row))
        name = KERNEL.search(cells["Kernel Name"])
        launch = {"kernel": name.group(1) if name else cells["Kernel Name"]}
        for metric, unit, text in zip(header, units, row):
            if "__" in metric:
                launch[metric] = number(text)
                if metric == DURATION and launch[metric] is not None:
                    launch["ms"] = launch[metric] * TIME_UNITS_MS.get(unit.strip(), float("nan"))
        launches.append(launch)
    return launches


def mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def kernel_rows(launches, top=3):
    """Per kernel, in order of first launch: launches, total and mean ms, mean throughputs,
    registers, and the `top` stall reasons by mean warps stalled per issued instruction."""
    rows = {}
    for launch in launches:
        rows.setdefault(launch["kernel"], []).append(launch)
    out = []
    for kernel, group in rows.items():
        stalls = {}
        for metric in group[0]:
            match = STALL.match(metric)
            if match:
                value = mean([g.get(metric) for g in group])
                if value is not None:
                    stalls[match.group(1)] = value
        times = [g.get("ms") for g in group if g.get("ms") is not None]
        out.append({"kernel": kernel, "launches": len(group),
                    "total_ms": sum(times) if times else None, "mean_ms": mean(times),
                    "sm_pct": mean([g.get(SM_THROUGHPUT) for g in group]),
                    "memory_pct": mean([g.get(MEMORY_THROUGHPUT) for g in group]),
                    "registers": mean([g.get(REGISTERS) for g in group]),
                    "stalls": sorted(stalls.items(), key=lambda kv: -kv[1])[:top]})
    return out


def markdown(rows):
    def fmt(value, pattern):
        return pattern % value if value is not None else "-"
    md = ["| kernel | launches | total ms | mean ms | SM % | memory % | registers | top stalls (warps per issue) |",
          "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        stalls = ", ".join("%s %.1f" % kv for kv in r["stalls"]) or "-"
        md.append("| %s | %d | %s | %s | %s | %s | %s | %s |" % (
            r["kernel"], r["launches"], fmt(r["total_ms"], "%.3f"), fmt(r["mean_ms"], "%.3f"),
            fmt(r["sm_pct"], "%.1f"), fmt(r["memory_pct"], "%.1f"), fmt(r["registers"], "%.0f"), stalls))
    return md


if __name__ == "__main__":
    print("\n".join(markdown(kernel_rows(read_launches(sys.argv[1])))))
