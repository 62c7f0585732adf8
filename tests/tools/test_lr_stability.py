"""Tests of tools/lr_stability.py (the across-learning-rate spread of loss curves, paper fig. 5) and
of tools/paired_diff.py --step, on fake run directories with known values (a second, no binary).

Two kernels, two learning rates, three seeds. At every step the two lrs' losses differ by d, so the
standard deviation across lrs is d / sqrt(2) at every step: performer d = 0.2, darkformer
d = 0.1 + 0.01 * seed, so the paired darkformer - performer spread is (0.01 * seed - 0.1) / sqrt(2).
One darkformer step is NaN at one lr: it is left out and counted. Spikes sum over the lrs.
"""

import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testkit as tk  # noqa: E402
from test_aggregate_runs import TOOLS, check, close, failures, write_run  # noqa: E402

sys.path.insert(0, TOOLS)
import lr_stability  # noqa: E402
import paired_diff  # noqa: E402
from aggregate_runs import group_runs, load_sweep  # noqa: E402


def build(folder):
    for seed in range(3):
        for i, lr in enumerate((1.0e-3, 1.0e-1)):
            write_run(folder, f"pf_lr{i}_seed-{seed}", "performer", {"num_features": 64}, seed, lr,
                      accuracy=(0.3, 0.4, 0.5), spikes=i * (seed + 1), train_loss=lambda step, i=i: 2.0 + 0.2 * i)
            d = 0.1 + 0.01 * seed
            nan_step = 70 if (seed == 1 and i == 1) else None
            write_run(folder, f"dk_lr{i}_seed-{seed}", "darkformer", {"num_features": 64, "init": "identity"}, seed, lr,
                      accuracy=(0.35 + 0.01 * seed, 0.5, 0.6), spikes=0,
                      train_loss=lambda step, i=i, d=d, n=nan_step: float("nan") if step == n else 2.0 + d * i)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        sweep = os.path.join(tmp, "mqar_lr_stability")
        build(sweep)
        kernels, paired = lr_stability.analyse(load_sweep(sweep), [("darkformer m=64 identity", "performer m=64")])
        pf, dk = kernels["performer m=64"], kernels["darkformer m=64 identity"]
        check(all(close(v, 0.2 / math.sqrt(2)) for v in pf["spread_by_seed"].values()),
              f"performer: spread d / sqrt(2) = 0.1414 per seed ({pf['spread_by_seed']})")
        check(all(close(dk["spread_by_seed"][s], (0.1 + 0.01 * s) / math.sqrt(2)) for s in range(3)),
              f"darkformer: spread (0.1 + 0.01 seed) / sqrt(2) ({dk['spread_by_seed']})")
        check(dk["steps_left_out"] == 1 and pf["steps_left_out"] == 0, "the one NaN step is left out and counted")
        check(pf["spikes_by_seed"] == {0: 1, 1: 2, 2: 3} and pf["learning_rates"] == [2],
              f"spikes sum over the lrs per seed ({pf['spikes_by_seed']})")
        spread = next(r for r in paired if r["metric"] == "spread")
        want = [(0.01 * s - 0.1) / math.sqrt(2) for s in range(3)]
        check(all(close(a, b) for a, b in zip(spread["differences"], want)) and close(spread["mean"], sum(want) / 3)
              and spread["low"] < spread["mean"] < spread["high"] < 0,
              f"paired spread difference per seed and its interval ({spread['differences']}, high {spread['high']:.4f})")
        # paired_diff --step: the eval row at step 50 (accuracy 0.35 + 0.01 seed vs 0.3).
        groups = group_runs(load_sweep(sweep))
        row = paired_diff.paired(groups, "darkformer m=64 identity lr=1e-3", "performer m=64 lr=1e-3",
                                 "final_eval_accuracy", step=50)
        check(all(close(d, 0.05 + 0.01 * s) for s, d in zip(row["seeds"], row["differences"])) and row["step"] == 50,
              f"paired_diff at step 50 compares that step's eval ({row['differences']})")
        final = paired_diff.paired(groups, "darkformer m=64 identity lr=1e-3", "performer m=64 lr=1e-3",
                                   "final_eval_accuracy")
        check(all(close(d, 0.1) for d in final["differences"]), "paired_diff without --step: the final eval")
        check(lr_stability.main(["--sweep", sweep, "--pair", "darkformer m=64 identity", "performer m=64"]) == 0,
              "the command line runs")
    return tk.report(failures)


if __name__ == "__main__":
    sys.exit(main())
