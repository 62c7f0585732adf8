"""Tests of tools/aggregate_runs.py and the cpu figures of tools/plot_runs.py on a fake runs tree
(no darkformer binary needed; a few seconds).

Builds, in a temporary folder, run directories as `darkformer sweep` writes them (config.yaml with
every kernel's options resolved, metrics.jsonl, summary.json) for the cpu layout (mqar_pretrain,
mqar_kernels, mqar_qkv, mqar_lr_sweep, c4_kernels) and the micro layout, with known per-seed values.
Proves: Student-t quantiles match the table; runs are grouped by config point without the seed,
labelled from the kernel's own options (attention.<kernel>.num_features, attention.darkformer.init)
plus lr when a sweep varies it and any other key that still separates two points; mean and
t-interval match a hand computation (0.5, 0.6, 0.7 -> 0.6 +- 4.3027 * 0.1 / sqrt(3) = 0.2484); one
seed gives n/a; runs not finished are left out and listed; diverged runs are counted; the CLI writes
the same numbers to Markdown and JSON; plot_runs.py writes the cpu PNGs and still the micro ones.
"""

import contextlib
import copy
import io
import json
import math
import os
import subprocess
import sys
import tempfile

import yaml

SOURCE_DIR = os.environ.get("DARKFORMER_SOURCE_DIR") or os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TOOLS = os.path.join(SOURCE_DIR, "tools")
sys.path.insert(0, TOOLS)
import aggregate_runs as agg  # noqa: E402
import testkit  # noqa: E402

failures = []
check = testkit.checker(failures)


def close(a, b, tol=1e-4):
    return a is not None and b is not None and abs(a - b) <= tol


# A resolved config as the trainer writes it: every kernel's section present with its defaults, so
# the label must come from the active kernel's own options.
BASE_CONFIG = {
    "model": {"family": "gemma", "vocab_size": 2048, "hidden_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 64},
    "attention": {"kernel": "exact", "per_layer": {}, "exact": {"explicit_softmax": False},
                  "performer": {"num_features": 256, "projection": "orthogonal", "seed": 0},
                  "darkformer": {"num_features": 256, "projection": "orthogonal", "seed": 0, "rank": 0,
                                 "init": "identity"},
                  "lfk": {"num_features": 256, "projection": "orthogonal", "seed": 0},
                  "random": {"seed": 0}, "constant": {}},
    "data": {"source": "mqar", "seq_len": 128, "batch_size": 64},
    "train": {"steps": 150, "lr": 1.0e-3, "seed": 0, "trainable": ["*"]},
    "eval": {"every": 50, "batches": 8},
    "log": {"dir": "", "every": 50},
}


def write_run(folder, name, kernel="exact", options=None, seed=0, lr=1.0e-3, accuracy=(0.3, 0.4, 0.5),
              loss=None, spikes=0, diverged=False, steps=150, finished=True, trainable=None, train_loss=None):
    """One run dir: eval rows at 50/100/150 with the given accuracies (loss = 2 - accuracy unless
    given), train rows every 10 steps (loss train_loss(step), default 3 - step / 100), summary.json
    when finished."""
    path = os.path.join(folder, name)
    os.makedirs(path)
    config = copy.deepcopy(BASE_CONFIG)
    config["attention"]["kernel"] = kernel
    config["attention"].setdefault(kernel, {}).update(options or {})
    config["train"].update(seed=seed, lr=lr, steps=steps)
    if trainable:
        config["train"]["trainable"] = trainable
    config["log"]["dir"] = path
    with open(os.path.join(path, "config.yaml"), "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    if not finished:
        return path  # a pending run: config only
    losses = loss or [2.0 - a for a in accuracy]
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        for step in range(10, steps + 1, 10):
            value = train_loss(step) if train_loss else 3.0 - step / 100.0
            f.write(json.dumps({"type": "train", "step": step, "loss": value, "lr": lr}) + "\n")
            if step % 50 == 0 and step // 50 <= len(accuracy):
                i = step // 50 - 1
                f.write(json.dumps({"type": "eval", "step": step, "loss": losses[i], "perplexity": 1.0,
                                    "accuracy": accuracy[i], "tokens": 1000}) + "\n")
    summary = {"steps": steps, "tokens_seen": steps * 8192, "final_loss": losses[-1], "min_loss": 1.0,
               "best_eval_accuracy": max(accuracy), "spikes": spikes, "skipped_updates": 0, "diverged": diverged,
               "wall_seconds": 10.0, "mean_tokens_per_s": 800.0, "kernel": kernel}
    with open(os.path.join(path, "summary.json"), "w") as f:
        json.dump(summary, f)
    return path


def build_cpu_tree(root):
    write_run(root, "mqar_pretrain", accuracy=(0.5, 0.9, 0.99))
    k = os.path.join(root, "mqar_kernels")
    finals = {0: 0.5, 1: 0.6, 2: 0.7}
    for seed in range(3):
        write_run(k, f"attention-exact_seed-{seed}", seed=seed, accuracy=(0.9, 0.95, 0.98))
        write_run(k, f"attention-dkw64_seed-{seed}", "darkformer", {"num_features": 64, "init": "whitening"}, seed,
                  accuracy=(0.2, 0.4, finals[seed]), spikes=seed)  # best = final: 0.5, 0.6, 0.7
        write_run(k, f"attention-dki64_seed-{seed}", "darkformer", {"num_features": 64, "init": "identity"}, seed,
                  accuracy=(0.1, 0.2, 0.3))
        write_run(k, f"attention-dkw16_seed-{seed}", "darkformer", {"num_features": 16, "init": "whitening"}, seed,
                  accuracy=(0.1, 0.15, 0.2 + 0.01 * seed))
        write_run(k, f"attention-pf16_seed-{seed}", "performer", {"num_features": 16}, seed,
                  accuracy=(0.05, 0.1, 0.1))
    write_run(k, "attention-pf64_seed-0", "performer", {"num_features": 64}, 0, accuracy=(0.2, 0.3, 0.42))
    write_run(k, "attention-pf64_seed-1", "performer", {"num_features": 64}, 1, finished=False)  # pending
    write_run(k, "attention-lfk256_seed-0", "lfk", {"num_features": 256}, 0, accuracy=(0.1, 0.2, 0.25))
    q = os.path.join(root, "mqar_qkv")
    qkv = ["*q_proj*", "*k_proj*", "*v_proj*", "*.kernel.*"]
    for seed in range(3):
        for rank in (0, 32):  # same label, different rank: the label must say which
            write_run(q, f"dk-rank{rank}_seed-{seed}", "darkformer", {"num_features": 64, "init": "whitening",
                                                                     "rank": rank}, seed,
                      accuracy=(0.3, 0.4, 0.5 + rank / 100.0), trainable=qkv)
    lr_dir = os.path.join(root, "mqar_lr_sweep")
    for lr in (1.0e-3, 1.0e-1):
        for seed in range(3):
            write_run(lr_dir, f"pf_lr-{lr}_seed-{seed}", "performer", {"num_features": 64}, seed, lr,
                      accuracy=(0.3, 0.4, 0.5 if lr < 0.01 else 0.1), spikes=0 if lr < 0.01 else 2 + seed,
                      diverged=lr > 0.01 and seed == 2)
            write_run(lr_dir, f"dk_lr-{lr}_seed-{seed}", "darkformer", {"num_features": 64, "init": "whitening"},
                      seed, lr, accuracy=(0.3, 0.5, 0.6), spikes=0)
    c4 = os.path.join(root, "c4_kernels")
    for seed in range(3):
        write_run(c4, f"exact_seed-{seed}", seed=seed, accuracy=(0.2, 0.25, 0.3), steps=100)
        write_run(c4, f"lfk_seed-{seed}", "lfk", {"num_features": 64}, seed, accuracy=(0.2, 0.22, 0.24), steps=100)


def build_micro_tree(root):
    write_run(root, "pretrain", accuracy=(0.1, 0.11, 0.12))
    for kernel in ("exact", "darkformer", "performer", "lfk", "random", "constant"):  # the micro sweep's kernels
        write_run(os.path.join(root, "kernels"), f"kernel-{kernel}", kernel, accuracy=(0.1, 0.105, 0.11))
    for kernel in ("exact", "performer", "darkformer"):
        write_run(os.path.join(root, "qkv"), f"kernel-{kernel}", kernel, accuracy=(0.1, 0.105, 0.11))
    for kernel in ("performer", "darkformer"):
        for lr in (1e-4, 1e-3, 1e-1):
            write_run(os.path.join(root, "lr_sweep"), f"kernel-{kernel}_lr-{lr}", kernel, lr=lr,
                      accuracy=(0.1, 0.1, 0.09), spikes=1 if lr > 0.01 else 0)


def test_seed_kernel_labels(root):
    """The other seeds' kernels are labelled with their m, flexformer with its variant (default stationary)."""
    folder = os.path.join(root, "seed_kernels")
    for kernel, options in (("gerf", {"num_features": 16, "a": "optimal"}), ("saderf", {"num_features": 64}),
                            ("trig", {"num_features": 64}), ("slay", {"num_features": 16}),
                            ("flexformer", {"num_features": 64}),
                            ("flexformer", {"num_features": 64, "variant": "nonstationary"})):
        write_run(folder, f"{kernel}-{options.get('variant', '')}", kernel, options)
    labels = [g["label"] for g in agg.group_runs(agg.load_sweep(folder))]
    check(labels == ["gerf m=16", "saderf m=64", "trig m=64", "slay m=16", "flexformer m=64 nonstationary",
                     "flexformer m=64 stationary"], f"seed kernels labelled with m and form ({labels})")


def groups_by_label(result, sweep):
    return {g["label"]: g for g in result["sweeps"][sweep]["groups"]}


def test_t_quantiles():
    table = {1: 12.7062, 2: 4.3027, 4: 2.7764, 10: 2.2281, 30: 2.0423}
    for dof, expected in table.items():
        check(close(agg.t_quantile(0.975, dof), expected), f"t_0.975 with {dof} dof = {expected}")
    st = agg.interval([0.5, 0.6, 0.7])
    half = 4.302653 * 0.1 / math.sqrt(3)
    check(st["n"] == 3 and close(st["mean"], 0.6, 1e-12) and close(st["std"], 0.1, 1e-12), "mean 0.6, s 0.1")
    check(close(st["half_width"], 0.2484) and close(st["half_width"], half, 1e-6), "half-width 0.2484")
    check(close(st["low"], 0.6 - half, 1e-6) and close(st["high"], 0.6 + half, 1e-6), "interval 0.6 -+ 0.2484")
    one = agg.interval([0.42])
    check(one["n"] == 1 and one["mean"] == 0.42 and one["half_width"] is None and one["low"] is None,
          "n = 1: mean, no interval")
    check(agg.interval([])["mean"] is None, "n = 0: no mean")
    check(agg.interval([1.0, float("nan"), None, 3.0])["n"] == 2, "non-finite values left out")


def test_aggregate(root):
    result = agg.aggregate(root)
    check(list(result["sweeps"]) == ["mqar_kernels", "mqar_qkv", "mqar_lr_sweep", "c4_kernels"],
          f"sweeps found in order: {list(result['sweeps'])}")
    check(list(result["pretrain"]) == ["mqar_pretrain"], "mqar_pretrain read as a pretrain run")

    kernels = groups_by_label(result, "mqar_kernels")
    expected = ["exact", "darkformer m=16 whitening", "darkformer m=64 identity", "darkformer m=64 whitening",
                "performer m=16", "performer m=64", "lfk m=256"]
    check([g["label"] for g in result["sweeps"]["mqar_kernels"]["groups"]] == expected,
          f"mqar_kernels labels from each kernel's own options, sorted: "
          f"{[g['label'] for g in result['sweeps']['mqar_kernels']['groups']]}")
    dkw = kernels["darkformer m=64 whitening"]
    acc = dkw["stats"]["final_eval_accuracy"]
    check(dkw["n"] == 3 and [r["seed"] for r in dkw["done"]] == [0, 1, 2], "three seeds in one group")
    check(close(acc["mean"], 0.6, 1e-12) and close(acc["half_width"], 0.2484), "final accuracy 0.6 +- 0.2484")
    check(acc["values"] == [0.5, 0.6, 0.7], "per-seed final accuracies kept in seed order")
    check(close(dkw["stats"]["final_eval_loss"]["mean"], 1.4, 1e-12), "final eval loss = last eval row's loss")
    check(close(dkw["stats"]["best_eval_accuracy"]["mean"], 0.6, 1e-12), "best eval accuracy from summary.json")
    spikes = dkw["stats"]["spikes"]
    check(close(spikes["mean"], 1.0, 1e-12) and close(spikes["half_width"], 4.302653 / math.sqrt(3), 1e-5),
          "spikes 0, 1, 2 -> 1 +- 2.484")
    check(dkw["stats"]["diverged"]["count"] == 0, "no divergence counted")
    check(dkw["num_features"] == 64 and dkw["init"] == "whitening", "m and init read from attention.darkformer")
    pf64 = kernels["performer m=64"]
    st = pf64["stats"]["final_eval_accuracy"]
    check(pf64["n"] == 1 and st["mean"] == 0.42 and st["half_width"] is None, "one finished seed: n = 1, no interval")
    check([r["name"] for r in pf64["runs"] if agg.run_status(r) == "pending"] == ["attention-pf64_seed-1"],
          "the pending seed is in the group but left out of the statistics")
    check(kernels["exact"]["num_features"] is None and kernels["exact"]["init"] is None, "exact has no m, no init")

    qkv = [g["label"] for g in result["sweeps"]["mqar_qkv"]["groups"]]
    check(qkv == ["darkformer m=64 whitening rank=0", "darkformer m=64 whitening rank=32"],
          f"points with the same label told apart by the key that differs: {qkv}")

    lr = groups_by_label(result, "mqar_lr_sweep")
    check(sorted(lr) == sorted(["performer m=64 lr=1e-3", "performer m=64 lr=1e-1", "darkformer m=64 whitening lr=1e-3",
                                "darkformer m=64 whitening lr=1e-1"]), f"lr in the labels of an lr sweep: {sorted(lr)}")
    hot = lr["performer m=64 lr=1e-1"]["stats"]
    check(hot["diverged"]["count"] == 1 and close(hot["diverged"]["mean"], 1 / 3, 1e-12), "1 of 3 seeds diverged")
    check(close(hot["spikes"]["mean"], 3.0, 1e-12), "spikes 2, 3, 4 -> mean 3")

    c4 = groups_by_label(result, "c4_kernels")
    check(sorted(c4) == ["exact", "lfk m=64"] and c4["lfk m=64"]["n"] == 3, "c4_kernels: exact and lfk m=64, n = 3")

    steps, mean, low, high, n = agg.curve(dkw["done"])
    half = 4.302653 * 0.1 / math.sqrt(3)
    check(list(steps) == [50, 100, 150] and list(n) == [3, 3, 3], "accuracy curve at the eval steps")
    check(close(mean[2], 0.6, 1e-12) and close(high[2] - mean[2], half, 1e-6) and close(low[0], 0.2, 1e-12),
          "curve band: t-interval per step, zero width where seeds agree")
    return result


def test_cli(root, out):
    md, js = os.path.join(out, "tables.md"), os.path.join(out, "agg.json")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = agg.main(["--runs", root, "--md", md, "--json", js])
    check(code == 0, "aggregate_runs.py exits 0")
    text = open(md).read()
    check(buf.getvalue() == text + "\n", "the Markdown file has what stdout showed")
    check("| darkformer m=64 whitening | 3 | 0.6000 ± 0.2484 | 1.4000 ± 0.2484 | 0.6000 ± 0.2484 | "
          "1.00 ± 2.48 | 0.00 ± 0.00 | 0.00 ± 0.00 | 0/3 |" in text, "Markdown row: mean ± t half-width (spikes, skipped, rewinds)")
    check("| performer m=64 | 1 | 0.4200 ± n/a |" in text, "Markdown row: n = 1 shows n/a")
    check("attention-pf64_seed-1 (pending)" in text, "Markdown lists the run left out")
    check("| performer m=64 lr=1e-1 | 3 |" in text and "| 1/3 |" in text, "Markdown: lr label and diverged 1/3")
    data = json.load(open(js))
    groups = {g["label"]: g for g in data["sweeps"]["mqar_kernels"]["groups"]}
    g = groups["darkformer m=64 whitening"]
    m = g["metrics"]["final_eval_accuracy"]
    check(g["n"] == 3 and g["seeds"] == [0, 1, 2] and close(m["mean"], 0.6, 1e-12) and close(m["half_width"], 0.2484),
          "JSON: the same numbers")
    check(groups["performer m=64"]["metrics"]["final_eval_accuracy"]["half_width"] is None
          and groups["performer m=64"]["not_done"] == {"attention-pf64_seed-1": "pending"},
          "JSON: n = 1 interval null, pending run listed")
    check(close(data["pretrain"]["mqar_pretrain"]["final_eval_accuracy"], 0.99, 1e-12), "JSON: pretrain final accuracy")


def png_ok(path):
    if not os.path.exists(path) or os.path.getsize(path) < 1000:
        return False
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plots(root, out, expected, subprocess_cli):
    """plot_runs.py on a tree: as a command (the CLI) or in this process (faster: one matplotlib import)."""
    argv = ["--runs", root, "--out", out, "--label", "test"]
    if subprocess_cli:
        r = subprocess.run([sys.executable, os.path.join(TOOLS, "plot_runs.py"), *argv], capture_output=True,
                           text=True, timeout=120, env=dict(os.environ, MPLBACKEND="Agg"))
        code, stdout, stderr = r.returncode, r.stdout, r.stderr
    else:
        import plot_runs
        buf, err, saved = io.StringIO(), io.StringIO(), sys.argv
        sys.argv = ["plot_runs.py", *argv]
        try:
            with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
                code = plot_runs.main()
        finally:
            sys.argv = saved
        stdout, stderr = buf.getvalue(), err.getvalue()
    check(code == 0, f"plot_runs.py on {os.path.basename(root)} exits 0" + ("" if code == 0 else ":\n" + stderr[-3000:]))
    for name in expected:
        check(png_ok(os.path.join(out, name)), f"{name} written")
    printed = set(os.path.basename(p) for p in stdout.split())
    check(printed == set(expected), f"plot_runs.py lists exactly the PNGs it wrote: {sorted(printed)}")


def test_statuses_from_the_binary(root):
    """Each status as the binary's rule gives it (`inspect --run-status`): the tools keep no copy."""
    folder = os.path.join(root, "statuses")
    os.makedirs(folder)
    paths = {status: write_run(folder, status, finished=status in ("finished", "diverged"),
                               diverged=status == "diverged") for status in ("finished", "diverged", "pending")}
    for status in ("failed", "partial"):  # started, no summary: the sweep's recorded exit code decides
        paths[status] = write_run(folder, status, finished=False)
        with open(os.path.join(paths[status], "metrics.jsonl"), "w") as f:
            f.write(json.dumps({"type": "train", "step": 1, "loss": 3.0}) + "\n")
    with open(os.path.join(folder, "sweep_state.yaml"), "w") as f:
        f.write("runs:\n  failed: {status: failed, exit_code: 2, attempts: 1}\n"
                "  partial: {status: partial, exit_code: 130, attempts: 1}\n")
    for status, path in paths.items():
        got = agg.run_status({"path": path, "name": status})
        check(got == status, f"run '{status}' is classified {got}")


def main():
    test_t_quantiles()
    with tempfile.TemporaryDirectory() as tmp:
        cpu, micro = os.path.join(tmp, "cpu"), os.path.join(tmp, "micro")
        build_cpu_tree(cpu)
        build_micro_tree(micro)
        test_aggregate(cpu)
        test_seed_kernel_labels(tmp)
        test_statuses_from_the_binary(tmp)
        test_cli(cpu, os.path.join(tmp, "out"))
        test_plots(cpu, os.path.join(tmp, "plots-cpu"),
                   ["mqar_pretrain_accuracy.png", "mqar_kernels_accuracy.png", "mqar_qkv_accuracy.png",
                    "mqar_lr_sweep.png", "mqar_lr_sweep_loss_spread.png", "c4_kernels_accuracy.png"], subprocess_cli=True)
        test_plots(micro, os.path.join(tmp, "plots-micro"),
                   ["pretrain_accuracy.png", "finetune_accuracy.png", "finetune_accuracy_logx.png",
                    "qkv_accuracy_logx.png", "lr_loss_logx.png", "lr_spikes.png"], subprocess_cli=False)
        micro_groups = groups_by_label(agg.aggregate(micro), "kernels")
        check(sorted(micro_groups) == sorted(["exact", "darkformer m=256 identity", "performer m=256", "lfk m=256",
                                              "random", "constant"]) and all(g["n"] == 1 for g in micro_groups.values()),
              "micro layout (one seed, attention.kernel axis) groups too")
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
