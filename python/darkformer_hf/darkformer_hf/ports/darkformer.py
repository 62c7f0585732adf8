"""darkformer (darkformer_kernel.cpp): phi(x) = exp(W(Mx) - |Mx|^2/2)/sqrt(m), M per head or shared;
apply_to: queries leaves the keys unmapped (Performer's phi of the key)."""

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
    return log_positive_features(mx, state["projection"])


PARITY_CASES = [("darkformer", {"num_features": 32, "init": "whitening"}),
                ("darkformer-shared-r8", {"num_features": 32, "share_across_heads": True, "rank": 8}),
                ("darkformer-queries", {"num_features": 32, "apply_to": "queries"})]
