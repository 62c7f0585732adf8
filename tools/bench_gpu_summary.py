"""One training-step row of tools/bench_gpu.sh: tokens/s (median of the steps after the first,
which pays one-off costs), MFU and peak device memory, printed and appended as a JSON line.

Model FLOPs per token are the trainer's own (metrics.jsonl's flops_per_token, from
src/train/model_flops.cpp: matmul weights forward and backward, trainable weights' gradients and
the attention kernel's FLOPs; recomputation from checkpointing not counted), so the MFU here and the
trainer's agree.

On CUDA the row also holds the caching allocator's peak of allocated bytes over the steps (the
trainer's metrics) beside PREDICTED_BYTES, `inspect --memory`'s predicted peak for the same config.

usage: bench_gpu_summary.py METRICS_JSONL RUN_CONFIG PEAK_BYTES PEAK_TFLOPS DEVICE OUT_JSONL [PREDICTED_BYTES]
"""
import json
import statistics
import sys

import yaml


def main():
    metrics, config_path, peak_bytes, peak_tflops, device, out = sys.argv[1:7]
    predicted = int(sys.argv[7]) if len(sys.argv) > 7 and sys.argv[7] else None
    config = yaml.safe_load(open(config_path))
    rows = [json.loads(line) for line in open(metrics) if '"train"' in line]
    if not rows:
        sys.exit("no training steps in %s" % metrics)
    later = [r["step_ms"] for r in rows[1:]] or [rows[0]["step_ms"]]
    step_ms = statistics.median(later)
    tokens = config["data"]["seq_len"] * config["data"]["batch_size"]
    tokens_per_s = tokens / (step_ms / 1000)
    flops = rows[0]["flops_per_token"] * tokens_per_s
    mfu = flops / (float(peak_tflops) * 1e12)
    row = {"device": device, "kernel": config["attention"]["kernel"], "batch": config["data"]["batch_size"],
           "seq_len": config["data"]["seq_len"], "tokens": tokens, "steps": len(rows), "step_ms_median": step_ms,
           "tokens_per_s": tokens_per_s, "model_tflops": flops / 1e12, "mfu": mfu,
           "peak_tflops": float(peak_tflops), "peak_memory_gib": int(peak_bytes) / 2**30,
           "loss_first": rows[0]["loss"], "loss_last": rows[-1]["loss"]}
    kernel_options = config["attention"].get(row["kernel"]) or {}
    if "op" in kernel_options:
        row["op"] = kernel_options["op"]
    allocated = [r["cuda_allocated_peak_bytes"] for r in rows if "cuda_allocated_peak_bytes" in r]
    if allocated:
        row["allocator_peak_gib"] = max(allocated) / 2**30
    if predicted is not None:
        row["predicted_peak_gib"] = predicted / 2**30
        if allocated:
            row["predicted_over_allocator"] = predicted / max(allocated)
    print("[bench_gpu] %s step at %d x %d tokens on %s: %.0f ms (median of steps 2+), %.0f tokens/s, %.2f model TFLOP/s, "
          "MFU %.1f%% of %.0f TFLOP/s, peak memory %.2f GiB" % (
              row["kernel"], row["batch"], row["seq_len"], device, step_ms, tokens_per_s, flops / 1e12, 100 * mfu, float(peak_tflops),
              row["peak_memory_gib"]))
    if "predicted_over_allocator" in row:
        print("[bench_gpu] allocator peak %.2f GiB, inspect --memory predicts %.2f GiB (ratio %.3f)" % (
            row["allocator_peak_gib"], row["predicted_peak_gib"], row["predicted_over_allocator"]))
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
