"""Tests of tools/swap_draws.py (a trained model under another draw) on small HDF5 files (no
binary): the copy holds the donor's projections bit for bit and every other tensor and attribute
of the checkpoint unchanged; the checkpoint itself is untouched; a donor without a layer's
projection, with another shape, or a checkpoint with no projection: exit 2 naming the tensor, no
output written.
"""

import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testkit as tk  # noqa: E402
from test_aggregate_runs import TOOLS, check, failures  # noqa: E402

TOOL = os.path.join(TOOLS, "swap_draws.py")
PROJ = "layers.{}.self_attn.kernel.projection"


def write(path, seed, layers=2, shape=(8, 4), with_projection=True):
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as h5:
        h5.attrs["attention_yaml"] = "kernel: performer"
        h5["embed_tokens.weight"] = rng.standard_normal((10, 4)).astype(np.float32)
        for layer in range(layers):
            h5[f"layers.{layer}.self_attn.kernel.draw_seed"] = np.int64(seed)
            if with_projection:
                h5.create_dataset(PROJ.format(layer), data=rng.standard_normal(shape).astype(np.float32),
                                  chunks=True, fletcher32=True)


def swap(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)


def main():
    with tempfile.TemporaryDirectory(prefix="swap-draws-") as work:
        own, donor, out = (os.path.join(work, n) for n in ("own.h5", "donor.h5", "out.h5"))
        write(own, 1)
        write(donor, 2)
        with h5py.File(own) as h5:
            before = {k: h5[k][()] for k in h5}
        result = swap(own, donor, out)
        check(result.returncode == 0, f"swap succeeds ({result.returncode}: {result.stderr.strip()})")
        with h5py.File(out) as copy, h5py.File(donor) as other, h5py.File(own) as original:
            for layer in range(2):
                name = PROJ.format(layer)
                check(np.array_equal(copy[name][()], other[name][()]), f"{name}: the donor's draw")
                check(copy[name].fletcher32, f"{name}: still checksummed")
            kept = [k for k in before if not k.endswith(".projection")]
            check(all(np.array_equal(copy[k][()], before[k]) for k in kept), "every other tensor unchanged")
            check(copy.attrs["attention_yaml"] == "kernel: performer", "attributes kept")
            check(all(np.array_equal(original[k][()], before[k]) for k in before), "the checkpoint untouched")
        for label, make_donor, culprit in [
            ("a donor with fewer layers", lambda p: write(p, 3, layers=1), PROJ.format(1)),
            ("a donor with another shape", lambda p: write(p, 3, shape=(16, 4)), PROJ.format(0)),
        ]:
            bad, target = os.path.join(work, "bad.h5"), os.path.join(work, "bad-out.h5")
            make_donor(bad)
            result = swap(own, bad, target)
            check(result.returncode == 2 and culprit in result.stderr and not os.path.exists(target),
                  f"{label}: exit 2 naming {culprit}, nothing written ({result.returncode}: {result.stderr.strip()})")
        exact = os.path.join(work, "exact.h5")
        write(exact, 4, with_projection=False)
        result = swap(exact, donor, os.path.join(work, "exact-out.h5"))
        check(result.returncode == 2 and "projection" in result.stderr, f"no draw to swap: exit 2 ({result.stderr.strip()})")
    return tk.report(failures)


if __name__ == "__main__":
    sys.exit(main())
