"""Shared pieces of the bad-input tests (tests/bad_inputs/test_*.py): the checks every case makes.

A bad input must exit 2 with exactly one error line on stderr that names the culprit (a path,
config key path or tensor), no traceback or "terminate called", nothing on stdout, and no
summary.json for a run that never started.
"""

import glob
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import testkit as tk  # noqa: E402

CASES = {}
failures = []  # every failed check of the case being run


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def check(ok, what, detail=""):
    print(("ok   " if ok else "FAIL ") + what + ("" if ok or not detail else "\n       " + detail))
    if not ok:
        failures.append(what)
    return ok


def error_lines(stderr):
    return [l for l in stderr.splitlines() if "[error]" in l or "[critical]" in l]


def expect_bad(res, *needles, run_dir=None, what="bad input"):
    """rc 2, one error line naming every needle (a tuple: any of them), no crash, no result."""
    errors = error_lines(res.stderr)
    line = errors[0] if errors else ""
    tail = res.stderr.strip().splitlines()[-3:]
    check(res.returncode == 2, "%s: exit code 2 (got %s)" % (what, res.returncode), " | ".join(tail))
    check(len(errors) == 1, "%s: exactly one error line on stderr (got %d)" % (what, len(errors)), " | ".join(tail))
    print("     error line: " + line)
    for needle in needles:
        options = needle if isinstance(needle, tuple) else (needle,)
        check(any(o.lower() in line.lower() for o in options), "%s: error names %s" % (what, " or ".join(options)))
    crash = [m for m in ("Traceback", "terminate called", "Exception raised from", "frame #0", "Aborted",
                         "Segmentation fault") if m in res.stderr]
    check(not crash, "%s: no traceback or crash text on stderr %s" % (what, crash or ""))
    stray = [l for l in res.stderr.splitlines() if l.strip() and not l.startswith("[")]
    check(not stray, "%s: the error is one line (no continuation lines)" % what, " | ".join(stray[:3]))
    check(res.stdout.strip() == "", "%s: nothing on stdout" % what, res.stdout[:200])
    if run_dir is not None:
        check(not os.path.exists(os.path.join(run_dir, "summary.json")), "%s: no summary.json" % what)


def expect_ok(res, what):
    return check(res.returncode == 0, "%s: exit code 0 (got %s)" % (what, res.returncode),
                 " | ".join(res.stderr.strip().splitlines()[-3:]))


def setup_run(tmp, name="run", **sections):
    """A valid tiny run config written to tmp/<name>.yaml: (config path, run dir, config dict)."""
    run_dir = os.path.join(tmp, name)
    config = tk.run_config(run_dir, tk.tiny_shards(tmp), **sections)
    path = os.path.join(tmp, name + ".yaml")
    tk.write_yaml(path, config)
    return path, run_dir, config


def train(config_path, *sets, timeout=180):
    return tk.run(["train", "--config", config_path, *[a for s in sets for a in ("--set", s)]], timeout=timeout)


def train_steps(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    return [r["step"] for r in tk.read_jsonl(path) if r.get("type") == "train"]


def checkpoints(run_dir):
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(run_dir, "checkpoints", "step_*.h5")))
