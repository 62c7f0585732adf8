"""random: fresh uniform weights per call from the layer's own CPU generator (attention.py)."""


def shapes(option, heads, head_dim):
    return {}


PARITY_CASES = [("random", {"seed": 5})]
