"""sderf (FAVOR#, derf_kernel.cpp): aderf's tensors and features; only the calibration that sets
them differs (Thm 4.3's rotation and per-coordinate A, in the binary)."""

from .aderf import log_features, shapes  # noqa: F401

PARITY_CASES = [("sderf", {"num_features": 32})]
