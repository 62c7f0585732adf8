#!/usr/bin/env python3
"""Seed-aggregated tables of darkformer sweeps: mean and 95 % Student-t interval per config point.

Reads every sweep folder under --runs (as written by `darkformer sweep` / tools/run_experiments.sh:
mqar_kernels, mqar_qkv, mqar_lr_sweep, c4_kernels for the cpu protocol; kernels, qkv, lr_sweep for
micro/gpu; any other folder holding run directories too). A run directory holds config.yaml (the
fully resolved run config), metrics.jsonl and summary.json.

Runs are grouped by their config point with the seed removed (train.seed, log.*, and the options
of kernels the run does not use are ignored). Each group gets a label: the kernel plus what
distinguishes it, read from the resolved config -- `exact`, `performer m=64`, `darkformer m=64
whitening`, `lfk m=256`, plus `lr=1e-3` when the sweep varies the learning rate (and `key=value`
for any other key that still tells two groups apart). m is attention.<kernel>.num_features and the
init attention.darkformer.init.

Per group: n (seeds of finished or diverged runs; runs still pending, partial or failed are listed
and left out) and, over seeds, mean, sample standard deviation and the 95 % confidence interval
mean +- t_{0.975, n-1} * s / sqrt(n) (n/a for n = 1) of
  final_eval_accuracy  accuracy of the run's last eval row (for a diverged run: its last eval)
  final_eval_loss      loss of the run's last eval row
  best_eval_accuracy   summary.json's best_eval_accuracy
  spikes               summary.json's spikes (loss-spike events)
  skipped_updates      summary.json's skipped_updates
  rewinds              summary.json's rewinds (train.spikes.on_divergence: rewind; 0 before it existed)
  diverged             1 if the run stopped on a non-finite loss, else 0 (the table shows k/n)
Non-finite values are left out of a metric's statistics (its own n says how many were used).

Output: one Markdown table per sweep on stdout (and in --md FILE), and the same numbers, with the
per-seed values, in --json FILE. tools/plot_runs.py imports the loading and aggregation from here.

Usage: aggregate_runs.py --runs runs/experiments/cpu [--md FILE] [--json FILE] [--sweep NAME ...]
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel_registry  # noqa: E402
# Loading and statistics live in their own modules; re-exported here for the tools that import them.
from run_loading import SWEEP_ORDER, find_sweeps, is_run_dir, load_run, load_sweep, run_status  # noqa: E402,F401
from run_statistics import CONFIDENCE, interval, t_cdf, t_quantile  # noqa: E402,F401


def kernel_order():
    """Row order of the tables: the registered kernels, as kernel_registry.display_order()."""
    return kernel_registry.display_order()


def kernel_rank(kernel):
    """A kernel's place in kernel_order() (unregistered names last)."""
    order = kernel_order()
    return order.index(kernel) if kernel in order else len(order)


# Options that name a kernel's form, with their defaults: part of the label ("flexformer m=64 stationary").
FORM_OPTIONS = {"darkformer": ("init", None), "flexformer": ("variant", "stationary")}
METRICS = ["final_eval_accuracy", "final_eval_loss", "best_eval_accuracy", "spikes", "skipped_updates",
           "rewinds", "diverged"]
DONE = ("finished", "diverged")  # run statuses that count in the statistics


# ---- grouping ----------------------------------------------------------------------------------

def _flatten(node, prefix=""):
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: json.dumps(node, sort_keys=True)}


def point_key(run):
    """The run's config point without the seed: flattened config minus train.seed, log.*, and the
    option sections of kernels no layer of the run uses."""
    config = run["config"]
    attention = dict(config.get("attention") or {})
    used = {attention.get("kernel", "exact")} | {str(v) for v in (attention.get("per_layer") or {}).values()}
    for kernel in list(attention):
        if kernel in kernel_order() and kernel not in used:
            del attention[kernel]
    stripped = {k: v for k, v in config.items() if k not in ("log", "attention")}
    stripped["attention"] = attention
    flat = _flatten(stripped)
    flat.pop("train.seed", None)
    return tuple(sorted(flat.items()))


def kernel_options(run):
    """(num_features, form) of the run's kernel from its own options in config.yaml (None when the
    kernel has no such option): form is darkformer's init or flexformer's variant."""
    attention = run["config"].get("attention") or {}
    options = attention.get(run["kernel"]) or {}
    m = options.get("num_features") if run["kernel"] in kernel_registry.with_option("num_features") else None
    form, default = FORM_OPTIONS.get(run["kernel"], (None, None))
    init = options.get(form, default) if form else None
    return (int(m) if m is not None else None), init


def format_lr(lr):
    """1e-3, 3e-4, 2.5e-4: the short form used in labels."""
    if lr is None or not math.isfinite(lr):
        return "nan"
    mantissa, exponent = f"{lr:.2e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def base_label(run, with_lr):
    m, init = kernel_options(run)
    parts = [run["kernel"]]
    if m is not None:
        parts.append(f"m={m}")
    if init is not None:
        parts.append(str(init))
    if with_lr:
        parts.append(f"lr={format_lr(run['lr'])}")
    return " ".join(parts)


def _sort_key(group):
    kernel = group["kernel"]
    return (kernel_rank(kernel), kernel,
            group["num_features"] if group["num_features"] is not None else -1, str(group["init"] or ""),
            group["lr"] if math.isfinite(group["lr"]) else 0.0, group["label"])


def final_eval(run):
    return run["eval"][-1] if run["eval"] else {}


def run_metrics(run):
    """The per-run values that are aggregated (None where the run has no such value)."""
    s = run["summary"] or {}
    last = final_eval(run)
    best = s.get("best_eval_accuracy")
    if best is None and run["eval"]:
        best = max(r.get("accuracy", float("nan")) for r in run["eval"])
    return {"final_eval_accuracy": last.get("accuracy"), "final_eval_loss": last.get("loss"),
            "best_eval_accuracy": best, "spikes": s.get("spikes"), "skipped_updates": s.get("skipped_updates"),
            "rewinds": s.get("rewinds", 0) if run["summary"] is not None else None,
            "diverged": (1.0 if s.get("diverged") else 0.0) if run["summary"] is not None else None}


def group_runs(runs):
    """Groups runs by point_key; returns groups (sorted by kernel, m, init, lr) as dicts with
    label, kernel, num_features, init, lr, runs (every run of the point) and done (the finished or
    diverged ones, which the statistics use)."""
    by_key = {}
    for run in runs:
        by_key.setdefault(point_key(run), []).append(run)
    lrs = {r["lr"] for r in runs if math.isfinite(r["lr"])}
    with_lr = len(lrs) > 1
    groups = []
    for key, members in by_key.items():
        first = members[0]
        m, init = kernel_options(first)
        members = sorted(members, key=lambda r: (r["seed"] is None, r["seed"] if r["seed"] is not None else 0,
                                                 r["name"]))
        groups.append({"key": key, "label": base_label(first, with_lr), "kernel": first["kernel"],
                       "num_features": m, "init": init, "lr": first["lr"], "runs": members,
                       "done": [r for r in members if run_status(r) in DONE]})
    # Two points with the same label: append the config keys that tell them apart.
    by_label = {}
    for g in groups:
        by_label.setdefault(g["label"], []).append(g)
    for same in by_label.values():
        if len(same) < 2:
            continue
        dicts = [dict(g["key"]) for g in same]
        keys = sorted({k for d in dicts for k in d if len({d.get(k) for d in dicts}) > 1})
        for g, d in zip(same, dicts):
            extra = []
            for k in keys:
                short = k[len(f"attention.{g['kernel']}."):] if k.startswith(f"attention.{g['kernel']}.") else k
                extra.append(f"{short}={json.loads(d[k]) if k in d else '-'}")
            g["label"] += " " + " ".join(extra)
    return sorted(groups, key=_sort_key)


def aggregate_group(group, confidence=CONFIDENCE):
    """Statistics of one group over its done runs: {metric: interval(...) + values}."""
    values = {name: [] for name in METRICS}
    for run in group["done"]:
        for name, v in run_metrics(run).items():
            values[name].append(v)
    stats = {}
    for name in METRICS:
        stats[name] = interval(values[name], confidence)
        stats[name]["values"] = values[name]
    stats["diverged"]["count"] = int(sum(v or 0 for v in values["diverged"]))
    return stats


def aggregate_sweep(runs, confidence=CONFIDENCE):
    """group_runs(runs), each group with its "stats" (aggregate_group) and "n" (done runs)."""
    groups = group_runs(runs)
    for g in groups:
        g["stats"] = aggregate_group(g, confidence)
        g["n"] = len(g["done"])
    return groups


def curve(runs, field="accuracy", kind="eval", confidence=CONFIDENCE):
    """Mean and confidence band over runs of one metric per step: (steps, mean, low, high, n) as
    numpy arrays. kind is "eval" or "train"; at each step the runs that logged a finite value count;
    where only one did, low = high = mean."""
    rows = [{r["step"]: r.get(field) for r in run[kind]} for run in runs]
    steps = sorted({s for d in rows for s in d})
    mean, low, high, n = [], [], [], []
    for step in steps:
        st = interval([d.get(step) for d in rows], confidence)
        mean.append(st["mean"] if st["mean"] is not None else np.nan)
        low.append(st["low"] if st["low"] is not None else mean[-1])
        high.append(st["high"] if st["high"] is not None else mean[-1])
        n.append(st["n"])
    return (np.array(steps, dtype=float), np.array(mean, dtype=float), np.array(low, dtype=float),
            np.array(high, dtype=float), np.array(n, dtype=int))


# ---- reports -----------------------------------------------------------------------------------

def describe_sweep(runs):
    """One line on what a sweep's runs share: steps, lr (when fixed), seeds, trainable parameters."""
    if not runs:
        return ""
    train = runs[0]["config"].get("train") or {}
    parts = [f"{train.get('steps', '?')} steps"]
    lrs = sorted({r["lr"] for r in runs if math.isfinite(r["lr"])})
    if len(lrs) == 1:
        parts.append(f"lr {format_lr(lrs[0])}")
    seeds = sorted({r["seed"] for r in runs if r["seed"] is not None})
    if seeds:
        parts.append("seeds " + ", ".join(str(s) for s in seeds))
    trainable = train.get("trainable")
    if trainable and trainable != ["*"]:
        parts.append("trainable " + ", ".join(f"`{t}`" for t in trainable))
    return "; ".join(parts)


def _cell(st, decimals):
    if st["mean"] is None:
        return "–"
    text = f"{st['mean']:.{decimals}f} ± " + (f"{st['half_width']:.{decimals}f}" if st["half_width"] is not None
                                              else "n/a")
    return text


def markdown_table(name, groups, runs, confidence=CONFIDENCE):
    """A sweep's Markdown section: heading, setup line, one row per group, notes."""
    pct = f"{confidence * 100:g} %"
    lines = [f"### {name}", "", f"{len(runs)} runs, {len(groups)} points; {describe_sweep(runs)}.", "",
             "| point | n | final eval acc | final eval loss | best eval acc | spikes | skipped | rewinds | diverged |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for g in groups:
        st = g["stats"]
        lines.append(f"| {g['label']} | {g['n']} | {_cell(st['final_eval_accuracy'], 4)} | "
                     f"{_cell(st['final_eval_loss'], 4)} | {_cell(st['best_eval_accuracy'], 4)} | "
                     f"{_cell(st['spikes'], 2)} | {_cell(st['skipped_updates'], 2)} | {_cell(st['rewinds'], 2)} | "
                     f"{st['diverged']['count']}/{st['diverged']['n']} |")
    lines += ["", f"Cells: mean ± half-width of the {pct} Student-t interval over seeds (n − 1 dof); n/a "
                  "when n = 1. diverged: runs that stopped on a non-finite loss / runs."]
    missing = [f"{r['name']} ({run_status(r)})" for g in groups for r in g["runs"] if run_status(r) not in DONE]
    if missing:
        lines.append(f"Left out (not finished): {', '.join(missing)}.")
    uneven = [f"{g['label']}: {name} n={g['stats'][name]['n']}" for g in groups for name in METRICS
              if g["stats"][name]["n"] != g["n"]]
    if uneven:
        lines.append(f"Metrics with fewer values than runs (non-finite or absent): {'; '.join(uneven)}.")
    return "\n".join(lines) + "\n"


def _clean(value):
    """JSON-safe: non-finite floats become null, numpy scalars plain numbers."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def group_record(g):
    return {"label": g["label"], "kernel": g["kernel"], "num_features": g["num_features"], "init": g["init"],
            "lr": g["lr"], "n": g["n"], "seeds": [r["seed"] for r in g["done"]],
            "runs": [r["name"] for r in g["done"]],
            "not_done": {r["name"]: run_status(r) for r in g["runs"] if run_status(r) not in DONE},
            "final_step": [final_eval(r).get("step") for r in g["done"]], "metrics": g["stats"]}


def pretrain_record(run):
    last = final_eval(run)
    return {"name": run["name"], "status": run_status(run), "steps": (run["summary"] or {}).get("steps"),
            "final_eval_step": last.get("step"), "final_eval_accuracy": last.get("accuracy"),
            "final_eval_loss": last.get("loss")}


def aggregate(runs_dir, sweeps=None, confidence=CONFIDENCE):
    """Everything under runs_dir: {"runs_dir", "confidence", "pretrain": {name: record},
    "sweeps": {name: {"path", "description", "runs": [...], "groups": [aggregated groups]}}}. A
    runs_dir that is itself one sweep folder is read as a single sweep named after it."""
    names = find_sweeps(runs_dir)
    result = {"runs_dir": runs_dir, "confidence": confidence, "pretrain": {}, "sweeps": {}}
    if not names and any(is_run_dir(os.path.join(runs_dir, c)) for c in os.listdir(runs_dir)):
        folders = {os.path.basename(os.path.normpath(runs_dir)): runs_dir}
    else:
        folders = {n: os.path.join(runs_dir, n) for n in names}
        for child in sorted(os.listdir(runs_dir)):
            if is_run_dir(os.path.join(runs_dir, child)):
                result["pretrain"][child] = load_run(os.path.join(runs_dir, child))
    for name, folder in folders.items():
        if sweeps and name not in sweeps:
            continue
        runs = load_sweep(folder)
        result["sweeps"][name] = {"path": folder, "description": describe_sweep(runs), "runs": runs,
                                  "groups": aggregate_sweep(runs, confidence)}
    return result


def to_json(result):
    return _clean({"runs_dir": result["runs_dir"], "confidence": result["confidence"],
                   "pretrain": {k: pretrain_record(r) for k, r in result["pretrain"].items()},
                   "sweeps": {name: {"path": s["path"], "description": s["description"], "runs": len(s["runs"]),
                                     "groups": [group_record(g) for g in s["groups"]]}
                              for name, s in result["sweeps"].items()}})


def to_markdown(result):
    parts = [f"## Seed-aggregated results: {result['runs_dir']}\n"]
    if result["pretrain"]:
        parts.append("Pretrained starting points: " + "; ".join(
            f"{name}: final eval accuracy {p['final_eval_accuracy']:.4f}, loss {p['final_eval_loss']:.4f} "
            f"at step {p['final_eval_step']}" if p["final_eval_accuracy"] is not None else f"{name}: no eval"
            for name, p in ((n, pretrain_record(r)) for n, r in result["pretrain"].items())) + ".\n")
    for name, s in result["sweeps"].items():
        parts.append(markdown_table(name, s["groups"], s["runs"], result["confidence"]))
    return "\n".join(parts)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", required=True, help="folder with the sweep folders (or one sweep folder)")
    parser.add_argument("--md", help="also write the Markdown tables to this file")
    parser.add_argument("--json", help="write the numbers (with per-seed values) to this JSON file")
    parser.add_argument("--sweep", action="append", help="only this sweep folder (repeatable)")
    parser.add_argument("--confidence", type=float, default=CONFIDENCE, help="interval coverage (default 0.95)")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.runs):
        print(f"aggregate_runs: no such folder: {args.runs}", file=sys.stderr)
        return 2
    if not 0.0 < args.confidence < 1.0:
        print(f"aggregate_runs: --confidence must be in (0, 1), got {args.confidence}", file=sys.stderr)
        return 2
    result = aggregate(args.runs, args.sweep, args.confidence)
    if not result["sweeps"]:
        print(f"aggregate_runs: no sweep folders with run directories under {args.runs}", file=sys.stderr)
        return 1
    text = to_markdown(result)
    print(text)
    for path, content in ((args.md, text), (args.json, None)):
        if not path:
            continue
        if os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            if content is None:
                json.dump(to_json(result), f, indent=1, allow_nan=False)
                f.write("\n")
            else:
                f.write(content)
    return 0


if __name__ == "__main__":
    sys.exit(main())
