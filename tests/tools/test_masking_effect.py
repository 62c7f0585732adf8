"""Tests of tools/masking_effect.py (what document masking changes, issue 40) on fake run
directories with known values (a second, no binary).

Two kernels, three seeds, both arms. Masked-eval accuracy: performer 0.20 + 0.001 s unmasked-trained
and 0.21 + 0.001 s masked-trained (change +0.01 every seed); darkformer 0.22 and 0.225 + 0.002 s
(change +0.005 + 0.002 s). The unmasked arm's own (unmasked) final eval lies below its masked eval by
0.003 for performer and 0.002 + 0.001 s for darkformer: leakage at evaluation.
"""

import json
import os
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testkit as tk  # noqa: E402
from test_aggregate_runs import TOOLS, check, close, failures  # noqa: E402

sys.path.insert(0, TOOLS)
import masking_effect  # noqa: E402

MASKED_EVAL = {("performer", False): lambda s: 0.20 + 0.001 * s, ("performer", True): lambda s: 0.21 + 0.001 * s,
               ("darkformer", False): lambda s: 0.22, ("darkformer", True): lambda s: 0.225 + 0.002 * s}
EVAL_COST = {"performer": lambda s: 0.003, "darkformer": lambda s: 0.002 + 0.001 * s}


def write_run(folder, kernel, masked, seed):
    run = os.path.join(folder, f"seed{seed}_{kernel}_masking-{masked}")
    os.makedirs(run)
    with open(os.path.join(run, "config.yaml"), "w") as f:
        yaml.safe_dump({"attention": {"kernel": kernel}, "data": {"document_masking": masked}, "train": {"seed": seed}}, f)
    accuracy = MASKED_EVAL[(kernel, masked)](seed)
    own = accuracy - EVAL_COST[kernel](seed) if not masked else accuracy
    with open(os.path.join(run, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"type": "eval", "step": 100, "accuracy": own - 0.05}) + "\n")
        f.write(json.dumps({"type": "eval", "step": 200, "accuracy": own}) + "\n")
    with open(os.path.join(run, "masked_eval.json"), "w") as f:
        f.write("some log line\n" + json.dumps({"accuracy": accuracy, "loss": 4.0}) + "\n")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        sweep = os.path.join(tmp, "masking")
        for seed in range(3):
            for kernel in ("performer", "darkformer"):
                for masked in (False, True):
                    write_run(sweep, kernel, masked, seed)
        out_json = os.path.join(tmp, "masking.json")
        check(masking_effect.main(["--sweep", sweep, "--json", out_json]) == 0, "the command line runs")
        with open(out_json) as f:
            out = json.load(f)
        kernels = {r["label"]: r for r in out["kernels"]}
        check(all(close(d, 0.01) for d in kernels["performer"]["differences"]) and kernels["performer"]["verdict"] == "up",
              f"performer: masked - unmasked training +0.01 per seed ({kernels['performer']['differences']})")
        check(all(close(d, 0.005 + 0.002 * s) for s, d in enumerate(kernels["darkformer"]["differences"])),
              f"darkformer: +0.005 + 0.002 s ({kernels['darkformer']['differences']})")
        check(close(kernels["performer"]["unmasked_own_eval_mean"], 0.201 - 0.003),
              "the unmasked arm's own eval is its last eval row")
        change = next(r for r in out["contrasts"] if r["label"] == "change of darkformer − performer")
        check(all(close(d, 0.002 * s - 0.005) for s, d in enumerate(change["differences"])),
              f"change of darkformer - performer per seed ({change['differences']})")
        leakage = {r["label"]: r for r in out["evaluation_leakage"]}
        check(all(close(d, 0.003) for d in leakage["performer"]["differences"]),
              f"performer's leakage at evaluation 0.003 per seed ({leakage['performer']['differences']})")
        check(all(close(d, 0.001 * s - 0.001) for s, d in enumerate(leakage["darkformer − performer"]["differences"])),
              f"darkformer - performer leakage at evaluation per seed ({leakage['darkformer − performer']['differences']})")
        check("exact − constant" not in leakage, "a contrast whose kernels are absent is left out")
    return tk.report(failures)


if __name__ == "__main__":
    sys.exit(main())
