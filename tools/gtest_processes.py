#!/usr/bin/env python3
"""Runs each test of a GoogleTest binary in its own process, --jobs at a time, and writes one JUnit
file: what `ctest` gives for tests discovered by gtest_discover_tests, where there is no CMake build
tree to run it in (tools/gpu_check.sh with the binaries of tools/gpu_prebuilt.sh). A test passes on
exit 0, counts as skipped where GoogleTest printed `[  SKIPPED ]` (ctest's skip expression), and
fails otherwise, a timeout included; the failures' output is printed at the end, as
`ctest --output-on-failure` does. Exit 1 if any failed, 2 on bad arguments or an empty selection.

  tools/gtest_processes.py BINARY [--regex RE] [--jobs N] [--timeout S] [--junit FILE]
"""

import argparse
import concurrent.futures
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET


def list_tests(binary):
    """Full names (Suite.Test, with instantiation and parameter names) in the binary's own order."""
    listing = subprocess.run([binary, "--gtest_list_tests"], capture_output=True, text=True, timeout=120)
    if listing.returncode != 0:
        sys.exit("gtest_processes: %s --gtest_list_tests exited %d:\n%s" % (binary, listing.returncode,
                                                                              listing.stderr[-2000:]))
    names, suite = [], None
    for line in listing.stdout.splitlines():
        entry = line.split("#", 1)[0].rstrip()  # "  Name/0  # GetParam() = ..."
        if not entry:
            continue
        if not line.startswith(" "):
            suite = entry
        elif suite is not None:
            names.append(suite + entry.strip())
    return names


def run_one(binary, name, timeout):
    start = time.monotonic()
    # Its own process group, so a timeout also ends what the test started (the trainer's child runs).
    process = subprocess.Popen([binary, "--gtest_filter=" + name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, errors="replace", start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
        code = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        output += "\n[gtest_processes] timed out after %g s" % timeout
        code = None
    seconds = time.monotonic() - start
    if code == 0:
        status = "skipped" if "[  SKIPPED ]" in output else "passed"
    else:
        status = "failed"
    return {"name": name, "status": status, "seconds": seconds, "output": output, "code": code}


def write_junit(path, binary_name, results):
    failures = sum(r["status"] == "failed" for r in results)
    skipped = sum(r["status"] == "skipped" for r in results)
    suite = ET.Element("testsuite", name=binary_name, tests=str(len(results)), failures=str(failures),
                       skipped=str(skipped), time="%.3f" % sum(r["seconds"] for r in results))
    for r in results:
        case = ET.SubElement(suite, "testcase", name=r["name"], classname=r["name"].split(".", 1)[0],
                             time="%.3f" % r["seconds"],
                             status={"passed": "run", "skipped": "notrun", "failed": "fail"}[r["status"]])
        if r["status"] == "failed":
            ET.SubElement(case, "failure", message="exit %s" % r["code"])
        elif r["status"] == "skipped":
            ET.SubElement(case, "skipped")
        ET.SubElement(case, "system-out").text = r["output"][-20000:]
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binary")
    parser.add_argument("--regex", default="", help="only the tests whose full name this matches (re.search)")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--junit")
    args = parser.parse_args()
    if args.jobs < 1 or args.timeout <= 0:
        print("gtest_processes: --jobs and --timeout must be positive", file=sys.stderr)
        return 2
    if not (os.path.isfile(args.binary) and os.access(args.binary, os.X_OK)):
        print("gtest_processes: %s is not an executable file" % args.binary, file=sys.stderr)
        return 2
    try:
        selected = re.compile(args.regex)
    except re.error as error:
        print("gtest_processes: --regex %r: %s" % (args.regex, error), file=sys.stderr)
        return 2
    names = [n for n in list_tests(args.binary) if selected.search(n)]
    if not names:
        print("gtest_processes: no test of %s matches %r" % (args.binary, args.regex), file=sys.stderr)
        return 2
    results = [None] * len(names)
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(run_one, args.binary, n, args.timeout): i for i, n in enumerate(names)}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            r = results[futures[future]] = future.result()
            print("%3d/%d %-8s %6.1f s  %s" % (done, len(names), r["status"], r["seconds"], r["name"]), flush=True)
    failed = [r for r in results if r["status"] == "failed"]
    for r in failed:
        print("\n==== %s (exit %s)\n%s" % (r["name"], r["code"], r["output"][-6000:]))
    print("\n%d tests: %d passed, %d skipped, %d failed" % (
        len(results), sum(r["status"] == "passed" for r in results),
        sum(r["status"] == "skipped" for r in results), len(failed)))
    if args.junit:
        write_junit(args.junit, args.binary.rsplit("/", 1)[-1], results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
