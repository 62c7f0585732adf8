"""Builds tiny random Gemma 1/2/3 models with transformers and writes them plus reference outputs as test fixtures."""

import argparse
import os
import sys

import h5py
import numpy as np
import torch
import transformers

VOCAB, HIDDEN, INTERMEDIATE, HEADS, HEAD_DIM = 256, 64, 128, 4, 16
BATCH, SEQ = 2, 24
INIT_STD = 0.3
GEN_PROMPT, GEN_NEW = 8, 64  # greedy generation: prompt and new tokens (72 > the sliding window 8)
GEN_STD = {"gemma": 0.3, "gemma2": 0.05, "gemma3": 0.05}
# Parameters whose loss gradients are stored (our names, i.e. without the "model." prefix).
GRAD_PARAMS = ["embed_tokens.weight", "layers.1.self_attn.q_proj.weight",
               "layers.1.input_layernorm.weight", "layers.1.mlp.down_proj.weight"]


def tiny_configs():
    """(name, seed, config) of each fixture; features sized so that each one actually matters."""
    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                  num_attention_heads=HEADS, head_dim=HEAD_DIM, max_position_embeddings=256,
                  attention_dropout=0.0, tie_word_embeddings=True)
    gemma = transformers.GemmaConfig(num_hidden_layers=2, num_key_value_heads=1, **common)
    # Small softcaps so they bite on random weights; window 8 < sequence 24 so masking matters;
    # query_pre_attn_scalar != head_dim so the scale is exercised.
    gemma2 = transformers.Gemma2Config(
        num_hidden_layers=4, num_key_value_heads=2, query_pre_attn_scalar=24, sliding_window=8,
        attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
        layer_types=["sliding_attention", "full_attention"] * 2, **common)
    gemma3 = transformers.Gemma3TextConfig(
        num_hidden_layers=6, num_key_value_heads=2, query_pre_attn_scalar=16, sliding_window=8,
        layer_types=["sliding_attention"] * 5 + ["full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
        }, **common)
    return [("gemma", 1001, gemma), ("gemma2", 1002, gemma2), ("gemma3", 1003, gemma3)]


def build_model(config, seed, init_std=INIT_STD):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", dtype=torch.float32)
    # HF's own init is near-identity (norm weights 0, tiny projections); larger random weights make
    # attention patterns, the (1 + w) norm convention and the softcaps all visible in the outputs.
    with torch.no_grad():
        for _, param in model.named_parameters():
            param.normal_(0.0, init_std)
    model.train(False)
    return model


def write_fixture(name, seed, config, out_root):
    model = build_model(config, seed)
    input_ids = torch.randint(0, VOCAB, (BATCH, SEQ), dtype=torch.int64)
    out = model(input_ids=input_ids, labels=input_ids)
    out.loss.backward()
    logits = out.logits.detach()
    if logits.std().item() < 0.5:
        raise RuntimeError(f"{name}: logits too small (std {logits.std().item():.3g})")

    params = dict(model.model.named_parameters())
    out_dir = os.path.join(out_root, name)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)  # transformers 5 always writes safetensors
    gen_config = os.path.join(out_dir, "generation_config.json")
    if os.path.exists(gen_config):  # not needed to load the model; keep the fixture minimal
        os.remove(gen_config)

    with h5py.File(os.path.join(out_dir, "reference.h5"), "w") as h5:
        h5.attrs["description"] = (
            f"{config.model_type} ({type(model).__name__}), tiny random weights normal(0, {INIT_STD}),"
            f" seed {seed}, transformers {transformers.__version__}, torch {torch.__version__};"
            " loss = HF causal-LM loss with labels = input_ids (shifted mean cross-entropy)")
        h5.create_dataset("input_ids", data=input_ids.numpy())
        h5.create_dataset("logits", data=logits.numpy().astype(np.float32))
        h5.create_dataset("loss", data=np.float64(out.loss.item()))
        grads = h5.create_group("grad")
        for pname in GRAD_PARAMS:
            grads.create_dataset(pname, data=params[pname].grad.numpy().astype(np.float32))

    n_params = sum(p.numel() for p in model.parameters())
    print(f"{name}: {type(model).__name__}, seed {seed}, {n_params} params, "
          f"loss {out.loss.item():.6f}, logits std {logits.std().item():.3f}")


def write_generation(name, seed, config, out_root):
    """generate-<name>/: an HF checkpoint with weights of GEN_STD[name] and generate.h5, a prompt and
    the GEN_NEW tokens transformers' greedy generate() continues it with. Random models of the
    fixtures' scale mostly repeat one token greedily; these scales give varied continuations."""
    model = build_model(config, seed, GEN_STD[name])
    generator = torch.Generator().manual_seed(seed + 7)
    prompt = torch.randint(0, VOCAB, (1, GEN_PROMPT), dtype=torch.int64, generator=generator)
    # No early stop: every fixture must produce all GEN_NEW tokens (EOS is an ordinary token here).
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    with torch.no_grad():
        out = model.generate(input_ids=prompt, do_sample=False, max_new_tokens=GEN_NEW, min_new_tokens=GEN_NEW)
    tokens = out[0, GEN_PROMPT:]
    assert tokens.numel() == GEN_NEW, tokens.shape
    out_dir = os.path.join(out_root, "generate-" + name)
    os.makedirs(out_dir, exist_ok=True)
    model.generation_config = transformers.GenerationConfig()  # defaults: not needed to load the model
    model.save_pretrained(out_dir)
    gen_config = os.path.join(out_dir, "generation_config.json")
    if os.path.exists(gen_config):
        os.remove(gen_config)
    with h5py.File(os.path.join(out_dir, "generate.h5"), "w") as h5:
        h5.attrs["description"] = (
            f"greedy generate(do_sample=False, max_new_tokens={GEN_NEW}, no EOS stop) of {name} with weights"
            f" normal(0, {GEN_STD[name]}), seed {seed},"
            f" transformers {transformers.__version__}, torch {torch.__version__}")
        h5.create_dataset("prompt", data=prompt[0].numpy())
        h5.create_dataset("tokens", data=tokens.numpy())
    print(f"{name}: generate {GEN_NEW} tokens after a {GEN_PROMPT}-token prompt, "
          f"{len(set(tokens.tolist()))} distinct")


def main(argv=None):
    default_out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.path.normpath(default_out),
                        help="fixture root directory (default: tests/fixtures)")
    parser.add_argument("--generation-only", action="store_true",
                        help="write only generate.h5 (the other files of existing fixtures stay as they are)")
    args = parser.parse_args(argv)
    torch.use_deterministic_algorithms(True)
    transformers.utils.logging.disable_progress_bar()
    for name, seed, config in tiny_configs():
        if not args.generation_only:
            write_fixture(name, seed, config, args.out)
        write_generation(name, seed, config, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
