"""constant: the running mean of v (attention.py); no kernel state."""


def shapes(option, heads, head_dim):
    return {}


PARITY_CASES = [("constant", {})]
