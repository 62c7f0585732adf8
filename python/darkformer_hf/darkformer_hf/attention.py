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
"""

import math

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from . import features, spec
from .loading import kernel_of


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
    elif attention_mask.dtype == torch.bool:
        allowed = attention_mask[..., -s:]
    else:
        allowed = attention_mask[..., -s:] == 0
    logits = logits.masked_fill(allowed.logical_not(), float("-inf"))
    out = torch.softmax(logits, -1).to(v.dtype) @ v
    return out.transpose(1, 2).contiguous(), None


def min_fast_normaliser(keys, features):
    """The fast form's guard, as ops/normaliser_check.h: a row sums at most keys x features terms
    of factors in (0, 1], so above keys x features x 2^-102 the scalar stabiliser is exact to fp32
    rounding; below it the row takes the per-feature stabiliser's value."""
    return keys * features * 2.0 ** -102


def _masked_sums(qf, kf, b, v):
    """num_i = sum_{j <= p_i} (qf_i.kf_j) exp(b_j - r_i) v_j and den_i (the same without v), r_i the
    prefix max of b up to p_i (causal-safe: nothing after p_i enters)."""
    t, s = qf.shape[2], kf.shape[2]
    r = b.cummax(-1).values[..., s - t:]
    log_w = (b.unsqueeze(-2) - r.unsqueeze(-1)).masked_fill(
        _causal_allowed(t, s, qf.device).logical_not(), float("-inf"))
    a = (qf @ kf.transpose(-1, -2)) * log_w.exp()
    return a @ v, a.sum(-1)


def causal_linear_attention(qf, kf, b, v, signed_floor):
    """Signed features (trig, slay, flexformer): the normaliser may cross zero; its magnitude is
    floored at signed_floor with its sign kept."""
    num, den = _masked_sums(qf, kf, b, v)
    den = torch.where(den >= 0, den.clamp_min(signed_floor), den.clamp_max(-signed_floor))
    return num / den.unsqueeze(-1)


def per_feature_attention(lq, lk, v, block=16):
    """Positive features from their logs with the per-feature stabiliser (docs/kernels.md, "The
    normaliser at any scale"): R_i the running max of lk_ji over j <= p_t, s_t = max_i (lq_ti + R_i),
    out_t = sum_{j <= p_t} sum_i exp(lq_ti + lk_ji - s_t) v_j / (the same without v). Every exponent
    is <= 0 and the normaliser >= 1. Pairs are summed feature by feature, `block` queries at a time."""
    t, s = lq.shape[2], lk.shape[2]
    shift = (lq + lk.cummax(2).values[:, :, s - t:]).amax(-1, keepdim=True)
    allowed = _causal_allowed(t, s, lq.device)
    outs = []
    for start in range(0, t, block):
        rows = slice(start, min(t, start + block))
        args = (lq[:, :, rows] - shift[:, :, rows]).unsqueeze(3) + lk.unsqueeze(2)
        w = args.masked_fill(allowed[rows].logical_not().unsqueeze(-1), float("-inf")).exp().sum(-1)
        outs.append((w @ v) / w.sum(-1, keepdim=True))
    return torch.cat(outs, 2)


def positive_attention(lq, lk, v):
    """The scalar stabiliser's masked sums for rows whose normaliser stays above the guard, the
    per-feature form's for the others (as the binary's operator does: per row, so no row's
    choice reads a later key)."""
    qf = (lq - lq.amax(-1, keepdim=True)).exp()  # per-query shift: cancels
    b = lk.amax(-1)                               # per-key log-weight: carried exactly
    num, den = _masked_sums(qf, (lk - b.unsqueeze(-1)).exp(), b, v)
    below = den < min_fast_normaliser(lk.shape[2], lk.shape[-1])
    fast = num / den.clamp_min(torch.finfo(den.dtype).tiny).unsqueeze(-1)  # the clamp touches replaced rows only
    if not bool(below.any()):
        return fast
    return torch.where(below.unsqueeze(-1), per_feature_attention(lq, lk, v), fast)


def _feature_attention(kernel, query, key, value, scaling):
    dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
    heads = query.shape[1]
    state = kernel.tensors(dtype, query.device)
    k, v = _repeat_kv(key, heads).to(dtype), _repeat_kv(value, heads).to(dtype)
    q = query.to(dtype)
    name, root = kernel.kernel_name, math.sqrt(scaling)
    if name in features.POSITIVE:
        lq = features.log_features(name, state, kernel.options, q * root, is_query=True)
        lk = features.log_features(name, state, kernel.options, k * root, is_query=False)
        return positive_attention(lq, lk, v)
    scale = root if features.scales_inputs(name) else 1.0
    qf, _ = features.signed_features(name, state, kernel.options, q * scale)
    kf, c = features.signed_features(name, state, kernel.options, k * scale)
    b = c if c is not None else torch.zeros(kf.shape[:3], dtype=dtype, device=kf.device)
    return causal_linear_attention(qf, kf, b, v, float(spec.option(name, kernel.options, "normaliser_floor")))


def _random(kernel, query, value):
    """Fresh U(0, 1) weights over the allowed keys from the layer's own CPU generator."""
    v = _repeat_kv(value, query.shape[1]).float()
    bsz, heads, s = v.shape[0], v.shape[1], v.shape[2]
    t = query.shape[2]
    u = torch.rand((bsz, heads, t, s), generator=kernel.generator, dtype=torch.float32).to(v.device)
    u = u.tril(s - t)
    return (u / u.sum(-1, keepdim=True)) @ v


def _constant(query, value):
    """The running mean of v up to each query's position."""
    v = _repeat_kv(value, query.shape[1]).float()
    t, s = query.shape[2], v.shape[2]
    counts = torch.arange(s - t + 1, s + 1, dtype=v.dtype, device=v.device).unsqueeze(-1)
    return v.cumsum(2)[..., s - t:, :] / counts


def _refuse_padding(attention_mask, t, s):
    """Feature kernels, like the binary, attend causally over every token: a padded batch would be
    silently wrong. Padding shows on the mask's diagonal (a pad token may not attend to itself),
    which causal and sliding-window masks always allow."""
    if attention_mask is None or t == 0:
        return
    rows = attention_mask[..., -t:, -s:]
    allowed = rows if rows.dtype == torch.bool else rows == 0
    diagonal = torch.diagonal(allowed, offset=s - t, dim1=-2, dim2=-1)
    if not bool(diagonal.all()):
        raise ValueError("darkformer_hf: a padded batch (the attention mask hides some tokens from themselves): "
                         "random-feature attention has no padding mask, as in the darkformer binary; use batch "
                         "size 1 or rows of equal length (lm-eval: --batch_size 1)")


_PACKED_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "cu_seqlens_q", "cu_seqlens_k")


def _refuse_packed(attention_mask, t, s, sliding_window, kwargs):
    """A packed batch (several documents per row: flash-attention's cu_seq_lens, or a block-diagonal
    mask) needs every running sum of a feature kernel restarted at each document's start. The
    binary does that (data.document_masking); this plug-in does not, so it refuses instead of
    attending across documents. A packed mask hides an earlier token from a later one on a layer
    without a sliding window (sliding layers hide old tokens by design and are not checked)."""
    if any(kwargs.get(k) is not None for k in _PACKED_KWARGS):
        raise ValueError("darkformer_hf: a packed batch (cu_seq_lens): random-feature attention here has no "
                         "per-document reset; run one document per row, or train and evaluate packed windows "
                         "with the darkformer binary (data.document_masking: true)")
    if attention_mask is None or t == 0 or sliding_window:
        return
    rows = attention_mask[..., -t:, -s:]
    allowed = rows if rows.dtype == torch.bool else rows == 0
    causal = torch.ones(t, s, dtype=torch.bool, device=allowed.device).tril(s - t)
    if bool((causal & ~allowed).any()):
        raise ValueError("darkformer_hf: a packed batch (the attention mask hides earlier tokens: documents "
                         "masked from each other): random-feature attention here has no per-document reset; "
                         "run one document per row, or use the darkformer binary (data.document_masking: true)")


def darkformer_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                         sliding_window=None, softcap=None, **kwargs):
    kernel = kernel_of(module, query.device)
    if scaling is None:
        scaling = module.head_dim ** -0.5
    name = kernel.kernel_name
    if name == "exact":
        return _exact(module, query, key, value, attention_mask, scaling, sliding_window, softcap, **kwargs)
    _refuse_padding(attention_mask, query.shape[2], key.shape[2])
    _refuse_packed(attention_mask, query.shape[2], key.shape[2], sliding_window, kwargs)
    if name == "random":
        out = _random(kernel, query, value)
    elif name == "constant":
        out = _constant(query, value)
    else:
        out = _feature_attention(kernel, query, key, value, scaling)
    return out.to(value.dtype).transpose(1, 2).contiguous(), None
