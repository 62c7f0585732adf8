"""darkformer (darkformer_kernel.cpp): phi(x) = exp(W(Mx) - |Mx|^2/2)/sqrt(m), M per head or shared;
apply_to: queries leaves the keys unmapped (Performer's phi of the key); target: softmax weights each
feature by sqrt(p_I(M^T w) / p_Sigma(M^T w)) on each side, so the features estimate exp(x^T y)."""

import math

import torch

from . import draw_shapes


def shapes(option, heads, head_dim):
    rank = int(option("rank") or head_dim)
    out = draw_shapes(int(option("num_features")), rank)
    out["M"] = (1 if bool(option("share_across_heads")) else heads, rank, head_dim)
    return out


def log_features(state, option, x, is_query):
    from ..features import log_positive_features
    if option("apply_to") == "queries" and not is_query:
        return log_positive_features(x, state["projection"])
    mx = x @ state["M"].transpose(-1, -2).unsqueeze(0)  # M per head (H, r, d) or shared (1, r, d)
    if option("target") == "softmax":
        return importance_weighted_log_features(x, mx, state["M"], state["projection"])
    return log_positive_features(mx, state["projection"])


def importance_weighted_log_features(x, mx, m, w):
    """w.(Mx) - |x|^2/2 - log(m)/2 + log rho(w)/2, log rho = (|w|^2 - |M^T w|^2)/2 + log|det M|."""
    mtw = w.unsqueeze(0) @ m  # (N, features, d): rows (M^T w)^T
    half_log_rho = (0.25 * (w.pow(2).sum(-1).unsqueeze(0) - mtw.pow(2).sum(-1))
                    + 0.5 * torch.linalg.slogdet(m)[1].unsqueeze(-1))
    offset = 0.5 * x.pow(2).sum(-1, keepdim=True) + 0.5 * math.log(w.shape[0])
    return mx @ w.t() - offset + half_log_rho.unsqueeze(0).unsqueeze(2)


PARITY_CASES = [("darkformer", {"num_features": 32, "init": "whitening"}),
                ("darkformer-shared-r8", {"num_features": 32, "share_across_heads": True, "rank": 8}),
                ("darkformer-queries", {"num_features": 32, "apply_to": "queries"}),
                ("darkformer-softmax", {"num_features": 32, "init": "whitening", "target": "softmax"})]
