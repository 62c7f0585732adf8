"""trig (RFA, trig_kernel.cpp): f(x) = [sin Wx, cos Wx]/sqrt(m), c(x) = |x|^2/2."""

import math

from . import draw_shapes


def shapes(option, heads, head_dim):
    return draw_shapes(int(option("num_features")), head_dim)


def signed_features(state, option, x):
    import torch
    w = state["projection"]
    proj = x @ w.t()
    f = torch.cat([proj.sin(), proj.cos()], -1) / math.sqrt(float(w.shape[0]))
    return f, 0.5 * x.pow(2).sum(-1)


PARITY_CASES = [("trig", {"num_features": 32})]
