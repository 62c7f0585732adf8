"""tools/gpu_check.sh in its CPU mode (DEVICE=cpu, toy sizes, the existing build), so the GPU check
cannot rot between GPUs:
1. every stage passes and the summary (summary.json, summary.md, logs.tar.gz: within the device
   tool's 8 files) holds the device tests' count, kernel rows with op counts in fp32 and bf16, fla's
   row (skipped: no CUDA), a training-step row for each of exact, performer and darkformer, and
   transformers' parity figures;
2. a stage that runs past its limit is cut and reported as such, and the stages after it still report
   (run without PYTHON: the default interpreter, the project's venv, runs transformers' parity); the
   GPU-only stages (sanitize, ncu) named on a CPU are skipped as such;
3. the device tests refuse DARKFORMER_TEST_DEVICE=cuda without CUDA, and an unknown device, with exit 2."""

import json
import os
import subprocess
import sys
import tempfile

import testkit

SCRIPT = os.path.join(testkit.SOURCE_DIR, "tools", "gpu_check.sh")


def run(out, shards, python=sys.executable, **extra):
    env = dict(os.environ, DEVICE="cpu", OUT=out, SKIP_BUILD="1", BUILD_DIR=os.path.dirname(testkit.BINARY),
               PYTHON=python, JOBS="2", TEST_REGEX="OneStepEqualsTheCpuStep/performer",
               BENCH_ENV="SHARDS_DIR=%s TOKENIZER=%s" % (shards["shards_dir"], shards["tokenizer"]), **extra)
    if python is None:  # gpu_check.sh's own default
        del env["PYTHON"]
    result = subprocess.run(["bash", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    print(result.stdout[-4000:])
    if result.returncode != 0:
        print(result.stderr[-3000:])
        sys.exit("gpu_check.sh exited %d" % result.returncode)
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)


def torch_sees_cuda():
    import torch
    return torch.cuda.is_available()


def main():
    failures = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        shards = testkit.tiny_shards(work)
        out = os.path.join(work, "out")
        summary = run(out, shards)
        files = sorted(os.listdir(out))
        if files != ["logs.tar.gz", "summary.json", "summary.md"]:
            failures.append("files in OUT: %s" % files)
        status = {s["stage"]: s["status"] for s in summary["stages"]}
        if status != {"build": status.get("build"), "tests": "ok", "bench": "ok", "hf": "ok"} or \
                not status["build"].startswith("skipped"):
            failures.append("stages: %s" % summary["stages"])
        if summary["tests"] != {"passed": 1, "failed": 0, "failed_names": []}:
            failures.append("device tests: %s" % summary["tests"])
        impls = {(r["kernel"], r["impl"]) for r in summary["kernels"]}
        if not {("performer", "exact"), ("darkformer", "exact")} <= impls or \
                not all(r["ops_forward"] and r["ops_backward"] for r in summary["kernels"]):
            failures.append("kernel rows: %s" % summary["kernels"])
        if [s["kernel"] for s in summary["steps"]] != ["exact", "performer", "darkformer"] or \
                not all(s["tokens"] == 32 and s["tokens_per_s"] > 0 for s in summary["steps"]):
            failures.append("step rows: %s" % summary["steps"])
        if {r["dtype"] for r in summary["kernels"]} != {"fp32", "bf16"}:
            failures.append("kernel rows in fp32 and bf16: %s" % summary["kernels"])
        if [r.get("skipped") for r in summary["fla"]] != ["no CUDA", "no CUDA"]:
            failures.append("fla rows: %s" % summary["fla"])
        with open(os.path.join(out, "summary.md")) as f:
            md = f.read()
        for part in ("| performer | auto | bf16 |", "skipped: no CUDA", "| exact | 1 x 32 |",
                     "| performer | 1 x 32 |", "| darkformer | 1 x 32 |"):
            if part not in md:
                failures.append("summary.md lacks %r" % part)
        if [r["family"] for r in (summary["hf"] or {}).get("families", [])] != ["gemma", "gemma2", "gemma3"]:
            failures.append("hf rows: %s" % summary["hf"])

        cut_out = os.path.join(work, "cut")
        # Without PYTHON: the default must have torch (the project's venv), or transformers' parity fails.
        cut = run(cut_out, shards, python=None, LIMIT_TESTS="1", STAGES="tests hf sanitize ncu",
                  GPU_CHECK_SLEEP="tests:30")
        status = {s["stage"]: s["status"] for s in cut["stages"]}
        if status.get("tests") != "cut at 1 s" or status.get("hf") != "ok" or \
                not status.get("bench", "").startswith("skipped") or \
                status.get("sanitize") != "skipped: no GPU" or status.get("ncu") != "skipped: no GPU":
            failures.append("a stage past its limit: %s" % cut["stages"])
        with open(os.path.join(cut_out, "summary.md")) as f:
            if "cut at 1 s" not in f.read():
                failures.append("summary.md does not say the tests were cut")
    # DARKFORMER_TEST_DEVICE asking for what this machine lacks is an error (exit 2), never a skip.
    binary = os.path.join(os.path.dirname(testkit.BINARY), "tests", "cuda_tests")
    for device, message in (("cuda", "no CUDA device"), ("tpu", "expected cpu or cuda")):
        if device == "cuda" and torch_sees_cuda():
            continue
        result = subprocess.run([binary, "--gtest_filter=*OneStepEqualsTheCpuStep/performer"], capture_output=True,
                                text=True, timeout=120, env=dict(os.environ, DARKFORMER_TEST_DEVICE=device))
        if result.returncode != 2 or message not in result.stderr:
            failures.append("DARKFORMER_TEST_DEVICE=%s: exit %d, stderr %r" % (device, result.returncode,
                                                                           result.stderr[-300:]))
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
