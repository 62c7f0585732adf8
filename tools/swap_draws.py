#!/usr/bin/env python3
"""A trained random-feature model under another draw: copy CHECKPOINT to OUT with every layer's
fixed draw (`*.kernel.projection`, the W of performer / darkformer / lfk ...) taken from DONOR, a
checkpoint of the same model and kernel shapes (an independent draw from the same law when DONOR's
train.seed differs). Everything else is copied bit for bit; HDF5 recomputes the chunks' Fletcher32
checksums on write. Then `darkformer eval --checkpoint OUT` says how much of the model fits its own
sample: a learned proposal that lowers the variance keeps its accuracy under a fresh draw.

  tools/swap_draws.py CHECKPOINT DONOR OUT

A missing or mis-shaped projection in DONOR, or none in CHECKPOINT: exit 2 naming the tensor, OUT
not written.
"""

import os
import shutil
import sys

import h5py

SUFFIX = ".kernel.projection"


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv):
    if len(argv) != 3:
        fail("usage: swap_draws.py CHECKPOINT DONOR OUT")
    checkpoint, donor, out = argv
    for path in (checkpoint, donor):
        if not os.path.isfile(path):
            fail(f"{path}: no such file")
    with h5py.File(checkpoint, "r") as own, h5py.File(donor, "r") as other:
        names = sorted(k for k in own.keys() if k.endswith(SUFFIX))
        if not names:
            fail(f"{checkpoint}: no '*{SUFFIX}' tensor (not a random-feature model with a fixed draw)")
        for name in names:
            if name not in other:
                fail(f"{donor}: no tensor '{name}' (needed by {checkpoint})")
            if other[name].shape != own[name].shape or other[name].dtype != own[name].dtype:
                fail(f"{donor}: tensor '{name}' is {other[name].dtype}{other[name].shape}, "
                     f"{checkpoint} has {own[name].dtype}{own[name].shape}")
        draws = {name: other[name][()] for name in names}
    partial = out + ".partial"
    shutil.copyfile(checkpoint, partial)
    with h5py.File(partial, "r+") as copy:
        for name, value in draws.items():
            copy[name][...] = value
    os.replace(partial, out)
    print(f"wrote {out}: {len(draws)} draws from {donor}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
