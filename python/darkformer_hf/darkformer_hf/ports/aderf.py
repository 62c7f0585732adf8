"""aderf (FAVOR#, derf_kernel.cpp): dense-exponential features, P_query for queries and P_key for
keys (sderf shares them)."""

from . import draw_shapes


def shapes(option, heads, head_dim):
    d = head_dim
    return {**draw_shapes(int(option("num_features")), d), "a": (d,), "p_query": (d, d), "p_key": (d, d)}


def log_features(state, option, x, is_query):
    from ..features import derf_log_features
    return derf_log_features(x, state["projection"], state["a"], state["p_query"] if is_query else state["p_key"])


PARITY_CASES = [("aderf", {"num_features": 32})]
