"""tools/bench_gpu.sh on the CPU at toy sizes: the benchmark written for a GPU runs unchanged here.
Its kernel rows carry ops_forward / ops_backward (the chunk-parallel form's the same at two lengths
of 2 and 8 chunks; a single chunk needs a few copies fewer), in fp32 and in bf16 (with what SDPA and
our operator computed in), and each call's log a profile of every form at every length; fla's row
says why it was skipped (no CUDA here); sharp rows beside ordinary ones at the same length; and its
training-step rows, one per kernel and shape, tokens/s, MFU and peak memory."""

import os
import subprocess
import sys
import tempfile

import testkit


def main():
    failures = []
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as work:
        shards = testkit.tiny_shards(work)
        model = os.path.join(work, "model.yaml")
        testkit.write_yaml(model, {"family": "gemma", "vocab_size": shards["vocab_size"], "hidden_size": 32,
                                   "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                   "num_key_value_heads": 1, "head_dim": 16})
        out = os.path.join(work, "out")
        env = dict(os.environ, DEVICE="cpu", OUT=out, LENGTHS="128,512", HEADS="4", HEAD_DIM="16", FEATURES="16",
                   REPEATS="1", OP="chunk_parallel", SHARP_LENGTHS="128", DOCUMENTS="32", DOCUMENT_LENGTHS="256",
                   DOCUMENT_BATCH="2",
                   STEP_SHAPES="1x32 2x32", STEPS="3", MODEL=model,
                   SHARDS_DIR=shards["shards_dir"], TOKENIZER=shards["tokenizer"], DARKFORMER_BIN=testkit.BINARY,
                   PYTHON=sys.executable)
        script = os.path.join(testkit.SOURCE_DIR, "tools", "bench_gpu.sh")
        result = subprocess.run(["bash", script], env=env, capture_output=True, text=True, timeout=600)
        print(result.stdout[-3000:])
        if result.returncode != 0:
            print(result.stderr[-3000:])
            sys.exit("bench_gpu.sh exited %d" % result.returncode)
        for kernel in ("performer", "darkformer"):
            rows = testkit.read_jsonl(os.path.join(out, "kernels_%s.jsonl" % kernel))
            ours = [r for r in rows if r["impl"] == "chunk_parallel"]
            exact = [r for r in rows if r["impl"] == "exact"]
            if len(ours) != 2 or len(exact) != 2:
                failures.append("%s: want 2 chunk_parallel and 2 exact rows, got %s" % (kernel, rows))
                continue
            for r in rows:
                if not (r.get("ops_forward", 0) > 0 and r.get("ops_backward", 0) > 0 and r["device"] == "cpu"):
                    failures.append("%s: row without op counts: %s" % (kernel, r))
            # The call's whole output is kept beside its rows: a profile of each form at each length.
            with open(os.path.join(out, "kernels_%s.log" % kernel)) as f:
                log = f.read()
            for impl in ("chunk_parallel", "exact"):
                for length in (128, 512):
                    if "profile %s, L=%d " % (impl, length) not in log:
                        failures.append("%s: no profile of %s at L=%d in kernels_%s.log" % (kernel, impl, length, kernel))
            counts = {(r["ops_forward"], r["ops_backward"]) for r in ours}
            if len(counts) != 1:
                failures.append("%s: chunk_parallel's ops per call differ between L = 128 and 512: %s" % (kernel, counts))
        for kernel in ("performer", "darkformer"):
            rows = testkit.read_jsonl(os.path.join(out, "kernels_%s_bf16.jsonl" % kernel))
            got = {(r["impl"], r["dtype"], r["computes_in"]) for r in rows}
            # bf16 inputs under autocast: SDPA takes a fused kernel, our operator keeps fp32 features and state.
            want = {("chunk_parallel", "bf16", "features Float, state Float")}
            if not want <= got or not any(i == "exact" and c.startswith("sdpa ") for i, _, c in got):
                failures.append("%s bf16 rows: %s" % (kernel, sorted(got)))
        fla = testkit.read_jsonl(os.path.join(out, "fla.jsonl"))
        if [(r["length"], r.get("skipped")) for r in fla] != [(128, "no CUDA"), (512, "no CUDA")]:
            failures.append("fla rows: %s" % fla)
        for kernel in ("performer", "darkformer"):
            rows = testkit.read_jsonl(os.path.join(out, "documents_%s.jsonl" % kernel))
            impls = sorted(r["impl"] for r in rows if r.get("time_vs_unmasked") is not None)
            if impls != ["chunk_parallel+mask", "exact+mask", "exact+perdoc"]:
                failures.append("%s: packed-document rows (each beside its unmasked time): %s" % (kernel, impls))
        for kernel in ("performer", "darkformer"):
            rows = testkit.read_jsonl(os.path.join(out, "sharp_%s.jsonl" % kernel))
            got = sorted((r["impl"], r["bench_norm"], r["length"]) for r in rows)
            want = sorted((i, n, 128) for i in ("chunk_parallel", "exact") for n in (0, 60))
            if got != want:
                failures.append("%s: sharp and ordinary rows: %s" % (kernel, got))
        steps = testkit.read_jsonl(os.path.join(out, "steps.jsonl"))
        shapes = [(s["kernel"], s["batch"], s["seq_len"]) for s in steps]
        if shapes != [(k, b, 32) for b in (1, 2) for k in ("exact", "performer", "darkformer")]:
            failures.append("training-step rows: %s" % steps)
        for s in steps:
            if not (s["tokens_per_s"] > 0 and 0 < s["mfu"] < 1 and s["peak_memory_gib"] > 0 and s["steps"] == 3 and
                    (s["kernel"] == "exact" or s.get("op") == "chunk_parallel")):
                failures.append("training-step row: %s" % s)
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
