"""The registered attention kernels, asked of the binary (`darkformer inspect --kernels --json`):
their names, families (exact, positive, signed, baseline) and option defaults. The tools read them
here rather than keep a copy, so a new kernel appears in every table without touching them.

The binary: $DARKFORMER_BIN, else $DARKFORMER_BINARY_DIR/darkformer (as the tests set it), else
build/darkformer of this checkout.
"""

import functools
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILY_ORDER = ("exact", "positive", "signed", "baseline")
# Presentation only, the tables' and legends' row order: exact, the paper's kernels, the seeds'
# kernels, the baselines. A registered kernel not named here still appears, after these, by
# family and name; a name here that is not registered is skipped.
LEADING = ("exact", "darkformer", "performer", "lfk", "gerf", "saderf", "aderf", "sderf", "trig", "slay",
           "flexformer", "random", "constant")


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
    """LEADING's order, then any other registered kernel by family (positive, signed, baseline) and name."""
    rest = sorted((k for k in kernels() if k["name"] not in LEADING),
                  key=lambda k: (FAMILY_ORDER.index(k["family"]), k["name"]))
    return [n for n in LEADING if n in names()] + [k["name"] for k in rest]
