"""Feature maps of darkformer's kernels, ported from src/attention/*_kernel.cpp.

Every map takes x (already sqrt(s) q, or q itself for slay) as BHLD in fp32 and returns:
- positive kernels: log phi (BHLM), stabilised later as in positive_features.h;
- signed kernels: (f, c) with phi = exp(c) f, c undefined (None) for slay.
`state` holds the layer's tensors under our checkpoint names (projection, M, W, a, psi, ...).
"""

import math

import torch

from . import spec

POSITIVE = ("performer", "darkformer", "lfk", "gerf", "saderf", "aderf", "sderf")
SIGNED = ("trig", "slay", "flexformer")


def log_positive_features(x, w):
    """LogPositiveFeatures: x W^T - |x|^2/2 - log(m)/2 for W (M, D) shared or (H, M, D) per head."""
    m = w.shape[-2]
    proj = x @ w.t() if w.dim() == 2 else x @ w.transpose(-1, -2).unsqueeze(0)
    return proj - (0.5 * x.pow(2).sum(-1, keepdim=True) + 0.5 * math.log(m))


def gerf_log_features(x, w, a):
    """GerfLogFeatures (002 eq. 10): B w.x + log D + A |w|^2 - log(m)/2 - |x|^2/2."""
    d, m = x.shape[-1], w.shape[0]
    one_minus_4a = 1 - 4 * a
    per_feature = 0.25 * d * one_minus_4a.log() + a * w.pow(2).sum(1) - 0.5 * math.log(m)
    return (x @ w.t()) * one_minus_4a.sqrt() + per_feature - 0.5 * x.pow(2).sum(-1, keepdim=True)


def derf_log_features(x, w, a, p):
    """DerfLogFeatures (002 sec. 4, A diagonal): z = P x, then per coordinate l
    log(1-4a_l)/4 + a_l w_l^2 + sqrt(1-4a_l) w_l z_l, summed, - |z|^2/2 - log(m)/2."""
    m = w.shape[0]
    one_minus_4a = 1 - 4 * a
    z = x @ p.t()
    per_feature = 0.25 * one_minus_4a.log().sum() + w.pow(2) @ a - 0.5 * math.log(m)
    return (z * one_minus_4a.sqrt()) @ w.t() + per_feature - 0.5 * z.pow(2).sum(-1, keepdim=True)


def log_features(name, state, x, is_query):
    if name == "performer":
        return log_positive_features(x, state["projection"])
    if name == "lfk":
        return log_positive_features(x, state["W"])
    if name == "darkformer":
        mx = x @ state["M"].transpose(-1, -2).unsqueeze(0)  # M per head (H, r, d) or shared (1, r, d)
        return log_positive_features(mx, state["projection"])
    if name == "gerf":
        return gerf_log_features(x, state["projection"], state["a"])
    if name == "saderf":
        psi = state["psi"]
        return gerf_log_features(x * psi if is_query else x / psi, state["projection"], state["a"])
    if name in ("aderf", "sderf"):
        p = state["p_query"] if is_query else state["p_key"]
        return derf_log_features(x, state["projection"], state["a"], p)
    raise ValueError(f"'{name}' is not a positive-feature kernel")


def gauss_laguerre(n):
    """Golub-Welsch for the n-point Gauss-Laguerre rule, fp64 (slay_kernel.cpp)."""
    jacobi = torch.diag(2 * torch.arange(n, dtype=torch.float64) + 1)
    if n > 1:
        off = torch.arange(1, n, dtype=torch.float64)
        jacobi = jacobi + torch.diag(off, 1) + torch.diag(off, -1)
    nodes, vectors = torch.linalg.eigh(jacobi)
    return nodes, vectors[0].pow(2)


def slay_features(state, options, x):
    unit = x / x.norm(2, -1, keepdim=True).clamp_min(1e-12)
    sketch_dim = int(spec.option("slay", options, "sketch_dim"))
    if sketch_dim > 0:
        s = state["sketch"]
        poly = (unit @ s[0].t()) * (unit @ s[1].t()) / math.sqrt(float(sketch_dim))
    else:
        poly = (unit.unsqueeze(-1) * unit.unsqueeze(-2)).flatten(-2)
    epsilon, nodes = float(spec.option("slay", options, "epsilon")), int(spec.option("slay", options, "nodes"))
    u, a = gauss_laguerre(nodes)
    c, w = 2 + epsilon, state["projection"]
    proj = unit @ w.t()
    parts = []
    for i in range(nodes):
        beta, weight = 2 * u[i].item() / c, math.sqrt(a[i].item() / c)
        exp = (math.sqrt(beta) * proj - 0.5 * beta).exp() / math.sqrt(float(w.shape[0]))
        parts.append((weight * poly.unsqueeze(-1) * exp.unsqueeze(-2)).flatten(-2))
    return torch.cat(parts, -1)


def flexformer_features(state, options, x):
    w = state["frequencies"]
    n = float(w.shape[-2])
    if spec.option("flexformer", options, "variant") != "nonstationary":
        proj = x @ w.transpose(-1, -2).unsqueeze(0)
        return torch.cat([proj.cos(), proj.sin()], -1) / math.sqrt(n)
    w1, w2 = 0.5 * (w[:, 0] + w[:, 1]), 0.5 * (w[:, 0] - w[:, 1])  # 004 eq. 6
    p1 = x @ w1.transpose(-1, -2).unsqueeze(0)
    c2 = (x @ w2.transpose(-1, -2).unsqueeze(0)).cos()
    return torch.cat([p1.cos() * c2, p1.sin() * c2], -1) / math.sqrt(n)


def signed_features(name, state, options, x):
    """(f(x), c(x)) of a signed map: phi = exp(c) f."""
    if name == "trig":
        w = state["projection"]
        proj = x @ w.t()
        f = torch.cat([proj.sin(), proj.cos()], -1) / math.sqrt(float(w.shape[0]))
        return f, 0.5 * x.pow(2).sum(-1)
    if name == "slay":
        return slay_features(state, options, x), None
    if name == "flexformer":
        c = x.pow(2).sum(-1) / state["tau"].exp().view(1, -1, 1)
        return flexformer_features(state, options, x), c
    raise ValueError(f"'{name}' is not a signed-feature kernel")
