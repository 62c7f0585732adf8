"""The transformers plug-in's positive-feature attention at scales where the scalar stabiliser's
normaliser underflows (issue 38; docs/kernels.md, "The normaliser at any scale"): Performer
features of |x| = |y| in {10, 30, 60, 100} with keys pointing away from the queries. Outputs and
q/k/v gradients are finite and match an fp64 log-space reference,
out_t = sum_j softmax_j(logsumexp_i(a_ti + l_ji)) v_j, within 1e-4 / 1e-3 (relative) up to |x| = 30
and max(1e-4, 4 A 2^-24) / 10x beyond (A = max |log phi|: fp32's rounding of the arguments).
Keys a mask hides (padding, another document) move no stabiliser: with every third key hidden and
turned to face the queries (were they counted, the kept terms would underflow), the output and
gradients are the reference's over the kept keys, by the same bounds; a query without keys gives 0
and finite gradients. Also: where the scalar form's normaliser stays above its guard the plug-in
returns it unchanged. Needs only torch (no binary)."""

import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testkit as tk  # noqa: E402

sys.path.insert(0, os.path.join(tk.SOURCE_DIR, "python", "darkformer_hf"))
from darkformer_hf import attention, features  # noqa: E402

failures = []
check = tk.checker(failures)
HEADS, LENGTH, DIM, M = 2, 40, 8, 16



def inputs(norm, seed):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(1, HEADS, LENGTH + 1, DIM, generator=g, dtype=torch.float64)
    u = u / u.norm(dim=-1, keepdim=True)
    x, y = norm * u[:, :, 1:], -norm * u[:, :, :-1]  # y_t = -x_{t-1}
    v = torch.randn(1, HEADS, LENGTH, DIM, generator=g, dtype=torch.float64)
    w = torch.randn(M, DIM, generator=g, dtype=torch.float64)
    return x, y, v, w


CAUSAL = torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril()


def hiding(x, y, norm):
    """Every third key hidden and facing its query (y_j = x_j: the largest log-features), and the first
    query without any key."""
    hidden = torch.arange(LENGTH) % 3 == 1
    y = torch.where(hidden.view(1, 1, LENGTH, 1), x, y)
    allowed = CAUSAL & hidden.logical_not().unsqueeze(0)
    allowed[0] = False
    return y, allowed


def reference(x, y, v, w, allowed=CAUSAL):
    """Rows without keys give 0."""
    lq, lk = features.log_positive_features(x, w), features.log_positive_features(y, w)
    scores = (lq.unsqueeze(3) + lk.unsqueeze(2)).logsumexp(-1).masked_fill(allowed.logical_not(), float("-inf"))
    any_key = allowed.any(-1, keepdim=True)
    out = torch.softmax(scores.masked_fill(any_key.logical_not(), 0.0), -1) @ v
    kept = lk.masked_fill(allowed.any(0).logical_not().view(1, 1, LENGTH, 1), 0.0)
    return out * any_key, float(max(lq.abs().max(), kept.abs().max()).detach())


def run(fn, x, y, v, w, dtype, weights):
    leaves = [t.detach().to(dtype).clone().requires_grad_() for t in (x, y, v)]
    out = fn(*leaves, w.to(dtype))
    (out * weights.to(dtype)).sum().backward()
    return out.detach(), [t.grad for t in leaves]


def ours(x, y, v, w, allowed=CAUSAL):
    return attention.positive_attention(features.log_positive_features(x, w), features.log_positive_features(y, w), v,
                                        allowed)


def rel(a, b):
    return float((a.double() - b).abs().max() / b.abs().max())


def compare(label, norm, x, y, v, w, weights, allowed):
    def masked(fn):
        return lambda *t: fn(*t, allowed)
    ref_out, ref_grads = run(masked(lambda *t: reference(*t)[0]), x, y, v, w, torch.float64, weights)
    a = reference(x, y, v, w, allowed)[1]
    tol = 1e-4 if norm <= 30 else max(1e-4, 4 * a * 2.0 ** -24)
    out, grads = run(masked(ours), x, y, v, w, torch.float32, weights)
    finite = bool(torch.isfinite(out).all()) and all(bool(torch.isfinite(g).all()) for g in grads)
    check(finite, f"{label}: output and q, k, v gradients finite")
    err = rel(out, ref_out)
    check(err <= tol, f"{label}: output within {tol:.1e} of the fp64 reference ({err:.2e})")
    for name, g, r in zip("qkv", grads, ref_grads):
        err = rel(g, r)
        check(err <= 10 * tol, f"{label}: d{name} within {10 * tol:.1e} ({err:.2e})")
    return out


def main():
    for norm in (10.0, 30.0, 60.0, 100.0):
        x, y, v, w = inputs(norm, seed=int(norm))
        weights = torch.randn(1, HEADS, LENGTH, DIM, dtype=torch.float64)
        compare(f"|x| = {norm:g}", norm, x, y, v, w, weights, CAUSAL)
        y, allowed = hiding(x, y, norm)
        out = compare(f"|x| = {norm:g}, keys hidden", norm, x, y, v, w, weights, allowed)
        check(bool((out[:, :, 0] == 0).all()), f"|x| = {norm:g}: a query without keys gives 0")
    # At a moderate scale the scalar form is returned as it was (no fallback).
    x, y, v, w = inputs(2.0, seed=2)
    lq, lk = features.log_positive_features(x.float(), w.float()), features.log_positive_features(y.float(), w.float())
    qf = (lq - lq.amax(-1, keepdim=True)).exp()
    b = lk.amax(-1)
    num, den = attention._masked_sums(qf, (lk - b.unsqueeze(-1)).exp(), b, v.float(), CAUSAL)
    check(bool(torch.equal(attention.positive_attention(lq, lk, v.float(), CAUSAL), num / den.unsqueeze(-1))),
          "|x| = 2: the scalar form's result, unchanged")
    check(math.isfinite(float(den.min())) and float(den.min()) >= attention.min_fast_normaliser(LENGTH, M),
          "|x| = 2: its normaliser is above the guard")
    return tk.report(failures)


if __name__ == "__main__":
    sys.exit(main())
