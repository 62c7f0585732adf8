"""performer (FAVOR+, performer_kernel.cpp): phi(x) = exp(Wx - |x|^2/2)/sqrt(m)."""

from . import draw_shapes


def shapes(option, heads, head_dim):
    return draw_shapes(int(option("num_features")), head_dim)


def log_features(state, option, x, is_query):
    from ..features import log_positive_features
    return log_positive_features(x, state["projection"])


PARITY_CASES = [("performer", {"num_features": 32})]
