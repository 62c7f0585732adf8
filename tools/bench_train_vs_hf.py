"""Benchmark (not a test): one training step (forward, backward, clip, AdamW) of our trainer
against Hugging Face's GemmaForCausalLM in PyTorch, same model config, batch and sequence length,
in the same session and with the same thread count.

Ours runs `darkformer train` on the config's shards for a few steps and reads step_ms from
metrics.jsonl; HF runs on random token ids (timing does not depend on the tokens). Prints tokens/s
for both, the ratio us/HF, and on CUDA the model FLOPs utilisation against --peak-tflops, with
the trainer's own FLOPs per token (metrics.jsonl's flops_per_token, src/train/model_flops.h) for
both: the same model does the same work.

  .venv/bin/python tools/bench_train_vs_hf.py --config configs/demo/pretrain.yaml --batch 8 --seq 128
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import transformers
import yaml


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/demo/pretrain.yaml", help="run config whose model and data to use")
    p.add_argument("--binary", default="build/darkformer", help="our binary")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=20, help="timed steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=5, help="untimed first steps")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="CPU intra-op threads, both sides")
    p.add_argument("--peak-tflops", type=float, default=0.0,
                   help="device peak for MFU (default: H100/H200 dense TF32 494.7, as both sides train in fp32)")
    return p.parse_args()


def load_config(path):
    """The config with its `base:` chain merged (as the C++ loader does)."""
    with open(path) as f:
        node = yaml.safe_load(f)
    if "base" in node:
        base = load_config(os.path.join(os.path.dirname(path), node.pop("base")))
        def merge(a, b):
            for k, v in b.items():
                a[k] = merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
            return a
        node = merge(base, node)
    return node


def hf_model(model_cfg, device):
    cfg = transformers.GemmaConfig(
        vocab_size=model_cfg["vocab_size"], hidden_size=model_cfg["hidden_size"],
        intermediate_size=model_cfg["intermediate_size"], num_hidden_layers=model_cfg["num_hidden_layers"],
        num_attention_heads=model_cfg["num_attention_heads"], num_key_value_heads=model_cfg["num_key_value_heads"],
        head_dim=model_cfg["head_dim"], max_position_embeddings=model_cfg.get("max_position_embeddings", 8192),
        rms_norm_eps=model_cfg.get("rms_norm_eps", 1e-6), attention_dropout=0.0, tie_word_embeddings=True)
    cfg._attn_implementation = "sdpa"  # ours uses scaled_dot_product_attention for exact attention
    torch.manual_seed(0)
    return transformers.GemmaForCausalLM(cfg).to(device).train()


def time_hf(args, model_cfg, train_cfg):
    device = torch.device(args.device)
    model = hf_model(model_cfg, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=train_cfg.get("lr", 3e-4),
                                  betas=(train_cfg.get("beta1", 0.9), train_cfg.get("beta2", 0.95)),
                                  eps=train_cfg.get("eps", 1e-8), weight_decay=train_cfg.get("weight_decay", 0.1))
    clip = train_cfg.get("grad_clip", 1.0)
    ids = torch.randint(0, model_cfg["vocab_size"], (args.batch, args.seq), device=device)
    times = []
    for step in range(args.warmup + args.steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    params = sum(p.numel() for p in model.parameters())
    return statistics.median(times), params


def time_ours(args):
    with tempfile.TemporaryDirectory() as run_dir:
        sets = {"data.batch_size": args.batch, "data.seq_len": args.seq, "train.steps": args.warmup + args.steps,
                "train.checkpoint_every": 0, "train.device": args.device, "train.threads": args.threads,
                "train.init_from": "", "eval.every": 0, "eval.batches": 1, "log.dir": run_dir, "log.every": 0}
        cmd = [args.binary, "train", "--config", args.config]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            lines = [json.loads(l) for l in f if l.strip()]
        train = [l for l in lines if l["type"] == "train"]
        ms = [l["step_ms"] for l in train][args.warmup:]
        return statistics.median(ms) / 1000.0, train[0]["flops_per_token"]


def main():
    args = parse_args()
    cfg = load_config(args.config)
    model_cfg, train_cfg = cfg["model"], cfg.get("train", {})
    torch.set_num_threads(args.threads)
    tokens = args.batch * args.seq
    ours_s, per_token = time_ours(args)
    hf_s, params = time_hf(args, model_cfg, train_cfg)
    print(f"model: {model_cfg['num_hidden_layers']} layers, hidden {model_cfg['hidden_size']}, "
          f"vocab {model_cfg['vocab_size']}, {params / 1e6:.2f}M parameters; batch {args.batch} x seq {args.seq}; "
          f"device {args.device}, {args.threads} threads; median of {args.steps} steps after {args.warmup}")
    print(f"ours: {ours_s * 1000:8.1f} ms/step  {tokens / ours_s:10.0f} tokens/s")
    print(f"HF:   {hf_s * 1000:8.1f} ms/step  {tokens / hf_s:10.0f} tokens/s")
    print(f"ratio us/HF (tokens/s): {hf_s / ours_s:.3f}")
    if args.device.startswith("cuda"):
        peak = (args.peak_tflops or 494.7) * 1e12
        for name, s in (("ours", ours_s), ("HF", hf_s)):
            print(f"MFU {name}: {per_token * tokens / s / peak * 100:.2f}% of {peak / 1e12:.0f} TFLOP/s")


if __name__ == "__main__":
    main()
