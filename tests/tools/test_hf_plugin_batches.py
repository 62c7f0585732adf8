"""Padded and packed batches through transformers + darkformer_hf: a feature kernel leaves out the
keys transformers' mask hides, so each row gives what it gives alone.

For tiny Gemma models this binary finetuned (positive: darkformer; signed: trig; the constant
baseline; Gemma 2's darkformer, with sliding-window layers of window 8), in fp64:
  - a left-padded batch of prompts of three lengths (positions from the mask, as `generate` makes
    them): the logits at every real position are each prompt's own, every logit (pad rows too) is
    finite, and attending the pads instead (an all-ones mask) changes them;
  - greedy `generate` of the padded batch (a DynamicCache: every token kept) gives each prompt's own
    tokens, and the logits of every decoding step; on Gemma 2 the pads of the short rows lie beyond
    the window of their later queries, prompt and decoding steps alike;
  - a packed row (two documents: a block-diagonal 4-D mask, or transformers' packing by restarting
    position_ids) gives each document's own logits, on Gemma 2 with the first document's early keys
    beyond the second's window; a block-diagonal mask whose positions run on is honoured off
    sliding layers (the mask says it all) and refused on Gemma 2 (its windowed mask cannot show
    the documents beyond the window), naming the window; packing by flash-attention's cu_seq_lens
    (no mask) is refused, naming it.
The bound: both sides compute the same sums but for exact zeros and their order, in fp64 (2^-53 ~
1.1e-16); 1e-9 relative to the largest logit leaves 10^7 for sums of a few hundred terms and a
signed normaliser's cancellation, while a pad taken in moves logits by > 1e-3.
"""

import os
import sys
import tempfile

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_plugin_cases as hc  # noqa: E402
import testkit as tk  # noqa: E402

REL_TOL = 1e-9
# Lengths 20, 3 and 12: the short rows' pads reach beyond Gemma 2's window of 8 in the prompt itself.
PROMPTS = [[2] + list(range(5, 24)), [2, 11, 12], [2] + list(range(30, 41))]
NEW_TOKENS = 12
CASES = [("gemma", "darkformer", {"kernel": "darkformer", "darkformer": {"num_features": 32}}),
         ("gemma", "trig", {"kernel": "trig", "trig": {"num_features": 32}}),
         ("gemma", "constant", {"kernel": "constant"}),
         ("gemma2", "darkformer", {"kernel": "darkformer", "darkformer": {"num_features": 32}})]
failures = []
check = tk.checker(failures)


def left_padded(prompts):
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask, (mask.cumsum(-1) - 1).clamp_min(0)


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def alone_logits(model, prompt):
    return model(torch.tensor([prompt])).logits[0]


def check_padded(model, name):
    ids, mask, positions = left_padded(PROMPTS)
    width = ids.shape[1]
    with torch.no_grad():
        batched = model(ids, attention_mask=mask, position_ids=positions).logits
        pads_attended = model(ids, attention_mask=torch.ones_like(mask), position_ids=positions).logits
        check(bool(torch.isfinite(batched).all()), f"{name}: every logit of the padded batch is finite")
        for i, prompt in enumerate(PROMPTS):
            alone = alone_logits(model, prompt)
            err = rel(batched[i, width - len(prompt):], alone)
            check(err <= REL_TOL, f"{name}: padded row {i} = the prompt alone (rel {err:.1e})")
            if len(prompt) < width:
                moved = rel(pads_attended[i, width - len(prompt):], alone)
                check(moved > 1e-3, f"{name}: row {i} with its pads attended differs (rel {moved:.1e})")
        config = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None,
                      output_logits=True, return_dict_in_generate=True)
        together = model.generate(ids, attention_mask=mask, past_key_values=transformers.DynamicCache(), **config)
        for i, prompt in enumerate(PROMPTS):
            alone = model.generate(torch.tensor([prompt]), past_key_values=transformers.DynamicCache(), **config)
            ours, theirs = together.sequences[i, width:].tolist(), alone.sequences[0, len(prompt):].tolist()
            check(ours == theirs, f"{name}: batched greedy tokens of prompt {i} are its own"
                  + ("" if ours == theirs else f": {ours} vs {theirs}"))
            err = max(rel(a[i], b[0]) for a, b in zip(together.logits, alone.logits))
            check(err <= REL_TOL, f"{name}: and so are the logits of its {NEW_TOKENS} decoding steps (rel {err:.1e})")


def check_packed(model, name, sliding):
    """The second document starts past the window of 8 from the first's start: on Gemma 2 some of the
    first document's keys lie beyond the window of the second's queries."""
    first, second = PROMPTS[2], PROMPTS[1]
    doc = torch.tensor([0] * len(first) + [1] * len(second))
    block = ((doc.unsqueeze(1) == doc.unsqueeze(0)) & torch.ones(len(doc), len(doc), dtype=torch.bool).tril())[None, None]
    ids = torch.tensor([first + second])
    restarting = torch.tensor([list(range(len(first))) + list(range(len(second)))])
    with torch.no_grad():
        for route, kwargs in (("a block-diagonal mask", dict(attention_mask=block, position_ids=restarting)),
                              ("restarting position_ids", dict(position_ids=restarting, use_cache=False))):
            packed = model(ids, **kwargs).logits[0]
            for label, prompt, rows in (("first", first, slice(0, len(first))),
                                        ("second", second, slice(len(first), None))):
                err = rel(packed[rows], alone_logits(model, prompt))
                check(err <= REL_TOL, f"{name}: packed by {route}: the {label} document = alone (rel {err:.1e})")
        # A block-diagonal mask with positions running on: a sliding layer cannot tell the documents
        # beyond its window, so it refuses; a full layer's mask says them all.
        try:
            packed = model(ids, attention_mask=block).logits[0, len(first):]
            running = torch.arange(len(first), len(doc)).unsqueeze(0)
            err = rel(packed, model(torch.tensor([second]), position_ids=running).logits[0])
            check(not sliding and err <= REL_TOL, f"{name}: a block-diagonal mask with running positions: "
                  + ("accepted on a sliding-window layer" if sliding else
                     f"honoured: the second document = alone at those positions (rel {err:.1e})"))
        except ValueError as e:
            check(sliding and "sliding-window layer" in str(e) and "window 8" in str(e),
                  f"{name}: a block-diagonal mask with running positions: refused ({e})")
        cu = torch.tensor([0, len(first), len(doc)], dtype=torch.int32)  # flash-attention's packing, no mask
        try:
            model(ids, position_ids=restarting, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                  max_length_q=len(first), max_length_k=len(first))
            check(False, f"{name}: a row packed by cu_seq_lens was accepted")
        except ValueError as e:
            check("cu_seq_lens" in str(e) and "block-diagonal" in str(e), f"{name}: cu_seq_lens refused: {e}")


def main():
    with tempfile.TemporaryDirectory(prefix="hf-batches-") as work:
        shards = tk.tiny_shards(work)
        for family, label, attention in CASES:
            _, checkpoint = hc.finetune(work, shards, family, label, attention)
            out_dir = hc.export(checkpoint, os.path.join(work, f"{family}-{label}-hf"))
            model = hc.darkformer_hf.from_pretrained(out_dir, dtype=torch.float64).eval()
            check_padded(model, f"{family}/{label}")
            check_packed(model, f"{family}/{label}", sliding=family != "gemma")
    return tk.report(failures)


if __name__ == "__main__":
    sys.exit(main())
