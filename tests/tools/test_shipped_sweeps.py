"""Every sweep the repository ships (configs/experiments/*/*.yaml with a grid) still loads: each of
its runs' configs, base and overrides together, validates under today's keys, as
`darkformer sweep --dry-run` checks them, so a renamed or retyped key cannot leave an experiment
that fails only when someone starts it. The dry run lists one command per grid point (the product
of the axes' lengths) and writes nothing: it runs in an empty folder, which stays empty."""

import glob
import math
import os
import subprocess
import tempfile

import yaml

import testkit


def shipped_sweeps():
    paths = sorted(glob.glob(os.path.join(testkit.SOURCE_DIR, "configs", "experiments", "*", "*.yaml")))
    sweeps = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            spec = yaml.safe_load(f)
        if isinstance(spec, dict) and "grid" in spec:
            sweeps.append((path, spec))
    return sweeps


def main():
    failures = []
    sweeps = shipped_sweeps()
    if len(sweeps) < 3:  # micro, cpu and gpu each ship several
        failures.append(f"found only {len(sweeps)} sweeps under configs/experiments")
    for path, spec in sweeps:
        name = os.path.relpath(path, testkit.SOURCE_DIR)
        expected = math.prod(len(values) for values in spec["grid"].values())
        with tempfile.TemporaryDirectory(prefix="darkformer-sweeps-") as cwd:
            result = subprocess.run([testkit.BINARY, "sweep", "--config", path, "--dry-run"], cwd=cwd,
                                    capture_output=True, text=True, timeout=120)
            output = result.stdout + result.stderr
            listed = output.count("would run:")
            written = os.listdir(cwd)
        if result.returncode != 0:
            failures.append(f"{name}: dry run exited {result.returncode}:\n{output[-2000:]}")
        elif listed != expected:
            failures.append(f"{name}: dry run listed {listed} runs, the grid has {expected}")
        if written:
            failures.append(f"{name}: the dry run wrote {written}")
        print(f"{name}: exit {result.returncode}, {listed} of {expected} runs listed")
    return testkit.report(failures)


if __name__ == "__main__":
    raise SystemExit(main())
