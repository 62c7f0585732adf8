"""exact: softmax attention through transformers' SDPA path (attention.py); no kernel state."""


def shapes(option, heads, head_dim):
    return {}


PARITY_CASES = []  # test_hf_plugin.py's exact_case checks an exact model exports as before
