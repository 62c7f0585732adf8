"""gerf (FAVOR++, gerf_kernel.cpp): phi(x) = D exp(A|w|^2 + B w.x - |x|^2/2)/sqrt(m)."""

from . import draw_shapes


def shapes(option, heads, head_dim):
    return {**draw_shapes(int(option("num_features")), head_dim), "a": (1,)}


def log_features(state, option, x, is_query):
    from ..features import gerf_log_features
    return gerf_log_features(x, state["projection"], state["a"])


PARITY_CASES = [("gerf", {"num_features": 32, "a": "optimal"})]
