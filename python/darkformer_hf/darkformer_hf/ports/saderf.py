"""saderf (FAVOR#, saderf_kernel.cpp): gerf on psi x and x / psi."""

from . import draw_shapes


def shapes(option, heads, head_dim):
    return {**draw_shapes(int(option("num_features")), head_dim), "a": (1,), "psi": (head_dim,)}


def log_features(state, option, x, is_query):
    from ..features import gerf_log_features
    psi = state["psi"]
    return gerf_log_features(x * psi if is_query else x / psi, state["projection"], state["a"])


PARITY_CASES = [("saderf", {"num_features": 32})]
