"""Loading darkformer run directories (config.yaml, metrics.jsonl, summary.json) and sweep folders,
and each run's status as the sweep runner classifies it."""
import functools
import json
import os
import subprocess

import yaml

import kernel_registry

try:  # the C loader, when PyYAML was built with it, reads configs several times faster
    _YAML_LOADER = yaml.CSafeLoader
except AttributeError:  # pragma: no cover
    _YAML_LOADER = yaml.SafeLoader

# Sweep folders in the order the tables are printed; other folders with run directories follow.
SWEEP_ORDER = ["mqar_kernels", "mqar_qkv", "mqar_lr_sweep", "c4_kernels", "kernels", "qkv", "lr_sweep"]


def load_run(path):
    """A run dir as a dict: config, train rows, eval rows (each sorted by step, last row per step
    kept), summary (None when absent), kernel, lr, name, path."""
    with open(os.path.join(path, "config.yaml")) as f:
        config = yaml.load(f, Loader=_YAML_LOADER) or {}
    train, evals = {}, {}
    metrics = os.path.join(path, "metrics.jsonl")
    if os.path.exists(metrics):
        with open(metrics) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a torn last line of a run that was killed mid-write
                if "step" not in row:
                    continue
                # A resumed run appends to metrics.jsonl: the last row per step wins.
                (evals if row.get("type") == "eval" else train)[row["step"]] = row
    summary = None
    summary_path = os.path.join(path, "summary.json")
    if os.path.exists(summary_path):
        try:
            with open(summary_path) as f:
                summary = json.load(f)
        except (OSError, json.JSONDecodeError):
            summary = None  # a torn write reads as absent, as the sweep runner does
    attention = config.get("attention") or {}
    train_config = config.get("train") or {}
    return {"path": path, "name": os.path.basename(os.path.normpath(path)), "config": config,
            "train": [train[s] for s in sorted(train)], "eval": [evals[s] for s in sorted(evals)],
            "summary": summary, "kernel": attention.get("kernel", "exact"),
            "lr": float(train_config.get("lr", float("nan"))), "seed": train_config.get("seed")}


def is_run_dir(path):
    return os.path.isfile(os.path.join(path, "config.yaml"))


def load_sweep(folder):
    """Every run directory directly inside folder, sorted by name ([] when folder is absent)."""
    if not os.path.isdir(folder):
        return []
    return [load_run(os.path.join(folder, name)) for name in sorted(os.listdir(folder))
            if is_run_dir(os.path.join(folder, name))]


def find_sweeps(runs_dir):
    """Names of the sweep folders directly under runs_dir (folders holding run directories), in
    SWEEP_ORDER first and the rest alphabetically."""
    found = []
    for name in sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else []:
        path = os.path.join(runs_dir, name)
        if os.path.isdir(path) and not is_run_dir(path) and any(
                is_run_dir(os.path.join(path, child)) for child in os.listdir(path)):
            found.append(name)
    known = [n for n in SWEEP_ORDER if n in found]
    return known + [n for n in found if n not in known]


def run_status(run):
    """finished | diverged | failed | partial | pending: asked of the binary
    (`darkformer inspect --run-status`, src/sweep/sweep_status.cpp's StatusOfRunDir), which classifies a
    run as the sweep runner does; once per folder of runs."""
    path = os.path.normpath(run["path"])
    return folder_statuses(os.path.dirname(path), tuple(sorted(os.listdir(os.path.dirname(path) or "."))))[path]


@functools.lru_cache(maxsize=None)
def folder_statuses(folder, names):
    """{run path: status} for the run directories among `names` in `folder`, from one binary call."""
    dirs = [os.path.join(folder, n) for n in names if os.path.isdir(os.path.join(folder, n))]
    path = kernel_registry.binary()
    if not os.path.isfile(path):
        raise SystemExit(f"run statuses come from the darkformer binary, and there is none at {path}: "
                         "build it (tools/build.sh) or set DARKFORMER_BIN")
    res = subprocess.run([path, "inspect", "--run-status", *dirs], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"{path} inspect --run-status failed ({res.returncode}): {res.stderr.strip()}")
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    return {os.path.normpath(r["run"]): r["status"] for r in rows}
