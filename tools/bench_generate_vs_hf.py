"""Benchmark (not a test): greedy generation tokens/s of `darkformer generate` against Hugging
Face's GemmaForCausalLM.generate, same weights, prompt, thread count and number of new tokens,
alternated, medians. Also reports whether the two produced the same tokens (exact attention).

The weights are a random HF Gemma of the config's model shape (timing does not depend on them),
saved and converted with tools/convert_hf_gemma.py; the prompt is encoded with the config's
tokenizer (BOS first, as both sides do).

  .venv/bin/python tools/bench_generate_vs_hf.py --config configs/demo/pretrain.yaml --new-tokens 128
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import sentencepiece as spm
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_train_vs_hf import hf_model, load_config  # noqa: E402

PROMPT = "The history of the city begins with a small settlement on the river, where"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/demo/pretrain.yaml", help="run config whose model and tokenizer to use")
    p.add_argument("--binary", default="build/darkformer", help="our binary")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3, help="alternating timed runs per side (median kept)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="CPU intra-op threads, both sides")
    return p.parse_args()


def time_hf(model, prompt_ids, new_tokens):
    ids = torch.tensor([prompt_ids])
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    seconds = time.perf_counter() - start
    return seconds, out[0, len(prompt_ids):].tolist()


def time_ours(args, weights, tokenizer_path):
    cmd = [args.binary, "generate", "--config", args.config, "--checkpoint", weights, "--prompt", PROMPT,
           "--greedy", "--ignore-eos", "--max-new-tokens", str(args.new_tokens),
           "--set", f"train.threads={args.threads}", "--set", "train.device=cpu", "--set", f"data.tokenizer={tokenizer_path}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")
    match = re.search(r"generated (\d+) tokens in ([0-9.]+) s", proc.stderr)
    if not match:
        sys.exit("no timing line in our output:\n" + proc.stderr)
    return float(match.group(2)), proc.stdout


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    config = load_config(args.config)
    model_cfg, tokenizer_path = config["model"], config["data"]["tokenizer"]
    sp = spm.SentencePieceProcessor(model_file=tokenizer_path)
    prompt_ids = [sp.bos_id()] + sp.encode(PROMPT)
    model = hf_model(model_cfg, torch.device("cpu")).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(os.path.join(tmp, "hf"))
        weights = os.path.join(tmp, "weights.h5")
        subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "convert_hf_gemma.py"), "to-h5",
                        os.path.join(tmp, "hf"), weights], check=True, capture_output=True)
        time_hf(model, prompt_ids, 4)  # warm-up
        ours, theirs = [], []
        for _ in range(args.repeats):
            seconds, text = time_ours(args, weights, tokenizer_path)
            ours.append(seconds)
            seconds, hf_tokens = time_hf(model, prompt_ids, args.new_tokens)
            theirs.append(seconds)
    # Ours prints the decoded prompt and continuation together; decode HF's the same way.
    hf_text = sp.decode(prompt_ids[1:] + hf_tokens)
    same = text.rstrip("\n") == hf_text
    if not same:
        at = next((i for i, (a, b) in enumerate(zip(text, hf_text)) if a != b), min(len(text), len(hf_text)))
        print(f"texts differ from character {at}: ours {text[at:at + 40]!r} vs HF {hf_text[at:at + 40]!r}")
    ours_tps, hf_tps = args.new_tokens / statistics.median(ours), args.new_tokens / statistics.median(theirs)
    print(f"prompt {len(prompt_ids)} tokens, {args.new_tokens} new tokens, greedy, {args.threads} threads, "
          f"model {model_cfg['num_hidden_layers']} layers x hidden {model_cfg['hidden_size']}, vocab {model_cfg['vocab_size']}")
    print(f"ours  {ours_tps:8.1f} tokens/s  (runs {', '.join(f'{s:.3f}' for s in ours)} s)")
    print(f"HF    {hf_tps:8.1f} tokens/s  (runs {', '.join(f'{s:.3f}' for s in theirs)} s)")
    print(f"ratio ours / HF = {ours_tps / hf_tps:.2f}; same text: {same}")


if __name__ == "__main__":
    main()
