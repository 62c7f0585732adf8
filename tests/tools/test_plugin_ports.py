"""The HF plug-in ports every registered kernel, with the binary's option defaults (issues 41, 54).

Reads `darkformer inspect --kernels --json` (needs build/darkformer) and checks against it:
  - darkformer_hf/kernels.jsonl, the plug-in's copy of it, is current (regenerate:
    build/darkformer inspect --kernels --json > python/darkformer_hf/darkformer_hf/kernels.jsonl);
  - every registered kernel has a port (darkformer_hf/ports/<name>.py) with shapes, the feature
    function of its family and parity cases (test_hf_plugin.py runs them);
  - tools/kernel_registry.py (what aggregate_runs.py and plot_runs.py read) lists them all.
"""

import ast
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testkit as tk  # noqa: E402

sys.path.insert(0, os.path.join(tk.SOURCE_DIR, "python", "darkformer_hf"))
sys.path.insert(0, os.path.join(tk.SOURCE_DIR, "tools"))
from darkformer_hf import features, ports, spec  # noqa: E402
import kernel_registry  # noqa: E402

failures = []


def check(ok, what, detail=""):
    print(("ok   " if ok else "FAIL ") + what + (f" ({detail})" if detail and not ok else ""), flush=True)
    if not ok:
        failures.append(what)


def main():
    os.environ.setdefault("DARKFORMER_BIN", tk.BINARY)
    binary = {k["name"]: k for k in kernel_registry.kernels()}
    family = lambda f: {n for n, k in binary.items() if k["family"] == f}  # noqa: E731
    check(len(binary) >= 13, f"the binary lists {len(binary)} kernels")
    res = tk.run(["inspect", "--kernels", "--json"])
    shipped = open(spec._KERNELS_FILE).read()
    check(res.returncode == 0 and shipped == res.stdout, "darkformer_hf/kernels.jsonl = the binary's inspect --kernels --json",
          "regenerate it: build/darkformer inspect --kernels --json > python/darkformer_hf/darkformer_hf/kernels.jsonl")
    check(list(spec.KERNELS) == list(binary), "spec.KERNELS = the registered kernels, in the binary's order")
    check(set(features.POSITIVE) == family("positive") and set(features.SIGNED) == family("signed"),
          "features.POSITIVE / SIGNED = the binary's families")
    for name in binary:
        try:
            module = ports.port(name)
        except KeyError as e:
            check(False, f"{name}: has a port", str(e))
            continue
        needs = {"positive": "log_features", "signed": "signed_features"}.get(binary[name]["family"])
        check(callable(getattr(module, "shapes", None)) and (needs is None or callable(getattr(module, needs, None))),
              f"{name}: its port has shapes{' and ' + needs if needs else ''}")
        check(name == "exact" or bool(getattr(module, "PARITY_CASES", [])),
              f"{name}: its port has parity cases (test_hf_plugin.py runs them; exact has its own)")
        # Every option a port reads exists in the binary, with the binary's default.
        read = []
        module.shapes(lambda key: read.append(key) or spec.option(name, {}, key), 2, 8)
        check(all(key in binary[name]["options"] for key in read), f"{name}: the options its shapes read exist",
              str(read))
    order = kernel_registry.display_order()
    check(sorted(order) == sorted(binary) and order[:3] == ["exact", "darkformer", "performer"],
          "kernel_registry.display_order(): every kernel, exact / darkformer / performer first", str(order))
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
