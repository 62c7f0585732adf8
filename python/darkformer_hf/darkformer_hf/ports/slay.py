"""slay (SLAY, slay_kernel.cpp): the spherical Yat kernel of unit q, k by Gauss-Laguerre quadrature."""

import math

from . import draw_shapes

SCALES_INPUTS = False  # a kernel of directions: the map sees q itself


def shapes(option, heads, head_dim):
    out = draw_shapes(int(option("num_features")), head_dim)
    p = int(option("sketch_dim"))
    if p > 0:
        out["sketch"] = (2, p, head_dim)
    return out


def signed_features(state, option, x):
    import torch
    from ..features import gauss_laguerre
    unit = x / x.norm(2, -1, keepdim=True).clamp_min(1e-12)
    sketch_dim = int(option("sketch_dim"))
    if sketch_dim > 0:
        s = state["sketch"]
        poly = (unit @ s[0].t()) * (unit @ s[1].t()) / math.sqrt(float(sketch_dim))
    else:
        poly = (unit.unsqueeze(-1) * unit.unsqueeze(-2)).flatten(-2)
    epsilon, nodes = float(option("epsilon")), int(option("nodes"))
    u, a = gauss_laguerre(nodes)
    c, w = 2 + epsilon, state["projection"]
    proj = unit @ w.t()
    parts = []
    for i in range(nodes):
        beta, weight = 2 * u[i].item() / c, math.sqrt(a[i].item() / c)
        exp = (math.sqrt(beta) * proj - 0.5 * beta).exp() / math.sqrt(float(w.shape[0]))
        parts.append((weight * poly.unsqueeze(-1) * exp.unsqueeze(-2)).flatten(-2))
    return torch.cat(parts, -1), None


PARITY_CASES = [("slay", {}), ("slay-exact-poly", {"sketch_dim": 0, "num_features": 8})]
