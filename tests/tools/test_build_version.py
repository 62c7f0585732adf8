"""Which source a binary was built from (src/util/build_version.h):
1. src/util/build_version.cmake, run as the build runs it, on scratch trees: outside git the version
   is "unknown"; in a checkout it is `git describe --always --dirty --abbrev=12` (the commit, a
   tag's name, "-dirty" after an edit); an unchanged tree leaves the generated file untouched (so
   a build recompiles nothing).
2. The binary: `--version` prints it with LibTorch's version and exits 0; a training run logs it
   and writes it into its checkpoint (attribute `darkformer_version`), and `to-hf` carries it into
   config.json.
3. The GPUs `--version` says the CUDA operator was compiled for are those nvcc was given for its
   kernels (the build's compile_commands.json), each as its own code and PTX."""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import h5py

import testkit

SCRIPT = os.path.join(testkit.SOURCE_DIR, "src", "util", "build_version.cmake")
CONVERTER = os.path.join(testkit.SOURCE_DIR, "tools", "convert_hf_gemma.py")
GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", "-c", "init.defaultBranch=main",
       "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false"]
failures = []
check = testkit.checker(failures)


def generated_version(source_dir, out):
    subprocess.run(["cmake", "-DSOURCE_DIR=" + source_dir, "-DOUT=" + out, "-P", SCRIPT], check=True)
    with open(out) as f:
        found = re.search(r'return "([^"]*)";', f.read())
    return found.group(1) if found else None


def git(tree, *args):
    return subprocess.run(GIT + ["-C", tree, *args], check=True, capture_output=True, text=True).stdout.strip()


def script_cases(work):
    tree, out = os.path.join(work, "tree"), os.path.join(work, "generated", "build_version.cpp")
    os.makedirs(tree)
    with open(os.path.join(tree, "a.txt"), "w") as f:
        f.write("one\n")
    check(generated_version(tree, out) == "unknown", "outside a git checkout: unknown")
    git(tree, "init", "-q")
    git(tree, "add", "a.txt")
    git(tree, "commit", "-q", "-m", "one")
    commit = git(tree, "rev-parse", "--short=12", "HEAD")
    check(generated_version(tree, out) == commit, "a clean checkout: its commit %s" % commit)
    before = os.stat(out).st_mtime_ns
    os.utime(out, ns=(before - 10**9, before - 10**9))  # a second older, so a rewrite would show
    generated_version(tree, out)
    check(os.stat(out).st_mtime_ns == before - 10**9, "an unchanged tree leaves the generated file as it was")
    with open(os.path.join(tree, "a.txt"), "a") as f:
        f.write("two\n")
    check(generated_version(tree, out) == commit + "-dirty", "an edited file: %s-dirty" % commit)
    git(tree, "commit", "-q", "-am", "two")
    git(tree, "tag", "-a", "v1.2.0", "-m", "release")
    check(generated_version(tree, out) == "v1.2.0", "a tagged commit: the tag's name")


def binary_cases(work):
    result = testkit.run(["--version"])
    line = result.stdout.strip()
    found = re.fullmatch(r"darkformer (\S+) \(LibTorch (\d+\.\d+\.\d+); .*\)", line)
    check(result.returncode == 0 and found is not None, "--version exits 0 and says %r" % line)
    if not found:
        return
    version = found.group(1)
    import torch
    check(found.group(2) == torch.__version__.split("+")[0], "LibTorch %s is the wheel's" % found.group(2))
    shards = testkit.tiny_shards(work)
    run_dir = os.path.join(work, "run")
    config = os.path.join(work, "run.yaml")
    testkit.write_yaml(config, testkit.run_config(run_dir, shards, train={"steps": 1, "checkpoint_every": 1}))
    trained = testkit.run(["train", "--config", config], check=True)
    check("darkformer %s: run directory" % version in trained.stderr, "the run logs its version")
    checkpoints = glob.glob(os.path.join(run_dir, "checkpoints", "step_*.h5"))
    with h5py.File(checkpoints[0], "r") as h5:
        written = h5.attrs.get("darkformer_version")
    written = written.decode() if isinstance(written, bytes) else written  # fixed-length UTF-8: bytes
    check(written == version, "the checkpoint's darkformer_version %r is the binary's" % written)
    hf_dir = os.path.join(work, "hf")
    subprocess.run([sys.executable, CONVERTER, "to-hf", checkpoints[0], hf_dir], check=True, capture_output=True)
    with open(os.path.join(hf_dir, "config.json")) as f:
        exported = json.load(f).get("darkformer_version")
    check(exported == version, "to-hf's config.json says darkformer_version %r" % exported)


def architecture_cases():
    """--version's "compiled in for sm_80, sm_90 and later GPUs" against cuda_scan.cu's nvcc command."""
    line = testkit.run(["--version"]).stdout
    found = re.search(r"the CUDA operator compiled in for (sm_\d+(?:, sm_\d+)*) and later GPUs", line)
    commands = os.path.join(os.path.dirname(testkit.BINARY), "compile_commands.json")
    if found is None:
        check("no CUDA operator" in line, "--version says whether and for which GPUs the operator is built: %r" % line)
        return
    said = [int(a[3:]) for a in found.group(1).split(", ")]
    with open(commands) as f:
        scan = [e["command"] for e in json.load(f) if e["file"].endswith("cuda_scan.cu")]
    check(len(scan) == 1, "compile_commands.json has cuda_scan.cu's nvcc command")
    if scan:
        given = sorted({int(a) for a in re.findall(r"code=\[compute_(\d+),sm_\1\]", scan[0])})
        check(given == sorted(said), "--version's GPUs %s are the kernels' (own code and PTX: %s)" % (said, given))


def main():
    if shutil.which("git") is None or shutil.which("cmake") is None:
        print("FAIL git and cmake are needed (the build runs both)")
        return 1
    with tempfile.TemporaryDirectory(prefix="build-version-") as work:
        script_cases(work)
        binary_cases(work)
        architecture_cases()
    return testkit.report(failures)


if __name__ == "__main__":
    raise SystemExit(main())
