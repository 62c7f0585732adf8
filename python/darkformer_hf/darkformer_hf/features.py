"""Feature maps of darkformer's kernels: the math several ports share, and the dispatch to each
kernel's port (ports/<name>.py, written from src/attention/<name>_kernel.cpp).

Every map takes x (already sqrt(s) q, or q itself for slay) as BHLD in fp32 and returns:
- positive kernels: log phi (BHLM), stabilised later as in positive_features.h;
- signed kernels: (f, c) with phi = exp(c) f, c undefined (None) for slay.
`state` holds the layer's tensors under our checkpoint names (projection, M, W, a, psi, ...).
"""

import math

import torch

from . import spec
from .ports import port

POSITIVE = tuple(n for n in spec.KERNELS if spec.family(n) == "positive")
SIGNED = tuple(n for n in spec.KERNELS if spec.family(n) == "signed")


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


def log_features(name, state, options, x, is_query):
    if name not in POSITIVE:
        raise ValueError(f"'{name}' is not a positive-feature kernel")
    return port(name).log_features(state, lambda key: spec.option(name, options, key), x, is_query)


def gauss_laguerre(n):
    """Golub-Welsch for the n-point Gauss-Laguerre rule, fp64 (slay_kernel.cpp)."""
    jacobi = torch.diag(2 * torch.arange(n, dtype=torch.float64) + 1)
    if n > 1:
        off = torch.arange(1, n, dtype=torch.float64)
        jacobi = jacobi + torch.diag(off, 1) + torch.diag(off, -1)
    nodes, vectors = torch.linalg.eigh(jacobi)
    return nodes, vectors[0].pow(2)


def signed_features(name, state, options, x):
    """(f(x), c(x)) of a signed map: phi = exp(c) f."""
    if name not in SIGNED:
        raise ValueError(f"'{name}' is not a signed-feature kernel")
    return port(name).signed_features(state, lambda key: spec.option(name, options, key), x)


def scales_inputs(name):
    """Whether the map sees x = sqrt(s) q (the default) or q itself (a kernel of directions)."""
    return getattr(port(name), "SCALES_INPUTS", True)
