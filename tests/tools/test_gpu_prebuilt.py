"""The GPU check's binaries packed before a lease (tools/gpu_prebuilt.sh) and their tests run without
a build tree (tools/gtest_processes.py), on the CPU:
1. `pack` strips darkformer and cuda_tests with the sums of the sources and the torch version;
   gpu_check.sh's build stage installs them into an empty build folder ("ok (prebuilt)") and its tests
   stage runs the device tests from there, each in its own process;
2. `install` refuses, leaving the folder as it was, a pack whose sources changed, one made against
   another torch, and a folder with no pack;
3. gtest_processes.py reports passed, skipped, failed and timed-out tests as ctest does (JUnit, exit 1),
   and a missing binary, an empty selection or a bad expression with exit 2.
In a build without the CUDA operator (-DDARKFORMER_CUDA_OP=OFF, a machine without nvcc) there is
nothing to pack for a lease: `pack` refuses it (exit 2, naming the option) and 3. still runs."""

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

import testkit

TOOLS = os.path.join(testkit.SOURCE_DIR, "tools")
BUILD = os.path.dirname(testkit.BINARY)

# A stand-in for a GoogleTest binary: lists four tests, and runs the one its filter names.
FAKE_GTEST = r"""#!/usr/bin/env bash
if [[ "$1" == --gtest_list_tests ]]; then
  printf 'Suite.\n  Passes\n  Skips\n  Fails\nParams/Suite.\n  Sleeps/0  # GetParam() = 0\n'; exit 0
fi
case "$1" in
  --gtest_filter=Suite.Passes) echo "[       OK ] Suite.Passes" ;;
  --gtest_filter=Suite.Skips) echo "[  SKIPPED ] Suite.Skips" ;;
  --gtest_filter=Suite.Fails) echo "expected 1, got 2"; exit 1 ;;
  --gtest_filter=Params/Suite.Sleeps/0) sleep 30 ;;
  *) echo "unknown $1"; exit 3 ;;
esac
"""


def run_pack(prebuilt):
    return subprocess.run(["bash", os.path.join(TOOLS, "gpu_prebuilt.sh"), "pack"], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PREBUILT_DIR=prebuilt, BUILD_DIR=BUILD, SKIP_BUILD="1",
                                                PYTHON=sys.executable))


def cuda_operator_built():
    with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
        return "DARKFORMER_CUDA_OP:BOOL=ON" in f.read()


def pack(prebuilt):
    result = run_pack(prebuilt)
    if result.returncode != 0:
        sys.exit("pack exited %d: %s" % (result.returncode, result.stderr[-2000:]))


def install(prebuilt, folder):
    return subprocess.run(["bash", os.path.join(TOOLS, "gpu_prebuilt.sh"), "install", folder], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, PREBUILT_DIR=prebuilt, PYTHON=sys.executable))


def check_pack_and_lease(work, failures):
    prebuilt = os.path.join(work, "prebuilt")
    pack(prebuilt)
    sums = open(os.path.join(prebuilt, "SHA256SUMS")).read()
    for name in ("darkformer.gz", "tests/cuda_tests.gz", "torch_version"):
        if not os.path.isfile(os.path.join(prebuilt, name)):
            failures.append("pack lacks %s" % name)
    if "src/attention/ops/cuda_scan.cu" not in sums or "tests/cuda/device_cuda_op_test.cpp" not in sums:
        failures.append("SHA256SUMS misses the CUDA operator's sources")
    out, folder = os.path.join(work, "out"), os.path.join(work, "build-gpu")
    env = dict(os.environ, DEVICE="cpu", OUT=out, BUILD_DIR=folder, PREBUILT_DIR=prebuilt, PYTHON=sys.executable,
               JOBS="2", STAGES="build tests", LIMIT_BUILD="60", TEST_REGEX="OneStepEqualsTheCpuStep/performer")
    result = subprocess.run(["bash", os.path.join(TOOLS, "gpu_check.sh")], env=env, capture_output=True, text=True,
                            timeout=600)
    print(result.stdout[-3000:])
    summary = json.load(open(os.path.join(out, "summary.json")))
    status = {s["stage"]: s["status"] for s in summary["stages"]}
    if status.get("build") != "ok (prebuilt)" or status.get("tests") != "ok":
        failures.append("stages with the pack: %s" % summary["stages"])
    if summary["tests"] != {"passed": 1, "failed": 0, "failed_names": []}:
        failures.append("device tests from the pack: %s" % summary["tests"])
    return prebuilt


def check_refusals(work, prebuilt, failures):
    def refused(case, pack_dir, expected):
        folder = os.path.join(work, "refused-" + case)
        os.makedirs(folder)
        result = install(pack_dir, folder)
        if result.returncode != 1 or expected not in result.stdout:
            failures.append("install, %s: exit %d, %r" % (case, result.returncode, result.stdout[-400:]))
        if os.listdir(folder):
            failures.append("install, %s, left %s" % (case, os.listdir(folder)))

    changed = os.path.join(work, "changed")
    shutil.copytree(prebuilt, changed)
    lines = open(os.path.join(changed, "SHA256SUMS")).read().splitlines()
    flipped = ("0" if lines[0][0] != "0" else "1") + lines[0][1:]
    with open(os.path.join(changed, "SHA256SUMS"), "w") as f:
        f.write("\n".join([flipped] + lines[1:]) + "\n")
    refused("changed", changed, "the sources changed")
    other_torch = os.path.join(work, "other-torch")
    shutil.copytree(prebuilt, other_torch)
    with open(os.path.join(other_torch, "torch_version"), "w") as f:
        f.write("0.0.0\n")
    refused("torch", other_torch, "packed against torch 0.0.0")
    refused("none", os.path.join(work, "no-pack"), "tools/gpu_prebuilt.sh pack")


def check_processes(work, failures):
    fake = os.path.join(work, "fake_gtest")
    with open(fake, "w") as f:
        f.write(FAKE_GTEST)
    os.chmod(fake, os.stat(fake).st_mode | stat.S_IEXEC)
    junit = os.path.join(work, "junit.xml")
    runner = os.path.join(TOOLS, "gtest_processes.py")
    result = subprocess.run([sys.executable, runner, fake, "--jobs", "2", "--timeout", "2", "--junit", junit],
                            capture_output=True, text=True, timeout=120)
    statuses = {c.get("name"): c.get("status") for c in ET.parse(junit).getroot().iter("testcase")}
    if result.returncode != 1 or statuses != {"Suite.Passes": "run", "Suite.Skips": "notrun", "Suite.Fails": "fail",
                                              "Params/Suite.Sleeps/0": "fail"}:
        failures.append("gtest_processes: exit %d, %s" % (result.returncode, statuses))
    if "expected 1, got 2" not in result.stdout or "timed out after 2 s" not in result.stdout:
        failures.append("gtest_processes does not print the failures' output: %r" % result.stdout[-600:])
    only = subprocess.run([sys.executable, runner, fake, "--regex", "Pass|Skip"], capture_output=True, text=True,
                          timeout=60)
    if only.returncode != 0 or "2 tests: 1 passed, 1 skipped, 0 failed" not in only.stdout:
        failures.append("gtest_processes --regex: exit %d, %r" % (only.returncode, only.stdout[-300:]))
    for args, message in (([fake, "--regex", "Nothing"], "no test of"), ([fake, "--regex", "("], "--regex"),
                          ([os.path.join(work, "no-such-binary")], "is not an executable file")):
        bad = subprocess.run([sys.executable, runner] + args, capture_output=True, text=True, timeout=60)
        if bad.returncode != 2 or message not in bad.stderr:
            failures.append("gtest_processes %s: exit %d, %r" % (args, bad.returncode, bad.stderr[-300:]))


def check_pack_refused(work, failures):
    prebuilt = os.path.join(work, "prebuilt")
    result = run_pack(prebuilt)
    print("a build without the CUDA operator: pack exits %d: %s" % (result.returncode, result.stderr.strip()[-300:]))
    if result.returncode != 2 or "DARKFORMER_CUDA_OP" not in result.stderr or os.path.exists(prebuilt):
        failures.append("pack of a build without the CUDA operator: exit %d, %r" % (result.returncode,
                                                                                    result.stderr[-300:]))


def main():
    failures = []
    with tempfile.TemporaryDirectory(prefix="gpu-prebuilt-") as work:
        if cuda_operator_built():
            prebuilt = check_pack_and_lease(work, failures)
            check_refusals(work, prebuilt, failures)
        else:
            check_pack_refused(work, failures)
        check_processes(work, failures)
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
