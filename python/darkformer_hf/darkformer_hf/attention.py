"""The "darkformer" attention function for transformers' AttentionInterface.

transformers calls it per layer as f(module, query BHTD, key BKSD, value BKSD, attention_mask,
dropout, scaling, sliding_window, softcap, ...) after RoPE and the KV cache (S >= T: the T queries
are the last T positions). It returns (out BTHD, None). The layer's kernel is module.kernel
(loading.py). What each kernel computes is our binary's (src/attention):
- exact: softmax, sdpa where the binary uses SDPA, fp32 soft-capped logits otherwise;
- feature kernels: causal, ignoring softcap and the sliding window (as the binary does), features
  in fp32, KV heads repeated to the query heads, in the masked quadratic form of one chunk: the
  scalar stabiliser guarded as ops/normaliser_check.h, or the per-feature stabiliser of
  ops/per_feature_attention.h (docs/kernels.md, "The normaliser at any scale");
- random / constant: baseline_kernels.cpp.
Keys the mask hides (padding, other documents of a packed row) take no part in a feature kernel's
sums or stabilisers (_allowed), so a padded row gives what it gives alone.
"""

import math

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from . import features, spec
from .loading import kernel_of
from .masks import key_is_real


def _repeat_kv(t, heads):
    return t if t.shape[1] == heads else t.repeat_interleave(heads // t.shape[1], dim=1)


def _causal_allowed(t, s, device, window=None):
    """(T, S) bool: query t (position S - T + t) sees key j <= its position (and within the window)."""
    diff = (torch.arange(t, device=device) + (s - t)).unsqueeze(1) - torch.arange(s, device=device).unsqueeze(0)
    allowed = diff >= 0
    return allowed & (diff < window) if window else allowed


def _exact(module, query, key, value, attention_mask, scaling, sliding_window, softcap, **kwargs):
    if not softcap:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                      sliding_window=sliding_window, **kwargs)
    # Soft-capped logits (Gemma 2), as exact_kernel.cpp: fp32 logits, tanh cap, masked softmax.
    heads, t, s = query.shape[1], query.shape[2], key.shape[2]
    k, v = _repeat_kv(key, heads), _repeat_kv(value, heads)
    logits = (query.float() @ k.float().transpose(-1, -2)) * scaling
    logits = torch.tanh(logits / softcap) * softcap
    if attention_mask is None:
        allowed = _causal_allowed(t, s, query.device, sliding_window)
    else:
        allowed = _visible(attention_mask, t, s)
    logits = logits.masked_fill(allowed.logical_not(), float("-inf"))
    out = torch.softmax(logits, -1).to(v.dtype) @ v
    return out.transpose(1, 2).contiguous(), None


def min_fast_normaliser(keys, features):
    """The fast form's guard, as ops/normaliser_check.h: a row sums at most keys x features terms
    of factors in (0, 1], so above keys x features x 2^-102 the scalar stabiliser is exact to fp32
    rounding; below it the row takes the per-feature stabiliser's value."""
    return keys * features * 2.0 ** -102


def _row_shift(row_max):
    """A row's stabiliser from the max of its terms: 0 where the row has no allowed term (-inf), so
    its terms exp to 0 and its output is 0, not NaN (a padded query attends to nothing)."""
    return row_max.masked_fill(torch.isneginf(row_max), 0.0)


def _masked_sums(qf, kf, b, v, allowed):
    """num_t = sum_{j allowed} (qf_t.kf_j) exp(b_j - r_t) v_j and den_t (the same without v), r_t the
    max of b over t's allowed keys (causal-safe: `allowed` never holds a later key, and a hidden key,
    padding or another document, moves no stabiliser)."""
    log_w = b.unsqueeze(-2).masked_fill(allowed.logical_not(), float("-inf"))
    r = _row_shift(log_w.amax(-1, keepdim=True))
    a = (qf @ kf.transpose(-1, -2)) * (log_w - r).exp()
    return a @ v, a.sum(-1)


def causal_linear_attention(qf, kf, b, v, signed_floor, allowed):
    """Signed features (trig, slay, flexformer): the normaliser may cross zero; its magnitude is
    floored at signed_floor with its sign kept (a row without keys: 0 / floor = 0)."""
    num, den = _masked_sums(qf, kf, b, v, allowed)
    den = torch.where(den >= 0, den.clamp_min(signed_floor), den.clamp_max(-signed_floor))
    return num / den.unsqueeze(-1)


def per_feature_attention(lq, lk, v, allowed, block=16):
    """Positive features from their logs with the per-feature stabiliser (docs/kernels.md, "The
    normaliser at any scale"): s_t = max over t's allowed keys j and features i of lq_ti + lk_ji,
    out_t = sum_{j allowed} sum_i exp(lq_ti + lk_ji - s_t) v_j / (the same without v). Every exponent
    is <= 0 and a row with keys has a normaliser >= 1; a row without keys gives 0. Pairs are summed
    feature by feature, `block` queries at a time."""
    t = lq.shape[2]
    outs = []
    for start in range(0, t, block):
        rows = slice(start, min(t, start + block))
        args = (lq[:, :, rows].unsqueeze(3) + lk.unsqueeze(2)).masked_fill(
            allowed[..., rows, :].logical_not().unsqueeze(-1), float("-inf"))
        w = (args - _row_shift(args.amax((-2, -1), keepdim=True))).exp().sum(-1)
        outs.append((w @ v) / w.sum(-1, keepdim=True).clamp_min(1.0))  # >= 1 already where a row has keys
    return torch.cat(outs, 2)


def positive_attention(lq, lk, v, allowed):
    """The scalar stabiliser's masked sums for rows whose normaliser stays above the guard, the
    per-feature form's for the others (as the binary's operator does: per row, so no row's
    choice reads a later key)."""
    qf = (lq - lq.amax(-1, keepdim=True)).exp()  # per-query shift: cancels
    b = lk.amax(-1)                               # per-key log-weight: carried exactly
    num, den = _masked_sums(qf, (lk - b.unsqueeze(-1)).exp(), b, v, allowed)
    below = den < min_fast_normaliser(lk.shape[2], lk.shape[-1])
    fast = num / den.clamp_min(torch.finfo(den.dtype).tiny).unsqueeze(-1)  # the clamp touches replaced rows only
    # The per-feature form costs m times the scalar one: it runs for the query positions where some
    # row fell below the guard, not the whole call.
    rows = below.flatten(0, -2).any(0).nonzero().squeeze(1)
    if rows.numel() == 0:
        return fast
    exact = per_feature_attention(lq.index_select(2, rows), lk, v, allowed.index_select(-2, rows))
    taken = torch.where(below.index_select(2, rows).unsqueeze(-1), exact, fast.index_select(2, rows))
    return fast.index_copy(2, rows, taken)


def _feature_attention(kernel, query, key, value, scaling, allowed):
    dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
    heads = query.shape[1]
    state = kernel.tensors(dtype, query.device)
    k, v = _repeat_kv(key, heads).to(dtype), _repeat_kv(value, heads).to(dtype)
    q = query.to(dtype)
    name, root = kernel.kernel_name, math.sqrt(scaling)
    if name in features.POSITIVE:
        lq = features.log_features(name, state, kernel.options, q * root, is_query=True)
        lk = features.log_features(name, state, kernel.options, k * root, is_query=False)
        return positive_attention(lq, lk, v, allowed)
    scale = root if features.scales_inputs(name) else 1.0
    qf, _ = features.signed_features(name, state, kernel.options, q * scale)
    kf, c = features.signed_features(name, state, kernel.options, k * scale)
    b = c if c is not None else torch.zeros(kf.shape[:3], dtype=dtype, device=kf.device)
    return causal_linear_attention(qf, kf, b, v, float(spec.option(name, kernel.options, "normaliser_floor")), allowed)


def _random(kernel, query, value, allowed):
    """Fresh U(0, 1) weights over the allowed keys from the layer's own CPU generator."""
    v = _repeat_kv(value, query.shape[1]).float()
    bsz, heads, s = v.shape[0], v.shape[1], v.shape[2]
    t = query.shape[2]
    u = torch.rand((bsz, heads, t, s), generator=kernel.generator, dtype=torch.float32).to(v.device)
    u = u * allowed
    return (u / u.sum(-1, keepdim=True).clamp_min(torch.finfo(u.dtype).tiny)) @ v


def _constant(query, value, allowed):
    """The mean of v over each query's allowed keys (the running mean, on a causal mask)."""
    v = _repeat_kv(value, query.shape[1]).float()
    weights = allowed.to(v.dtype)
    return (weights @ v) / weights.sum(-1, keepdim=True).clamp_min(1.0)


def _visible(attention_mask, t, s):
    """(B|1, 1|H, T, S) bool: the keys transformers' mask leaves each query."""
    rows = attention_mask[..., -t:, -s:]
    return rows if rows.dtype == torch.bool else rows == 0


def _same_document(position_ids, t, s):
    """(B, 1, T, S) bool: query and key in the same document of a packed row, the documents starting
    where position_ids do not go up by one (transformers' find_packed_sequence_indices); None where
    the positions do not cover every key (a decoding step: no packing there)."""
    if position_ids is None or position_ids.shape[-1] != s or t != s:
        return None
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    document = starts.cumsum(-1)
    return (document.unsqueeze(-1) == document.unsqueeze(-2)).unsqueeze(1)


def _allowed(attention_mask, t, s, device, sliding_window, position_ids=None):
    """Which keys each query of a feature kernel attends: every earlier key, as the binary (sliding
    windows ignored), less the keys transformers' mask hides for other reasons: padding, and other
    documents of a packed row. Off a sliding layer the mask says exactly that. On one it also hides
    the keys beyond the window, so padding comes from the 2-D mask the mask was built from
    (masks.py) and documents from the position_ids, as transformers finds them; a key the mask
    hides inside the window for any other reason is refused, since the windowed mask cannot show
    what lies beyond it."""
    causal = _causal_allowed(t, s, device)
    if attention_mask is None or t == 0:
        return causal
    visible = _visible(attention_mask, t, s)
    if not sliding_window:
        return causal & visible
    real = key_is_real(attention_mask)
    allowed = causal if real is None else causal & real[:, -s:].view(real.shape[0], 1, 1, s)
    inside = _causal_allowed(t, s, device, sliding_window) & allowed
    if not bool((inside & visible.logical_not()).any()):
        return allowed
    # Every document boundary shows inside the window (a document's first query hides the key
    # before it): the documents the positions give must be the ones the mask shows there.
    same = _same_document(position_ids, t, s)
    if same is None or bool((inside & (visible != same)).any()):
        raise ValueError(
            f"darkformer_hf: a sliding-window layer (window {sliding_window}) whose mask hides keys that are neither "
            "padding nor another document by the position_ids: random-feature attention ignores the window, as the "
            "darkformer binary does, and the windowed mask cannot show what lies beyond it; pass position_ids that "
            "restart at each document, or one document per row")
    return allowed & same


_PACKED_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "cu_seqlens_q", "cu_seqlens_k")


def _refuse_cu_seq_lens(kwargs):
    """flash-attention's packing (documents given by cumulative lengths, no mask) is not read here;
    a packed row with a block-diagonal mask is (_allowed)."""
    if any(kwargs.get(k) is not None for k in _PACKED_KWARGS):
        raise ValueError("darkformer_hf: a packed batch given by cu_seq_lens: pass a block-diagonal attention "
                         "mask instead (each document's keys only), or one document per row")


def darkformer_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                         sliding_window=None, softcap=None, **kwargs):
    kernel = kernel_of(module, query.device)
    if scaling is None:
        scaling = module.head_dim ** -0.5
    name = kernel.kernel_name
    if name == "exact":
        return _exact(module, query, key, value, attention_mask, scaling, sliding_window, softcap, **kwargs)
    _refuse_cu_seq_lens(kwargs)
    allowed = _allowed(attention_mask, query.shape[2], key.shape[2], query.device, sliding_window,
                       kwargs.get("position_ids"))
    if name == "random":
        out = _random(kernel, query, value, allowed)
    elif name == "constant":
        out = _constant(query, value, allowed)
    else:
        out = _feature_attention(kernel, query, key, value, scaling, allowed)
    return out.to(value.dtype).transpose(1, 2).contiguous(), None
