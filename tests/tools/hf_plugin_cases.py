"""Helpers of test_hf_plugin.py: tiny finetuned runs per kernel, our binary's eval and greedy
generation, and the same through transformers + darkformer_hf. Not a test itself."""

import glob
import json
import os
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testkit as tk  # noqa: E402
from test_gemma_train_roundtrip import save_random_model, validation_rows  # noqa: E402,F401

sys.path.insert(0, os.path.join(tk.SOURCE_DIR, "tools"))
sys.path.insert(0, os.path.join(tk.SOURCE_DIR, "python", "darkformer_hf"))
import convert_hf_gemma as conv  # noqa: E402
import darkformer_hf  # noqa: E402

PROMPT = "The quick brown fox"
NEW_TOKENS = 32


def base_model(work, family, vocab_size):
    """A random HF model of `family` (weights large enough that attention matters), as our .h5,
    and its model section."""
    import h5py
    import yaml
    hf_dir, h5_path = os.path.join(work, family + "_base_hf"), os.path.join(work, family + "_base.h5")
    if not os.path.exists(h5_path):
        save_random_model(family, vocab_size, hf_dir)
        if conv.main(["to-h5", hf_dir, h5_path]) != 0:
            raise RuntimeError(f"{family}: to-h5 of the base model failed")
    with h5py.File(h5_path, "r") as h5:
        return h5_path, yaml.safe_load(h5.attrs["config_yaml"])


def finetune(work, shards, family, label, attention, steps=3):
    """Finetunes the family's base with `attention` (the run config's section): (config, checkpoint)."""
    h5_path, model = base_model(work, family, shards["vocab_size"])
    run_dir, config_path = os.path.join(work, f"{family}-{label}"), os.path.join(work, f"{family}-{label}.yaml")
    tk.write_yaml(config_path, tk.run_config(
        run_dir, shards, model=model, attention=attention,
        train={"steps": steps, "init_from": h5_path, "checkpoint_every": steps, "lr": 3e-3}))
    tk.run(["train", "--config", config_path], check=True)
    return config_path, sorted(glob.glob(os.path.join(run_dir, "checkpoints", "step_*.h5")))[-1]


def our_loss(config_path, checkpoint, rows, shards=None):
    """`darkformer eval` of one batch of `rows` rows (of `shards` when given): the loss."""
    args = ["eval", "--config", config_path, "--checkpoint", checkpoint, "--batches", "1",
            "--set", f"data.batch_size={rows}"]
    if shards:
        args += ["--set", f"data.shards_dir={shards['shards_dir']}", "--set", f"data.tokenizer={shards['tokenizer']}"]
    return json.loads(tk.run(args, check=True).stdout.strip().splitlines()[-1])["loss"]


def our_generate(config_path, checkpoint):
    args = ["generate", "--config", config_path, "--checkpoint", checkpoint, "--prompt", PROMPT,
            "--max-new-tokens", NEW_TOKENS, "--greedy", "--ignore-eos"]
    return tk.run(args, check=True).stdout.rstrip("\n")


def hf_loss(model, inputs, labels):
    with torch.no_grad():
        logits = model(input_ids=inputs).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(),
                                             labels.reshape(-1)).item()


def hf_generate(model, tokenizer_path):
    """Greedy continuation as text, decoded as our binary prints it (prompt + continuation). The
    cache holds every token (a plain DynamicCache): feature kernels ignore sliding windows."""
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=tokenizer_path)
    ids = [sp.bos_id()] + sp.encode(PROMPT)
    with torch.no_grad():
        # No EOS: our --ignore-eos keeps EOS tokens in the text (they decode to nothing).
        config = transformers.GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                                               pad_token_id=0)
        out = model.generate(torch.tensor([ids]), generation_config=config,
                             past_key_values=transformers.DynamicCache())
    return sp.decode(ids[1:] + out[0, len(ids):].tolist())


def export(checkpoint, out_dir):
    if conv.main(["to-hf", checkpoint, out_dir]) != 0:
        raise RuntimeError(f"to-hf of {checkpoint} failed")
    return out_dir
