"""The two calls of a GPU lease (tools/gpu_lease.sh), on the CPU, with gpu_check.sh stood in by a
script that records what it was given:
1. call 1 runs build, tests, sanitize and ncu, each under a limit; call 2 the bench and hf on
   call 1's build (SKIP_BUILD=1), its BENCH_ENV one that bench_gpu.sh takes (its own checks of the
   parts and cuts, CHECK_ONLY=1), the carried wheels installed and on PYTHONPATH;
2. a setting in the environment wins over the plan's;
3. no wheels, or a wheel that will not install, costs fla's row, not the call: it says so and
   still runs the bench;
4. any other argument exits 2 with the usage, and runs nothing."""

import os
import shlex
import subprocess
import sys
import tempfile
import zipfile

import testkit

LEASE = os.path.join(testkit.SOURCE_DIR, "tools", "gpu_lease.sh")
BENCH = os.path.join(testkit.SOURCE_DIR, "tools", "bench_gpu.sh")
SETTINGS = ("STAGES", "SKIP_BUILD", "LIMIT_TESTS", "LIMIT_SANITIZE", "LIMIT_NCU", "LIMIT_BENCH", "BENCH_ENV",
            "PYTHONPATH")
# Records the settings it sees, one NAME=value per line, and whether the wheel's module imports.
STAND_IN = r"""#!/usr/bin/env bash
for name in %s; do echo "$name=${!name:-}"; done > "$RECORD"
python3 -c 'import leasewheel' 2>/dev/null && echo "IMPORTS=1" >> "$RECORD"
exit 0
""" % " ".join(SETTINGS)


def make_wheel(folder, broken=False):
    """A pure-Python wheel of one module, leasewheel; broken: no metadata, which pip refuses."""
    path = os.path.join(folder, "leasewheel-0.1-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("leasewheel.py", "VALUE = 1\n")
        if not broken:
            info = "leasewheel-0.1.dist-info/"
            z.writestr(info + "METADATA", "Metadata-Version: 2.1\nName: leasewheel\nVersion: 0.1\n")
            z.writestr(info + "WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
            z.writestr(info + "RECORD", "")


def lease(work, call, **env):
    record = os.path.join(work, "record")
    if os.path.exists(record):
        os.remove(record)
    clean = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    clean.update(GPU_CHECK=os.path.join(work, "gpu_check"), RECORD=record, PYTHON=sys.executable)
    clean.update(env)
    result = subprocess.run(["bash", LEASE, call], capture_output=True, text=True, timeout=120, env=clean)
    seen = {}
    if os.path.exists(record):
        for line in open(record).read().splitlines():
            name, _, value = line.partition("=")
            seen[name] = value
    return result, seen


def main():
    failures = []
    with tempfile.TemporaryDirectory(prefix="gpu-lease-") as work:
        stand_in = os.path.join(work, "gpu_check")
        with open(stand_in, "w") as f:
            f.write(STAND_IN)
        os.chmod(stand_in, 0o755)
        wheels, target = os.path.join(work, "wheels"), os.path.join(work, "py")
        os.makedirs(wheels)
        make_wheel(wheels)

        result, seen = lease(work, "1", WHEELS=wheels, WHEELS_TARGET=target)
        want = {"STAGES": "build tests sanitize ncu", "SKIP_BUILD": "", "BENCH_ENV": ""}
        limits = [seen.get(k, "") for k in ("LIMIT_TESTS", "LIMIT_SANITIZE", "LIMIT_NCU")]
        if result.returncode != 0 or any(seen.get(k) != v for k, v in want.items()) or \
                not all(v.isdigit() and int(v) > 0 for v in limits):
            failures.append("call 1: exit %d, saw %r" % (result.returncode, seen))

        result, seen = lease(work, "2", WHEELS=wheels, WHEELS_TARGET=target)
        want = {"STAGES": "bench hf", "SKIP_BUILD": "1", "IMPORTS": "1"}
        if result.returncode != 0 or any(seen.get(k) != v for k, v in want.items()) or \
                not seen.get("LIMIT_BENCH", "").isdigit() or \
                target not in seen.get("PYTHONPATH", "").split(":"):
            failures.append("call 2: exit %d, saw %r, stderr %r" % (result.returncode, seen, result.stderr[-500:]))
        plan = seen.get("BENCH_ENV", "")
        if "PARTS=attention," not in plan or "CUDA_CUTS=" not in plan:
            failures.append("call 2's BENCH_ENV lacks the parts or the cuts: %r" % plan)
        checked = subprocess.run(["env"] + shlex.split(plan) + ["CHECK_ONLY=1", "OUT=" + os.path.join(work, "bench"),
                                                               "bash", BENCH], capture_output=True, text=True, timeout=60)
        if checked.returncode != 0 or "would run: parts attention cuts" not in checked.stdout:
            failures.append("bench_gpu.sh refuses call 2's plan: exit %d, %r" % (checked.returncode,
                                                                                 checked.stderr[-500:]))
        bad = subprocess.run(["env", "CUDA_CUTS=64:8q", "CHECK_ONLY=1", "OUT=" + os.path.join(work, "bench"), "bash",
                              BENCH], capture_output=True, text=True, timeout=60)
        if bad.returncode != 2 or "CUDA_CUTS: '64:8q'" not in bad.stderr:
            failures.append("bench_gpu.sh took a bad cut: exit %d, %r" % (bad.returncode, bad.stderr[-300:]))

        result, seen = lease(work, "2", WHEELS=wheels, WHEELS_TARGET=target, LIMIT_BENCH="17", STAGES="bench")
        if seen.get("LIMIT_BENCH") != "17" or seen.get("STAGES") != "bench":
            failures.append("call 2 overrode the environment's settings: %r" % seen)

        empty, broken = os.path.join(work, "empty"), os.path.join(work, "broken")
        os.makedirs(empty)
        os.makedirs(broken)
        make_wheel(broken, broken=True)
        for folder, says in ((empty, "no wheels in"), (broken, "did not install")):
            result, seen = lease(work, "2", WHEELS=folder, WHEELS_TARGET=os.path.join(work, "py2"))
            if result.returncode != 0 or seen.get("STAGES") != "bench hf" or says not in result.stderr or \
                    "IMPORTS" in seen:
                failures.append("call 2 with %s: exit %d, saw %r, stderr %r" % (os.path.basename(folder),
                                                                                result.returncode, seen,
                                                                                result.stderr[-300:]))

        for args in (["3"], []):
            if os.path.exists(os.path.join(work, "record")):
                os.remove(os.path.join(work, "record"))
            result = subprocess.run(["bash", LEASE] + args, capture_output=True, text=True, timeout=60,
                                    env=dict(os.environ, GPU_CHECK=stand_in, RECORD=os.path.join(work, "record")))
            if result.returncode != 2 or "usage" not in result.stderr or os.path.exists(os.path.join(work, "record")):
                failures.append("gpu_lease.sh %s: exit %d, %r" % (args, result.returncode, result.stderr))
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
