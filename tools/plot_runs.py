#!/usr/bin/env python3
"""Plots like the DARKFormer paper's figures 2-5 from darkformer run directories.

Reads <runs>/{pretrain,kernels,qkv,lr_sweep}/ as written by tools/run_experiments.sh (each run dir
holds config.yaml, metrics.jsonl, summary.json) and writes PNGs to --out:
  pretrain_accuracy.png      next-token accuracy vs step, exact-attention pretraining
  finetune_accuracy.png      fig. 2 (bottom): accuracy vs step per kernel, full finetuning
  finetune_accuracy_logx.png fig. 3: the same on a log step axis
  qkv_accuracy_logx.png      fig. 4: accuracy vs step, only q/k/v (and kernel parameters) trained
  lr_loss_logx.png           fig. 5: training loss mean and spread across learning rates per kernel
  lr_spikes.png              loss spikes (and skipped updates) per learning rate per kernel
Usage: plot_runs.py --runs runs/experiments/micro --out docs/img/micro --label micro
"""
import argparse
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import yaml  # noqa: E402

# The paper's colours where it names them (fig. 2): DARKFormer green, Performer orange, LFK blue,
# random yellow, constant lime; exact attention black.
COLORS = {"exact": "black", "darkformer": "tab:green", "performer": "tab:orange", "lfk": "tab:blue",
          "random": "gold", "constant": "limegreen"}
KERNEL_ORDER = ["exact", "darkformer", "performer", "lfk", "random", "constant"]


def load_run(path):
    """A run dir as a dict: config, train rows, eval rows, summary (None when absent)."""
    with open(os.path.join(path, "config.yaml")) as f:
        config = yaml.safe_load(f)
    train, evals = [], []
    metrics = os.path.join(path, "metrics.jsonl")
    if os.path.exists(metrics):
        with open(metrics) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                row = json.loads(line)
                (evals if row.get("type") == "eval" else train).append(row)
    summary = None
    if os.path.exists(os.path.join(path, "summary.json")):
        with open(os.path.join(path, "summary.json")) as f:
            summary = json.load(f)
    # A resumed run appends to metrics.jsonl: keep the last row per step.
    train = list({r["step"]: r for r in train}.values())
    evals = list({r["step"]: r for r in evals}.values())
    return {"path": path, "name": os.path.basename(path), "config": config, "train": train, "eval": evals,
            "summary": summary, "kernel": config.get("attention", {}).get("kernel", "exact"),
            "lr": float(config.get("train", {}).get("lr", float("nan")))}


def load_sweep(folder):
    if not os.path.isdir(folder):
        return []
    runs = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if os.path.exists(os.path.join(path, "config.yaml")):
            runs.append(load_run(path))
    return runs


def kernel_key(run):
    return KERNEL_ORDER.index(run["kernel"]) if run["kernel"] in KERNEL_ORDER else len(KERNEL_ORDER)


def describe(run):
    c = run["config"]
    m, d, t = c["model"], c["data"], c["train"]
    return (f"{m['num_hidden_layers']} layers, hidden {m['hidden_size']}, seq {d['seq_len']} x batch "
            f"{d['batch_size']}, lr {t['lr']:g}, {t['steps']} steps")


def plot_accuracy(runs, out, title, logx):
    if not runs:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in sorted(runs, key=kernel_key):
        steps = [r["step"] for r in run["eval"]]
        acc = [r["accuracy"] for r in run["eval"]]
        if steps:
            ax.plot(steps, acc, marker="o", ms=3, color=COLORS.get(run["kernel"]), label=run["kernel"])
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel("training step" + (" (log scale)" if logx else ""))
    ax.set_ylabel("next-token accuracy (validation)")
    ax.set_title(f"{title}\n{describe(runs[0])}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(title="attention kernel", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_lr_loss(runs, out, title):
    if not runs:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    lrs = sorted({r["lr"] for r in runs})
    for kernel in sorted({r["kernel"] for r in runs}, key=lambda k: KERNEL_ORDER.index(k) if k in KERNEL_ORDER else 99):
        group = [r for r in runs if r["kernel"] == kernel]
        steps = sorted({row["step"] for r in group for row in r["train"]})
        if not steps:
            continue
        index = {s: i for i, s in enumerate(steps)}
        losses = np.full((len(group), len(steps)), np.nan)
        for j, r in enumerate(group):
            for row in r["train"]:
                loss = row.get("loss")
                if loss is not None and math.isfinite(loss):
                    losses[j, index[row["step"]]] = loss
        with np.errstate(all="ignore"):
            mean = np.nanmean(losses, axis=0)
            std = np.nanstd(losses, axis=0)
        color = COLORS.get(kernel)
        ax.plot(steps, mean, color=color, label=f"{kernel}: mean over {len(group)} learning rates")
        ax.fill_between(steps, mean - std, mean + std, color=color, alpha=0.25, linewidth=0)
    ax.set_xscale("log")
    ax.set_xlabel("training step (log scale)")
    ax.set_ylabel("training loss (mean ± std across learning rates)")
    ax.set_title(f"{title}\nlearning rates {', '.join(f'{lr:g}' for lr in lrs)}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_spikes(runs, out, title):
    if not runs:
        return None
    lrs = sorted({r["lr"] for r in runs})
    kernels = sorted({r["kernel"] for r in runs}, key=lambda k: KERNEL_ORDER.index(k) if k in KERNEL_ORDER else 99)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    width = 0.8 / max(1, len(kernels))
    x = np.arange(len(lrs))
    top = 0
    for i, kernel in enumerate(kernels):
        spikes, skipped, diverged = [], [], []
        for lr in lrs:
            match = [r for r in runs if r["kernel"] == kernel and r["lr"] == lr]
            s = match[0]["summary"] if match and match[0]["summary"] else {}
            spikes.append(s.get("spikes", 0) or 0)
            skipped.append(s.get("skipped_updates", 0) or 0)
            diverged.append(bool(s.get("diverged", False)))
        pos = x + (i - (len(kernels) - 1) / 2) * width
        ax.bar(pos, spikes, width, color=COLORS.get(kernel), label=f"{kernel}: loss spikes")
        top = max(top, max(spikes))
        for p, n, n_skip, div in zip(pos, spikes, skipped, diverged):
            note = str(n) + (" skip %d" % n_skip if n_skip else "") + (" div" if div else "")
            ax.annotate(note, (p, n), textcoords="offset points", xytext=(0, 2), ha="center", fontsize=7,
                        rotation=90 if len(note) > 2 else 0, va="bottom")
    ax.set_ylim(0, top * 1.35 + 1.5)
    ax.set_xticks(x)
    ax.set_xticklabels([f"{lr:g}" for lr in lrs])
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("loss spikes flagged (count)")
    ax.set_title(f"{title}\n'skip N': non-finite or skipped updates; 'div': run diverged", fontsize=10)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", required=True, help="folder with pretrain/, kernels/, qkv/, lr_sweep/")
    parser.add_argument("--out", required=True, help="folder for the PNGs")
    parser.add_argument("--label", default="", help="scale label for titles, e.g. micro or gpu")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    tag = f" [{args.label}]" if args.label else ""
    pretrain = [load_run(os.path.join(args.runs, "pretrain"))] if os.path.exists(
        os.path.join(args.runs, "pretrain", "config.yaml")) else []
    kernels = load_sweep(os.path.join(args.runs, "kernels"))
    qkv = load_sweep(os.path.join(args.runs, "qkv"))
    lr_sweep = load_sweep(os.path.join(args.runs, "lr_sweep"))
    o = lambda name: os.path.join(args.out, name)  # noqa: E731
    written = [
        plot_accuracy(pretrain, o("pretrain_accuracy.png"), f"Pretraining with exact attention{tag}", False),
        plot_accuracy(kernels, o("finetune_accuracy.png"), f"Full finetuning from the exact model, per kernel{tag}", False),
        plot_accuracy(kernels, o("finetune_accuracy_logx.png"), f"Full finetuning from the exact model, per kernel{tag}", True),
        plot_accuracy(qkv, o("qkv_accuracy_logx.png"), f"Finetuning only q/k/v (+ kernel parameters){tag}", True),
        plot_lr_loss(lr_sweep, o("lr_loss_logx.png"), f"Finetuning loss across learning rates{tag}"),
        plot_spikes(lr_sweep, o("lr_spikes.png"), f"Loss spikes per learning rate{tag}"),
    ]
    written = [w for w in written if w]
    if not written:
        print(f"no run directories under {args.runs}", file=sys.stderr)
        return 1
    for w in written:
        print(w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
