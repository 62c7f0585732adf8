"""The HF plug-in ports every registered kernel, with the binary's option defaults (issue 41).

Reads `darkformer inspect --kernels --json` (needs build/darkformer) and checks against it:
  - darkformer_hf.spec.KERNELS names exactly the registered kernels, and features.POSITIVE /
    SIGNED exactly the positive and signed families;
  - every default in spec.OPTION_DEFAULTS equals the binary's for that kernel and option;
  - test_hf_plugin.py's parity cases run every registered kernel;
  - tools/kernel_registry.py (what aggregate_runs.py and plot_runs.py read) lists them all.
"""

import ast
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testkit as tk  # noqa: E402

sys.path.insert(0, os.path.join(tk.SOURCE_DIR, "python", "darkformer_hf"))
sys.path.insert(0, os.path.join(tk.SOURCE_DIR, "tools"))
from darkformer_hf import features, spec  # noqa: E402
import kernel_registry  # noqa: E402

failures = []


def check(ok, what, detail=""):
    print(("ok   " if ok else "FAIL ") + what + (f" ({detail})" if detail and not ok else ""), flush=True)
    if not ok:
        failures.append(what)


def parity_case_kernels():
    """The kernels test_hf_plugin.py's CASES run, read from its source (no transformers import)."""
    tree = ast.parse(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_hf_plugin.py")).read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "CASES" for t in node.targets):
            cases = ast.literal_eval(node.value)
            return {attention["kernel"] for _, _, attention in cases}
    return set()


def main():
    os.environ.setdefault("DARKFORMER_BIN", tk.BINARY)
    binary = {k["name"]: k for k in kernel_registry.kernels()}
    family = lambda f: {n for n, k in binary.items() if k["family"] == f}  # noqa: E731
    check(len(binary) >= 13, f"the binary lists {len(binary)} kernels")
    check(set(spec.KERNELS) == set(binary), "spec.KERNELS = the registered kernels",
          f"only in the binary: {sorted(set(binary) - set(spec.KERNELS))}, "
          f"only in the plug-in: {sorted(set(spec.KERNELS) - set(binary))}")
    check(set(features.POSITIVE) == family("positive"), "features.POSITIVE = the positive family",
          f"{sorted(features.POSITIVE)} vs {sorted(family('positive'))}")
    check(set(features.SIGNED) == family("signed"), "features.SIGNED = the signed family",
          f"{sorted(features.SIGNED)} vs {sorted(family('signed'))}")
    check(set(spec.OPTION_DEFAULTS) == set(binary), "spec.OPTION_DEFAULTS has an entry per registered kernel")
    for name, defaults in sorted(spec.OPTION_DEFAULTS.items()):
        options = binary.get(name, {}).get("options", {})
        for key, value in sorted(defaults.items()):
            check(key in options and options[key] == value, f"{name}.{key}: plug-in default {value!r} = the binary's",
                  f"binary: {options.get(key, '(no such option)')!r}")
    # exact has its own case there (exact_case: an exact model exports as before).
    missing = set(binary) - parity_case_kernels() - {"exact"}
    check(not missing, "test_hf_plugin.py's parity cases run every registered kernel", f"missing: {sorted(missing)}")
    order = kernel_registry.display_order()
    check(sorted(order) == sorted(binary) and order[:3] == ["exact", "darkformer", "performer"],
          "kernel_registry.display_order(): every kernel, exact / darkformer / performer first", str(order))
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
