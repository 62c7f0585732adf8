"""What a GPU lease carries, made in one command (tools/gpu_carry.sh), on the CPU, in a copy of the
script in a scratch tree with every command it runs stood in by one that records its call and
writes what the real one would:
1. the five steps run in order (prepare-carry with libgloo-dev, HDF5's libraries, fla's pinned
   wheels, setup, the pack) and it prints the carry the device tool takes;
2. without the workplace's prepare-carry script it exits 2 naming PREPARE_CARRY, and runs nothing;
3. a step that fails stops it: the later steps do not run;
4. carried paths over the device tool's limit exit 2 with their size."""

import os
import shutil
import subprocess
import sys
import tempfile

import testkit

SCRIPT = os.path.join(testkit.SOURCE_DIR, "tools", "gpu_carry.sh")
# name: (what it records, what it writes below the tree's root)
STAND_INS = {
    "prepare_carry": 'mkdir -p .device/debs && touch .device/debs/a.deb .device/setup.sh',
    "apt_get": 'touch "$2.deb"',
    "pip": 'while [[ "$1" != -d ]]; do shift; done; mkdir -p "$2" && touch "$2/w.whl"',
    "setup": 'mkdir -p data/demo third_party/downloads && head -c 4096 /dev/zero > data/demo/corpus '
             '&& touch third_party/downloads/sp.tar.gz; exit "${SETUP_RC:-0}"',
    "prebuilt": 'mkdir -p .device/prebuilt && touch .device/prebuilt/darkformer.gz',
}


def make_tree(work):
    root = os.path.join(work, "tree")
    os.makedirs(os.path.join(root, "tools"))
    shutil.copy(SCRIPT, os.path.join(root, "tools", "gpu_carry.sh"))
    log = os.path.join(work, "calls")
    paths = {}
    for name, body in STAND_INS.items():
        path = os.path.join(work, name)
        with open(path, "w") as f:
            f.write('#!/usr/bin/env bash\necho "%s $*" >> "%s"\n%s\n' % (name, log, body))
        os.chmod(path, 0o755)
        paths[name] = path
    return root, log, paths


def run(work, **env):
    root, log, paths = make_tree(work)
    full = dict(os.environ, PREPARE_CARRY=paths["prepare_carry"], APT_GET=paths["apt_get"], PIP=paths["pip"],
                SETUP=paths["setup"], PREBUILT=paths["prebuilt"])
    full.update(env)
    result = subprocess.run(["bash", os.path.join(root, "tools", "gpu_carry.sh")], capture_output=True, text=True,
                            timeout=60, env=full, cwd=work)
    calls = open(log).read().splitlines() if os.path.exists(log) else []
    return result, [c.split(" ", 1)[0] for c in calls], calls


def main():
    failures = []
    with tempfile.TemporaryDirectory(prefix="gpu-carry-") as work:
        result, steps, calls = run(os.path.join(work, "ok"))
        if result.returncode != 0 or steps[0] != "prepare_carry" or steps[-3:] != ["pip", "setup", "prebuilt"] or \
                set(steps[1:-3]) != {"apt_get"}:
            failures.append("steps: exit %d, %r, stderr %r" % (result.returncode, steps, result.stderr[-400:]))
        if "prepare_carry libgloo-dev" not in calls or "prebuilt pack" not in calls or \
                not any(c.startswith("pip download") and "fla-core==0.6.0" in c for c in calls):
            failures.append("arguments: %r" % calls)
        if '["' + '", "'.join((".device", "data/demo", "third_party/downloads")) + '"]' not in result.stdout:
            failures.append("no carry printed: %r" % result.stdout[-400:])

        result, steps, _ = run(os.path.join(work, "missing"), PREPARE_CARRY=os.path.join(work, "nowhere.sh"))
        if result.returncode != 2 or "PREPARE_CARRY" not in result.stderr or steps:
            failures.append("missing prepare-carry: exit %d, ran %r, %r" % (result.returncode, steps, result.stderr))

        result, steps, _ = run(os.path.join(work, "failing"), SETUP_RC="1")
        if result.returncode == 0 or "prebuilt" in steps:
            failures.append("a failing setup: exit %d, ran %r" % (result.returncode, steps))

        result, _, _ = run(os.path.join(work, "large"), CARRY_LIMIT_MIB="0")
        if result.returncode != 2 or "over the device tool's 0 MiB" not in result.stderr:
            failures.append("over the limit: exit %d, %r" % (result.returncode, result.stderr[-300:]))
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
