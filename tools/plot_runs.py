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
For the cpu layout (<runs>/mqar_pretrain, mqar_kernels, mqar_qkv, mqar_lr_sweep, c4_pretrain,
c4_kernels; several seeds per point) runs are grouped and aggregated over seeds by
tools/aggregate_runs.py (one group = one config point without its seed), and it writes:
  mqar_pretrain_accuracy.png, c4_pretrain_accuracy.png   accuracy vs step of the exact pretraining
  mqar_kernels_accuracy.png  fig. 2: eval accuracy vs step per group, one panel per feature count m
  mqar_qkv_accuracy.png      fig. 4: the same, only q/k/v (and kernel parameters) trained
  c4_kernels_accuracy.png    fig. 2 on C4
  mqar_lr_sweep.png          fig. 5: final eval accuracy and loss spikes vs peak lr per kernel
  mqar_lr_sweep_loss_spread.png  fig. 5's shading: train loss, mean and std across the lrs per kernel
  (any other mqar_*/c4_* sweep gets the same figures: an lr axis the last two, else accuracy bands)
where each line is the mean over seeds and the band (error bars) the 95 % Student-t interval.
Usage: plot_runs.py --runs runs/experiments/micro --out docs/img/micro --label micro
       plot_runs.py --runs runs/experiments/cpu --out docs/img/cpu --label cpu
"""
import argparse
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from aggregate_runs import CONFIDENCE, aggregate, base_label, curve, kernel_rank, load_run, load_sweep  # noqa: E402,E501

# The paper's colours where it names them (fig. 2): DARKFormer green, Performer orange, LFK blue,
# random yellow, constant lime; exact attention black.
COLORS = {"exact": "black", "darkformer": "tab:green", "performer": "tab:orange", "lfk": "tab:blue",
          "random": "gold", "constant": "limegreen", "gerf": "tab:red", "saderf": "tab:purple", "trig": "tab:brown",
          "slay": "tab:pink", "flexformer": "tab:gray", "aderf": "tab:olive", "sderf": "tab:cyan"}


def kernel_key(run):
    return kernel_rank(run["kernel"])


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
    for kernel in sorted({r["kernel"] for r in runs}, key=kernel_rank):
        group = [r for r in runs if r["kernel"] == kernel]
        steps = sorted({row["step"] for r in group for row in r["train"]})
        if not steps:
            continue
        index = {s: i for i, s in enumerate(steps)}
        group_lrs = sorted({r["lr"] for r in group})
        # One curve per learning rate (the mean over its seeds), then mean and std across the lrs.
        losses = np.full((len(group_lrs), len(steps)), np.nan)
        for j, lr in enumerate(group_lrs):
            per_seed = np.full((sum(r["lr"] == lr for r in group), len(steps)), np.nan)
            for k, r in enumerate(r for r in group if r["lr"] == lr):
                for row in r["train"]:
                    loss = row.get("loss")
                    if loss is not None and math.isfinite(loss):
                        per_seed[k, index[row["step"]]] = loss
            with np.errstate(all="ignore"):
                losses[j] = np.nanmean(per_seed, axis=0)
        with np.errstate(all="ignore"):
            mean = np.nanmean(losses, axis=0)
            std = np.nanstd(losses, axis=0)
        color = COLORS.get(kernel)
        seeds = len(group) // max(len(group_lrs), 1)
        ax.plot(steps, mean, color=color, label=f"{kernel}: mean over {len(group_lrs)} learning rates"
                + (f" (each the mean of {seeds} seeds)" if seeds > 1 else ""))
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
    kernels = sorted({r["kernel"] for r in runs}, key=kernel_rank)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    width = 0.8 / max(1, len(kernels))
    x = np.arange(len(lrs))
    top = 0
    for i, kernel in enumerate(kernels):
        spikes, skipped, diverged, rewinds = [], [], [], []
        for lr in lrs:
            match = [r for r in runs if r["kernel"] == kernel and r["lr"] == lr]
            s = match[0]["summary"] if match and match[0]["summary"] else {}
            spikes.append(s.get("spikes", 0) or 0)
            skipped.append(s.get("skipped_updates", 0) or 0)
            diverged.append(bool(s.get("diverged", False)))
            rewinds.append(s.get("rewinds", 0) or 0)
        pos = x + (i - (len(kernels) - 1) / 2) * width
        ax.bar(pos, spikes, width, color=COLORS.get(kernel), label=f"{kernel}: loss spikes")
        top = max(top, max(spikes))
        for p, n, n_skip, div, n_rw in zip(pos, spikes, skipped, diverged, rewinds):
            note = str(n) + (" skip %d" % n_skip if n_skip else "") + (" rw %d" % n_rw if n_rw else "") + \
                (" div" if div else "")
            ax.annotate(note, (p, n), textcoords="offset points", xytext=(0, 2), ha="center", fontsize=7,
                        rotation=90 if len(note) > 2 else 0, va="bottom")
    ax.set_ylim(0, top * 1.35 + 1.5)
    ax.set_xticks(x)
    ax.set_xticklabels([f"{lr:g}" for lr in lrs])
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("loss spikes flagged (count)")
    ax.set_title(f"{title}\n'skip N': non-finite or skipped updates; 'rw N': rewinds; 'div': run diverged", fontsize=10)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


# ---- cpu protocol: seed-aggregated figures (groups and intervals from aggregate_runs) -----------

CPU_PREFIXES = ("mqar_", "c4_")
CPU_TITLES = {
    "mqar_kernels": "MQAR: full finetuning from the exact model, per kernel (fig. 2)",
    "mqar_qkv": "MQAR: finetuning only q/k/v (+ kernel parameters) (fig. 4)",
    "mqar_lr_sweep": "MQAR: finetuning across learning rates (fig. 5)",
    "c4_kernels": "C4: full finetuning from the exact model, per kernel (fig. 2)",
    "mqar_seed_kernels": "MQAR: full finetuning, the other seeds' kernels (fig. 2)",
    "mqar_five_seeds": "MQAR: full finetuning, five seeds (fig. 2-3)",
    "mqar_lr_stability": "MQAR: finetuning across learning rates, five seeds (fig. 5)",
}
# darkformer's init by line style (other kernels solid).
INIT_STYLES = {None: "-", "whitening": "-", "identity": "--", "scaled_identity": ":"}
MARKERS = ["o", "s", "^", "D", "v"]


def group_style(group):
    return COLORS.get(group["kernel"]), INIT_STYLES.get(group["init"], "-.")


def plot_accuracy_bands(sweep, out, title, confidence=CONFIDENCE):
    """Eval accuracy vs step, one line per group (mean over seeds) with its CI band; one panel per
    feature count m when the sweep has several (kernels without m, e.g. exact, are in every panel)."""
    groups = [g for g in sweep["groups"] if g["done"] and any(r["eval"] for r in g["done"])]
    if not groups:
        return None
    ms = sorted({g["num_features"] for g in groups if g["num_features"] is not None})
    panels = ms if len(ms) > 1 else [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.5 + 5.2 * len(panels), 5.0), sharey=True, squeeze=False)
    for ax, m in zip(axes[0], panels):
        seen = {}  # groups drawn in the same colour and line style get different markers
        for g in groups:
            if m is not None and g["num_features"] not in (None, m):
                continue
            steps, mean, low, high, _ = curve(g["done"], "accuracy", "eval", confidence)
            color, style = group_style(g)
            marker = MARKERS[seen.get((color, style), 0) % len(MARKERS)]
            seen[(color, style)] = seen.get((color, style), 0) + 1
            ax.plot(steps, mean, color=color, linestyle=style, marker=marker, ms=4, label=f"{g['label']} (n={g['n']})")
            ax.fill_between(steps, low, high, color=color, alpha=0.15, linewidth=0)
        if m is not None:
            ax.set_title(f"m = {m} random features", fontsize=10)
        ax.set_xlabel("finetuning step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    axes[0][0].set_ylabel("validation accuracy")
    fig.suptitle(f"{title}\n{describe(groups[0]['done'][0])}\nline: mean over seeds, band: "
                 f"{confidence * 100:g} % Student-t interval across seeds", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_lr_sweep(sweep, out, title, confidence=CONFIDENCE):
    """Final eval accuracy and loss-spike count vs peak lr, one line per point without its lr
    (e.g. performer m=64), mean over seeds with CI error bars; diverged runs annotated."""
    groups = [g for g in sweep["groups"] if g["done"]]
    if not groups:
        return None
    series = {}
    for g in groups:
        series.setdefault(base_label(g["done"][0], False), []).append(g)
    fig, (ax_acc, ax_spk) = plt.subplots(1, 2, figsize=(12, 4.8))
    for i, (label, members) in enumerate(series.items()):
        members = sorted(members, key=lambda g: g["lr"])
        shift = 1.07 ** (i - (len(series) - 1) / 2)  # side by side, so error bars do not overlap
        lrs = np.array([g["lr"] for g in members]) * shift
        color, style = group_style(members[0])
        n = "/".join(sorted({str(g["n"]) for g in members}))
        for ax, metric in ((ax_acc, "final_eval_accuracy"), (ax_spk, "spikes")):
            st = [g["stats"][metric] for g in members]
            mean = np.array([s["mean"] if s["mean"] is not None else np.nan for s in st], dtype=float)
            err = np.array([s["half_width"] or 0.0 for s in st], dtype=float)
            ax.errorbar(lrs, mean, yerr=err, color=color, linestyle=style, marker="o", ms=4, capsize=3,
                        label=f"{label} (n={n})")
        for x, g in zip(lrs, members):
            d = g["stats"]["diverged"]
            if d["count"]:
                y = g["stats"]["spikes"]["mean"] or 0.0
                ax_spk.annotate(f"div {d['count']}/{d['n']}", (x, y), textcoords="offset points", xytext=(6, 4),
                                ha="left", fontsize=7, color=color)
    for ax, ylabel in ((ax_acc, "final validation accuracy"), (ax_spk, "loss spikes flagged per run")):
        ax.set_xscale("log")
        ax.set_xlabel("peak learning rate")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    ax_spk.set_ylim(bottom=min(0.0, ax_spk.get_ylim()[0]))
    fig.suptitle(f"{title}\nmean over seeds, error bars: {confidence * 100:g} % t-interval (none for n = 1); "
                 "'div k/n': k of n seeds diverged", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_cpu(runs_dir, out_dir, tag, confidence=CONFIDENCE):
    """The cpu layout's figures: <task>_pretrain accuracy, accuracy bands per sweep, the lr sweep."""
    result = aggregate(runs_dir, confidence=confidence)
    written = []
    for name, run in result["pretrain"].items():
        if name.startswith(CPU_PREFIXES):
            task = name.split("_")[0].upper()
            written.append(plot_accuracy([run], os.path.join(out_dir, f"{name}_accuracy.png"),
                                         f"{task}: pretraining with exact attention{tag}", False))
    for name, sweep in result["sweeps"].items():
        if not name.startswith(CPU_PREFIXES):
            continue
        title = CPU_TITLES.get(name, name) + tag
        if len({g["lr"] for g in sweep["groups"]}) > 1:
            written.append(plot_lr_sweep(sweep, os.path.join(out_dir, f"{name}.png"), title, confidence))
            runs = [r for g in sweep["groups"] for r in g["done"]]  # fig. 5's shading: the spread across lrs
            written.append(plot_lr_loss(runs, os.path.join(out_dir, f"{name}_loss_spread.png"), title))
        else:
            written.append(plot_accuracy_bands(sweep, os.path.join(out_dir, f"{name}_accuracy.png"), title,
                                               confidence))
    return [w for w in written if w]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", required=True, help="folder with pretrain/, kernels/, qkv/, lr_sweep/ (micro, "
                        "gpu) or mqar_*/ and c4_*/ (cpu)")
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
    if os.path.isdir(args.runs) and any(n.startswith(CPU_PREFIXES) for n in os.listdir(args.runs)):
        written += plot_cpu(args.runs, args.out, tag)
    if not written:
        print(f"no run directories under {args.runs}", file=sys.stderr)
        return 1
    for w in written:
        print(w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
