"""The registered attention kernels, asked of the binary (`darkformer inspect --kernels --json`):
their names (in the registry's order), families (exact, positive, signed, baseline) and option
defaults. The tools read them here rather than keep a copy, so a new kernel appears in every table
without touching them.

The binary: $DARKFORMER_BIN, else $DARKFORMER_BINARY_DIR/darkformer (as the tests set it), else
build/darkformer of this checkout.
"""

import functools
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def binary():
    if os.environ.get("DARKFORMER_BIN"):
        return os.environ["DARKFORMER_BIN"]
    folder = os.environ.get("DARKFORMER_BINARY_DIR") or os.path.join(ROOT, "build")
    return os.path.join(folder, "darkformer")


@functools.lru_cache(maxsize=None)
def kernels():
    """One dict per registered kernel: name, family, log_form, learns, buffers, options (defaults)."""
    path = binary()
    if not os.path.isfile(path):
        raise SystemExit(f"the kernel list comes from the darkformer binary, and there is none at {path}: "
                         "build it (tools/build.sh) or set DARKFORMER_BIN")
    res = subprocess.run([path, "inspect", "--kernels", "--json"], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"{path} inspect --kernels --json failed ({res.returncode}): {res.stderr.strip()}")
    return tuple(json.loads(line) for line in res.stdout.splitlines() if line.strip())


def names(family=None):
    return [k["name"] for k in kernels() if family is None or k["family"] == family]


def with_option(option):
    """Kernels that have `option` (e.g. num_features: the m of a label)."""
    return tuple(k["name"] for k in kernels() if option in k["options"])


def display_order():
    """The order tables and legends list the kernels in: the binary's, declared once in its registry
    (src/attention/kernel_registry.cpp: exact, the paper's kernels, the seeds', the baselines; a
    kernel registered later after them)."""
    return names()
