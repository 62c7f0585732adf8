"""lfk (lfk_kernel.cpp): Performer features with a trainable W."""


def shapes(option, heads, head_dim):
    return {"W": (int(option("num_features")), head_dim)}


def log_features(state, option, x, is_query):
    from ..features import log_positive_features
    return log_positive_features(x, state["W"])


PARITY_CASES = [("lfk", {"num_features": 32})]
