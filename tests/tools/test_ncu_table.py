"""tools/ncu_table.py on a raw CSV in the layout `ncu --csv --page raw` writes (ncu's own lines
first, a header row, a units row, one row per launch; numbers with thousands separators): the
launches group by their kernel's short name in order of first launch, times convert from the units
row to ms, throughputs and registers average, the stall reasons rank by their mean, metrics ncu
left out stay None, and a row of another width is skipped. No GPU, no ncu: a few ms."""

import csv
import io
import os
import sys
import tempfile

SOURCE_DIR = os.environ.get("DARKFORMER_SOURCE_DIR") or os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(SOURCE_DIR, "tools"))
import ncu_table  # noqa: E402

HEADER = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
          "Grid Size", "Device", "CC", "gpu__time_duration.sum", "launch__registers_per_thread",
          "sm__throughput.avg.pct_of_peak_sustained_elapsed",
          "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
          "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
          "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio"]
UNITS = [""] * 11 + ["nsecond", "register/thread", "%", "ratio", "ratio", "ratio"]
FORWARD = "darkformer::cuda_scan::<unnamed>::ChunkForwardKernel(darkformer::cuda_scan::Launch)"
OWN = "darkformer::cuda_scan::<unnamed>::ChunkOwnStateKernel(darkformer::cuda_scan::Launch)"


def launch(i, name, ns, regs, sm, barrier, scoreboard, math):
    return [str(i), "1", "darkformer", "h", name, "1", "7", "(256, 1, 1)", "(128, 1, 1)", "0", "9.0",
            ns, regs, sm, barrier, scoreboard, math]


def main():
    text = io.StringIO()
    text.write("==PROF== Connected to process 1\n")
    writer = csv.writer(text, quoting=csv.QUOTE_ALL)
    writer.writerow(HEADER)
    writer.writerow(UNITS)
    writer.writerow(launch(0, OWN, "1,000,000", "216", "10", "2", "8", "1"))
    writer.writerow(launch(1, FORWARD, "3,000", "247", "30", "6", "2", "0.5"))
    writer.writerow(launch(2, OWN, "3,000,000", "216", "20", "4", "10", "1"))
    writer.writerow(launch(3, FORWARD, "5,000", "247", "50", "4", "", "1.5"))
    writer.writerow(["a row", "of another width"])
    failures = []
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "ncu.csv")
        with open(path, "w") as f:
            f.write(text.getvalue())
        launches = ncu_table.read_launches(path)
        rows = ncu_table.kernel_rows(launches, top=2)
    if [l["kernel"] for l in launches] != ["ChunkOwnStateKernel", "ChunkForwardKernel"] * 2:
        failures.append("launches: %s" % [l["kernel"] for l in launches])
    own, forward = rows
    expect_own = {"kernel": "ChunkOwnStateKernel", "launches": 2, "total_ms": 4.0, "mean_ms": 2.0, "sm_pct": 15.0,
                  "memory_pct": None, "registers": 216.0, "stalls": [("long_scoreboard", 9.0), ("barrier", 3.0)]}
    if own != expect_own:
        failures.append("own state: %s, not %s" % (own, expect_own))
    # The empty long_scoreboard cell of one launch: the mean of the launch that has it.
    if forward["stalls"] != [("barrier", 5.0), ("long_scoreboard", 2.0)] or abs(forward["total_ms"] - 0.008) > 1e-12:
        failures.append("forward: %s" % forward)
    table = ncu_table.markdown(rows)
    if len(table) != 4 or "| ChunkOwnStateKernel | 2 | 4.000 | 2.000 | 15.0 | - | 216 | long_scoreboard 9.0, barrier 3.0 |" \
            not in table:
        failures.append("table: %s" % table)
    if failures:
        sys.exit("\n".join(failures))
    print("ncu table: 4 launches of 2 kernels, as expected")


if __name__ == "__main__":
    main()
