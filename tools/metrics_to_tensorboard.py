#!/usr/bin/env python3
"""A run directory's metrics.jsonl (and spikes.jsonl) as TensorBoard event files, written with the
tensorboard package's own writer: `tensorboard --logdir RUN_DIR/tensorboard`.

Why a converter and not a second logger in the binary: metrics.jsonl stays the one record of a run
(what resume, sweeps and plots read), nothing in C++ has to write TFRecords, and converting again
during a run picks up the new rows (the output folder is rewritten each time).

Scalars: train/{loss, lr, grad_norm, tokens_per_s, mfu, peak_memory_bytes, loss_z, grad_norm_z},
eval/{loss, perplexity, accuracy}, spikes/{loss, z}, and a marker per rewind (rewinds.jsonl):
rewinds/{to_step, batches_skipped} at the step that declared the divergence; the x axis is the
optimizer step.

usage: metrics_to_tensorboard.py RUN_DIR [--out DIR]   (DIR defaults to RUN_DIR/tensorboard)
"""
import argparse
import json
import math
import os
import shutil
import sys

TRAIN = ("loss", "lr", "grad_norm", "tokens_per_s", "mfu", "loss_z", "grad_norm_z")
EVAL = ("loss", "perplexity", "accuracy")


def rows(path):
    if not os.path.exists(path):
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            if number == len(lines):
                continue  # a torn last line of a run still writing
            sys.exit("error: %s:%d: not JSON (%s)" % (path, number, e.msg))
    return out


def scalar(writer, tag, value, step):
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        writer.add_scalar(tag, float(value), step=int(step))
        return 1
    return 0


def convert(run_dir, out_dir):
    from tensorboard.summary import Writer  # the tensorboard package's own event writer

    metrics = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(metrics):
        sys.exit("error: %s: no metrics.jsonl (is it a run directory?)" % run_dir)
    shutil.rmtree(out_dir, ignore_errors=True)  # rewritten whole: converting again never duplicates
    os.makedirs(out_dir)
    writer = Writer(out_dir)
    count = 0
    for row in rows(metrics):
        step = row.get("step", 0)
        if row.get("type") == "train":
            for key in TRAIN:
                count += scalar(writer, "train/" + key, row.get(key), step)
            memory = row.get("cuda_allocated_peak_bytes", row.get("peak_rss_bytes"))
            count += scalar(writer, "train/peak_memory_bytes", memory, step)
        elif row.get("type") == "eval":
            for key in EVAL:
                count += scalar(writer, "eval/" + key, row.get(key), step)
    for row in rows(os.path.join(run_dir, "spikes.jsonl")):
        count += scalar(writer, "spikes/loss", row.get("loss"), row.get("step", 0))
        count += scalar(writer, "spikes/z", row.get("z"), row.get("step", 0))
    for row in rows(os.path.join(run_dir, "rewinds.jsonl")):
        count += scalar(writer, "rewinds/to_step", row.get("to_step"), row.get("from_step", 0))
        count += scalar(writer, "rewinds/batches_skipped", row.get("batches_skipped"), row.get("from_step", 0))
    writer.close()
    print("wrote %d scalars to %s (tensorboard --logdir %s)" % (count, out_dir, out_dir))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--out", help="event files folder (default RUN_DIR/tensorboard)")
    args = parser.parse_args(argv)
    convert(args.run_dir, args.out or os.path.join(args.run_dir, "tensorboard"))


if __name__ == "__main__":
    main()
