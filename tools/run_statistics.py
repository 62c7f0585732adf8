"""Student-t confidence intervals over seeds, standard library only (aggregate_runs.py and the
tools that pair or compare runs import them from here)."""
import functools
import math

CONFIDENCE = 0.95


# ---- Student t quantiles (standard library only) -------------------------------------------------

def _betacf(a, b, x):
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a, b, x):
    """Regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t, dof):
    """P(T <= t) for Student's t with dof degrees of freedom."""
    tail = 0.5 * _betainc(dof / 2.0, 0.5, dof / (dof + t * t))
    return 1.0 - tail if t >= 0 else tail


@functools.lru_cache(maxsize=None)
def t_quantile(p, dof):
    """The p-quantile of Student's t with dof degrees of freedom (bisection on t_cdf; p in (0.5, 1))."""
    if not 0.5 <= p < 1.0 or dof < 1:
        raise ValueError(f"t_quantile needs 0.5 <= p < 1 and dof >= 1, got p={p}, dof={dof}")
    lo, hi = 0.0, 1.0
    while t_cdf(hi, dof) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, dof) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def interval(values, confidence=CONFIDENCE):
    """Mean and Student-t confidence interval of the finite values (None and NaN are left out).

    Returns {n, mean, std, half_width, low, high}: std is the sample standard deviation (n - 1);
    with n = 1 std, half_width, low and high are None (no interval from one seed); with n = 0 all
    but n are None."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(finite)
    out = {"n": n, "mean": None, "std": None, "half_width": None, "low": None, "high": None}
    if n == 0:
        return out
    mean = math.fsum(finite) / n
    out["mean"] = mean
    if n >= 2:
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in finite) / (n - 1))
        half = t_quantile(0.5 + confidence / 2.0, n - 1) * std / math.sqrt(n)
        out.update(std=std, half_width=half, low=mean - half, high=mean + half)
    return out
