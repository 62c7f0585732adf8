"""flexformer (Flexformer, flexformer_kernel.cpp): trainable Fourier frequencies, c(x) = |x|^2/exp(tau)."""

import math


def shapes(option, heads, head_dim):
    m = int(option("num_features"))
    nonstationary = option("variant") == "nonstationary"
    return {"frequencies": (heads, 2, m, head_dim) if nonstationary else (heads, m, head_dim), "tau": (heads,)}


def signed_features(state, option, x):
    import torch
    w = state["frequencies"]
    n = float(w.shape[-2])
    c = x.pow(2).sum(-1) / state["tau"].exp().view(1, -1, 1)
    if option("variant") != "nonstationary":
        proj = x @ w.transpose(-1, -2).unsqueeze(0)
        return torch.cat([proj.cos(), proj.sin()], -1) / math.sqrt(n), c
    w1, w2 = 0.5 * (w[:, 0] + w[:, 1]), 0.5 * (w[:, 0] - w[:, 1])  # 004 eq. 6
    p1 = x @ w1.transpose(-1, -2).unsqueeze(0)
    c2 = (x @ w2.transpose(-1, -2).unsqueeze(0)).cos()
    return torch.cat([p1.cos() * c2, p1.sin() * c2], -1) / math.sqrt(n), c


PARITY_CASES = [("flexformer", {"num_features": 32, "variant": "nonstationary"})]
