#!/usr/bin/env python3
"""fla's chunk_linear_attn as the GPU peer of our causal operator (issue 51): a benchmark, not a test.

At the benchmark's shape (B, H query heads, K KV heads, L, D, m features) it times, forward and
backward together:
- fla: Performer-style positive features of the same q and k computed in PyTorch
  (phi(x) = exp(x W^T - |x|^2/2 - its row max), W ~ N(0, I), x = q / D^(1/4)), keys repeated to the H
  query heads (fla has no grouped heads), then fla.ops.linear_attn.chunk_linear_attn(normalize=True);
- exact: torch's scaled_dot_product_attention (causal), the reference our binary times too,
  so fla's time is reported against it (`vs_exact`), as kernel-check --bench reports ours.
q, k, v and the incoming gradient are made in --dtype; bf16 runs each forward under autocast, as a
bf16 model would. The two alternate, one call each per repeat after a warm-up; medians are kept.

Without CUDA, triton or fla it writes one row per length saying why ("skipped: no CUDA") and exits 0.

  bench_fla.py --lengths 2048,8192 --heads 8 --kv-heads 1 --head-dim 256 --features 256 \\
      --dtype bf16 --repeats 3 --json kernels_fla.jsonl
"""

import argparse
import importlib.util
import json
import statistics
import sys
import time


def why_not_runnable():
    try:
        import torch
    except ImportError:
        return "no torch"
    if not torch.cuda.is_available():
        return "no CUDA"
    if importlib.util.find_spec("triton") is None:
        return "no triton"
    if importlib.util.find_spec("fla") is None:
        return "no fla (pip install --no-deps fla-core==0.6.0 einops)"
    return None


def time_call(fn, sync):
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - start) * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="2048,8192,32768")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=1)
    parser.add_argument("--head-dim", type=int, default=256)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    base = {"kernel": "performer-features", "impl": "fla chunk_linear_attn", "batch": args.batch,
            "heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim,
            "num_features": args.features, "dtype": args.dtype}
    reason = why_not_runnable()
    try:
        out = open(args.json, "w")
    except OSError as e:
        print("bench_fla.py: --json %s: cannot write it (%s)" % (args.json, e.strerror), file=sys.stderr)
        return 2
    with out:
        if reason:
            for length in lengths:
                out.write(json.dumps(dict(base, length=length, skipped=reason)) + "\n")
            print("[bench_fla] skipped: %s" % reason)
            return 0
        run(args, lengths, base, out)
    return 0


def run(args, lengths, base, out):
    import torch
    import torch.nn.functional as F
    from fla.ops.linear_attn import chunk_linear_attn

    def positive_features(x, w):
        """exp(x W^T - |x|^2/2 - row max): the row max cancels in fla's normalised output."""
        logits = x @ w.t() - 0.5 * (x * x).sum(-1, keepdim=True)
        return torch.exp(logits - logits.amax(-1, keepdim=True).detach())

    device = torch.device("cuda")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    d, m, group = args.head_dim, args.features, args.heads // args.kv_heads
    w = torch.randn(m, d, device=device)
    root = d ** -0.25

    def inputs(length):
        make = lambda heads: torch.randn(args.batch, heads, length, d, device=device, dtype=dtype).requires_grad_()
        return make(args.heads), make(args.kv_heads), make(args.kv_heads)

    def fla_call(q, k, v):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            fq = positive_features(q.float() * root, w)
            fk = positive_features(k.float() * root, w).repeat_interleave(group, 1)
            vv = v.repeat_interleave(group, 1)
            # fla's layout: B T H K.
            o, _ = chunk_linear_attn(fq.to(dtype).transpose(1, 2), fk.to(dtype).transpose(1, 2),
                                     vv.transpose(1, 2), scale=1.0, normalize=True)
        o.sum().backward()

    def exact_call(q, k, v):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            o = F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                               is_causal=True)
        o.sum().backward()

    for length in lengths:
        times = {"fla": [], "exact": []}
        peaks = {"fla": [], "exact": []}
        calls = {"fla": fla_call, "exact": exact_call}
        for repeat in range(args.repeats + 1):  # the first is the warm-up (triton compiles there)
            for name, fn in calls.items():
                q, k, v = inputs(length)
                torch.cuda.reset_peak_memory_stats()
                ms = time_call(lambda: fn(q, k, v), torch.cuda.synchronize)
                if repeat > 0:
                    times[name].append(ms)
                    peaks[name].append(torch.cuda.max_memory_allocated() / 2 ** 20)
        fla_ms, exact_ms = statistics.median(times["fla"]), statistics.median(times["exact"])
        row = dict(base, length=length, ms_median=fla_ms, ms_all=times["fla"],
                   peak_mib=statistics.median(peaks["fla"]), exact_ms_median=exact_ms,
                   exact_peak_mib=statistics.median(peaks["exact"]), speedup_vs_exact=exact_ms / fla_ms,
                   memory_vs_exact=statistics.median(peaks["fla"]) / statistics.median(peaks["exact"]))
        print("[bench_fla] L=%d %s: fla %.2f ms, SDPA %.2f ms (%.2fx), memory %.2fx"
              % (length, args.dtype, fla_ms, exact_ms, row["speedup_vs_exact"], row["memory_vs_exact"]), flush=True)
        out.write(json.dumps(row) + "\n")
        out.flush()  # a bench cut at its stage limit keeps the lengths it finished


if __name__ == "__main__":
    sys.exit(main())
