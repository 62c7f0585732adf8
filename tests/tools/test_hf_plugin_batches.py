"""Padded and packed batches through transformers + darkformer_hf: a feature kernel leaves out the
keys transformers' mask hides, so each row gives what it gives alone.

For tiny Gemma models this binary finetuned (positive: darkformer; signed: trig; the constant
baseline), in fp64:
  - a left-padded batch of prompts of three lengths (positions from the mask, as `generate` makes
    them): the logits at every real position are each prompt's own, every logit (pad rows too) is
    finite, and attending the pads instead (an all-ones mask) changes them;
  - greedy `generate` of the padded batch gives each prompt's own tokens;
  - a packed row (two documents, a block-diagonal 4-D mask, positions restarting) gives each
    document's own logits; packing by flash-attention's cu_seq_lens (no mask) is refused, naming it;
  - Gemma 2 (sliding-window layers, where the mask cannot tell a pad beyond the window) refuses a
    padded batch, naming the window, and runs rows of equal length.
The bound: both sides compute the same sums but for exact zeros and their order, in fp64 (2^-53 ~
1.1e-16); 1e-9 relative to the largest logit leaves 10^7 for sums of a few hundred terms and a
signed normaliser's cancellation, while a pad taken in moves logits by > 1e-3.
"""

import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_plugin_cases as hc  # noqa: E402
import testkit as tk  # noqa: E402

REL_TOL = 1e-9
PROMPTS = [[2, 5, 6, 7, 8, 9, 10], [2, 11, 12], [2, 13, 14, 15, 16]]
NEW_TOKENS = 12
failures = []
check = tk.checker(failures)


def left_padded(prompts):
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask, (mask.cumsum(-1) - 1).clamp_min(0)


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def check_padded(model, name):
    ids, mask, positions = left_padded(PROMPTS)
    width = ids.shape[1]
    with torch.no_grad():
        batched = model(ids, attention_mask=mask, position_ids=positions).logits
        pads_attended = model(ids, attention_mask=torch.ones_like(mask), position_ids=positions).logits
        check(bool(torch.isfinite(batched).all()), f"{name}: every logit of the padded batch is finite")
        for i, prompt in enumerate(PROMPTS):
            alone = model(torch.tensor([prompt])).logits[0]
            got = batched[i, width - len(prompt):]
            err = rel(got, alone)
            check(err <= REL_TOL, f"{name}: padded row {i} = the prompt alone (rel {err:.1e})")
            if len(prompt) < width:
                moved = rel(pads_attended[i, width - len(prompt):], alone)
                check(moved > 1e-3, f"{name}: row {i} with its pads attended differs (rel {moved:.1e})")
        config = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None)
        together = model.generate(ids, attention_mask=mask, **config)[:, width:]
        for i, prompt in enumerate(PROMPTS):
            alone = model.generate(torch.tensor([prompt]), **config)[0, len(prompt):]
            check(together[i].tolist() == alone.tolist(), f"{name}: batched greedy tokens of prompt {i} are its own"
                  + ("" if together[i].tolist() == alone.tolist() else f": {together[i].tolist()} vs {alone.tolist()}"))


def check_packed(model, name):
    first, second = PROMPTS[0], PROMPTS[2]
    doc = torch.tensor([0] * len(first) + [1] * len(second))
    causal = torch.ones(len(doc), len(doc), dtype=torch.bool).tril()
    mask = ((doc.unsqueeze(1) == doc.unsqueeze(0)) & causal)[None, None]
    positions = torch.tensor([list(range(len(first))) + list(range(len(second)))])
    with torch.no_grad():
        packed = model(torch.tensor([first + second]), attention_mask=mask, position_ids=positions).logits[0]
        for label, prompt, rows in (("first", first, slice(0, len(first))), ("second", second, slice(len(first), None))):
            err = rel(packed[rows], model(torch.tensor([prompt])).logits[0])
            check(err <= REL_TOL, f"{name}: the packed row's {label} document = alone (rel {err:.1e})")
        cu = torch.tensor([0, len(first), len(doc)], dtype=torch.int32)  # flash-attention's packing, no mask
        try:
            model(torch.tensor([first + second]), position_ids=positions, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                  max_length_q=len(first), max_length_k=len(first))
            check(False, f"{name}: a row packed by cu_seq_lens was accepted")
        except ValueError as e:
            check("cu_seq_lens" in str(e) and "block-diagonal" in str(e), f"{name}: cu_seq_lens refused: {e}")


def check_sliding_refused(model):
    ids, mask, positions = left_padded(PROMPTS)
    with torch.no_grad():
        model(ids[:, -3:], attention_mask=torch.ones_like(ids[:, -3:]))
        try:
            model(ids, attention_mask=mask, position_ids=positions)
            check(False, "gemma2: a padded batch was accepted on a sliding-window layer")
        except ValueError as e:
            check("sliding-window layer" in str(e) and "window" in str(e), f"gemma2: refusal names the window: {e}")


def main():
    with tempfile.TemporaryDirectory(prefix="hf-batches-") as work:
        shards = tk.tiny_shards(work)
        for label, attention in (("darkformer", {"kernel": "darkformer", "darkformer": {"num_features": 32}}),
                                 ("trig", {"kernel": "trig", "trig": {"num_features": 32}}),
                                 ("constant", {"kernel": "constant"})):
            _, checkpoint = hc.finetune(work, shards, "gemma", label, attention)
            model = hc.darkformer_hf.from_pretrained(hc.export(checkpoint, os.path.join(work, label + "-hf")),
                                                     dtype=torch.float64).eval()
            check_padded(model, label)
            check_packed(model, label)
        _, checkpoint = hc.finetune(work, shards, "gemma2", "darkformer",
                                    {"kernel": "darkformer", "darkformer": {"num_features": 32}})
        check_sliding_refused(hc.darkformer_hf.from_pretrained(
            hc.export(checkpoint, os.path.join(work, "gemma2-hf")), dtype=torch.float64).eval())
    return tk.report(failures)


if __name__ == "__main__":
    sys.exit(main())
