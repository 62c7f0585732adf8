#!/usr/bin/env bash
# The GPU check (issue 39): one command that builds, proves and measures the GPU path inside a
# short device lease, and brings back one summary. On the GPU machine, from the project's root,
# after ../shared/device/prepare-carry.sh here (docs/gpu.md gives the device tool's call):
#
#   source .device/setup.sh && tools/gpu_check.sh
#
# Stages, each under its own limit (a stage cut at its limit is reported as such; the others still run):
#   build  the binary and the device tests packed here before the lease (tools/gpu_prebuilt.sh) where
#          their sources are unchanged and the machine's torch and libraries match; else configure
#          against the machine's torch and build only those two;
#   tests  the `cuda`-labelled tests with DARKFORMER_TEST_DEVICE=$DEVICE (tests/cuda/), each in its
#          own process (ctest, or tools/gtest_processes.py where the build was prebuilt);
#   bench  tools/bench_gpu.sh: exact vs performer/darkformer at 2k/8k/32k in fp32 and bf16, fla's
#          chunk form, the Gemma 2B q/k/v step for exact, performer and darkformer;
#   hf     transformers itself on the device against the fixtures' CPU numbers (tools/hf_parity_device.py);
#   sanitize (only when named in STAGES) compute-sanitizer's memcheck, racecheck and synccheck on
#          the CUDA operator's small case (tests/cuda/device_cuda_op_test.cpp);
#   ncu    (only when named in STAGES) Nsight Compute on op: cuda's launches in one bench call
#          (NCU_KERNEL [darkformer] at NCU_LENGTH [2048], NCU_OPTIONS [num_features: 256, chunk_size: 64], bf16, the
#          first NCU_LAUNCHES [40] of them): each launch's time, throughputs and warp stall reasons
#          (logs/ncu.csv, the summary's table: whether the chunk kernels wait on memory, barriers or
#          the tensor cores).
# Writes to $OUT (default build/gpu-check): summary.json, summary.md and logs.tar.gz.
# DEVICE=cpu runs the same at toy sizes against an existing build (tests/tools/test_gpu_check.py).
#
# Environment (defaults in brackets): DEVICE [cuda], OUT [build/gpu-check], BUILD_DIR [build-gpu on
# cuda, build on cpu], SKIP_BUILD [0], JOBS [nproc], LIMIT_BUILD [240], LIMIT_TESTS [150],
# LIMIT_BENCH [330], LIMIT_HF [60], LIMIT_SANITIZE [120], LIMIT_NCU [90] (seconds), PREBUILT [1; 0 always
# builds from source], PREBUILT_DIR [.device/prebuilt], TEST_REGEX [all cuda tests], BENCH_ENV [extra
# VAR=value words for bench_gpu.sh], PYTHON [.venv/bin/python, else python3], STAGES [build tests bench hf],
# GPU_CHECK_SLEEP [none; stage:seconds makes that stage sleep first, to test the limits].
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEVICE="${DEVICE:-cuda}"
OUT="${OUT:-$ROOT/build/gpu-check}"
if [[ "$DEVICE" == cuda ]]; then BUILD_DIR="${BUILD_DIR:-$ROOT/build-gpu}"; else BUILD_DIR="${BUILD_DIR:-$ROOT/build}"; fi
JOBS="${JOBS:-$(nproc)}"
# The project's venv where it exists (it has torch: the converter and transformers' parity need it),
# else the machine's python3 (the GPU image's carries torch).
if [[ -z "${PYTHON:-}" && -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; fi
PY="${PYTHON:-python3}"
STAGES="${STAGES:-build tests bench hf}"
LOGS="$OUT/logs"
rm -rf "$OUT" && mkdir -p "$LOGS"
: > "$OUT/stages.tsv"
started=$(date +%s)
log() { echo "[gpu_check $(($(date +%s) - started))s] $*"; }

# run_stage NAME LIMIT COMMAND...: the command's output goes to logs/NAME.log; one line per stage
# in stages.tsv: name, status (ok | failed rc N | cut at N s | skipped), seconds.
run_stage() {
  local name=$1 limit=$2; shift 2
  local t0 rc status
  t0=$(date +%s)
  log "$name: start (limit ${limit}s)"
  local pause=""  # GPU_CHECK_SLEEP=stage:seconds makes that stage sleep first (the limits' test)
  [[ "${GPU_CHECK_SLEEP:-}" == "$name:"* ]] && pause="sleep ${GPU_CHECK_SLEEP#*:}; "
  timeout --kill-after=10 "$limit" bash -c "$pause$*" > "$LOGS/$name.log" 2>&1
  rc=$?
  if [[ $rc -eq 0 ]]; then status=ok
  elif [[ $rc -eq 124 || $rc -eq 137 ]]; then status="cut at ${limit} s"
  else status="failed rc $rc"; fi
  printf '%s\t%s\t%s\n' "$name" "$status" "$(($(date +%s) - t0))" >> "$OUT/stages.tsv"
  log "$name: $status"
  tail -3 "$LOGS/$name.log"
  [[ $status == ok ]]
}
skip_stage() { printf '%s\t%s\t0\n' "$1" "skipped: $2" >> "$OUT/stages.tsv"; log "$1: skipped ($2)"; }
wants() { [[ " $STAGES " == *" $1 "* ]]; }

stage_build() {
  set -e
  if [[ "${PREBUILT:-1}" != 0 ]]; then
    local libs="${LD_LIBRARY_PATH:-}"
    [[ -n "$PREBUILT_LIBS" ]] && libs="${libs:+$libs:}$PREBUILT_LIBS"
    if LD_LIBRARY_PATH="$libs" PYTHON="$PY" bash "$ROOT/tools/gpu_prebuilt.sh" install "$BUILD_DIR"; then
      return 0
    fi
    echo "gpu_check: building from source"
  fi
  rm -f "$BUILD_DIR/.prebuilt"
  local nccl_args=()
  local nccl_include
  nccl_include=$("$PY" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "include"))' 2>/dev/null || true)
  [[ -f "$nccl_include/nccl.h" ]] && nccl_args=("-DDARKFORMER_NCCL_INCLUDE=$nccl_include")
  # Debian keeps HDF5 under hdf5/serial and the unpacked prefix has no h5cc: name its files
  # (.device/setup.sh exports the two folders).
  local hdf5_args=()
  if [[ -n "${HDF5_INCLUDE_DIR:-}" && -n "${HDF5_LIB_DIR:-}" ]]; then
    hdf5_args=("-DHDF5_C_INCLUDE_DIR=$HDF5_INCLUDE_DIR" "-DHDF5_CXX_INCLUDE_DIR=$HDF5_INCLUDE_DIR"
               "-DHDF5_C_LIBRARY_hdf5=$HDF5_LIB_DIR/libhdf5.so" "-DHDF5_CXX_LIBRARY_hdf5=$HDF5_LIB_DIR/libhdf5.so"
               "-DHDF5_CXX_LIBRARY_hdf5_cpp=$HDF5_LIB_DIR/libhdf5_cpp.so")
  fi
  if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
    cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DDARKFORMER_PYTHON="$(command -v "$PY")" "${nccl_args[@]}" "${hdf5_args[@]}"
  fi
  cmake --build "$BUILD_DIR" -j"$JOBS" --target darkformer cuda_tests
}

stage_tests() {
  # Each test is its own process (gtest_discover_tests); the GPU is shared between them.
  if [[ -f "$BUILD_DIR/.prebuilt" ]]; then  # no build tree: the paths ctest compiles in are the packer's
    DARKFORMER_TEST_DEVICE="$DEVICE" DARKFORMER_PYTHON="$(command -v "$PY")" DARKFORMER_SOURCE_DIR="$ROOT" \
      DARKFORMER_BINARY_DIR="$BUILD_DIR" "$PY" "$ROOT/tools/gtest_processes.py" "$BUILD_DIR/tests/cuda_tests" \
      --regex "$TEST_REGEX" --jobs "$((JOBS > 8 ? 8 : JOBS))" --timeout 120 --junit "$OUT/junit.xml"
    return
  fi
  DARKFORMER_TEST_DEVICE="$DEVICE" DARKFORMER_PYTHON="$(command -v "$PY")" \
    ctest --test-dir "$BUILD_DIR" -L cuda ${TEST_REGEX:+-R "$TEST_REGEX"} -j"$((JOBS > 8 ? 8 : JOBS))" \
    --timeout 120 --output-on-failure --output-junit "$OUT/junit.xml"
}

stage_bench() {
  local sizes=()  # bench_gpu.sh's defaults: Gemma 2B's head shape, the q/k/v step at 8 x 2048 and 1 x 16384
  if [[ "$DEVICE" == cpu ]]; then  # toy sizes: proves the stage, measures nothing
    sizes=(LENGTHS=128,256 HEADS=2 HEAD_DIM=16 FEATURES=16 REPEATS=1 STEP_SHAPES=1x32 STEPS=2
           DOCUMENTS=32 DOCUMENT_LENGTHS=256 DOCUMENT_BATCH=1
           MODEL="$ROOT/configs/model/tiny.yaml")
  fi
  env DEVICE="$DEVICE" OUT="$OUT/bench" DARKFORMER_BIN="$BUILD_DIR/darkformer" PYTHON="$PY" \
    "${sizes[@]}" ${BENCH_ENV:-} bash "$ROOT/tools/bench_gpu.sh"
}

stage_hf() { "$PY" "$ROOT/tools/hf_parity_device.py" --device "$DEVICE" --json "$OUT/hf.json"; }

stage_sanitize() {
  set -e
  local sanitizer
  sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  # memcheck and racecheck as the third lease ran them; synccheck: barriers a block's threads do not
  # all reach. Not initcheck: the in-place epilogues read an output before they know whether they
  # use it (a fold into a state not yet made discards what it read), which it would report.
  local tool
  for tool in memcheck racecheck synccheck; do
    echo "== compute-sanitizer --tool $tool"
    DARKFORMER_TEST_DEVICE=cuda "$sanitizer" --tool "$tool" --error-exitcode 1 \
      "$BUILD_DIR/tests/cuda_tests" --gtest_filter='DeviceCudaOpTest.SmallCaseForTheSanitizers'
  done
}

stage_ncu() {
  set -e
  local ncu
  ncu="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
  # Our launches only (the bench's SDPA runs unprofiled); one report, then its raw page as CSV in
  # base units (the summary converts them). --clock-control none: the card's clocks as found (ncu
  # would lock them to base otherwise; a lent card's settings are not ours to change).
  "$ncu" --target-processes all --clock-control none --launch-count "${NCU_LAUNCHES:-40}" -f -o "$OUT/logs/ncu" \
    --kernel-name 'regex:.*(ChunkOwnState|EnteringStates|ChunkForward|QuerySide|ReverseShare|ReverseStates|KeySide)Kernel.*' \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
    "$BUILD_DIR/darkformer" kernel-check --bench --device cuda --dtype bf16 --kernel "${NCU_KERNEL:-darkformer}" \
    --heads 8 --kv-heads 1 --bench-head-dims 256 --bench-lengths "${NCU_LENGTH:-2048}" --op cuda \
    --options "{${NCU_OPTIONS:-num_features: 256, chunk_size: 64}}" --repeats 1
  "$ncu" --import "$OUT/logs/ncu.ncu-rep" --csv --page raw --print-units base > "$OUT/logs/ncu.csv"
  rm -f "$OUT/logs/ncu.ncu-rep"
}

# Debian's HDF5 needs libcurl and libssl at run time; where the image lacks them, the carried
# .device/extra/*.deb (docs/gpu.md) are unpacked and put on the loader's path.
if ! ldconfig -p | grep -q libcurl.so.4 && compgen -G "$ROOT/.device/extra/*.deb" > /dev/null; then
  for deb in "$ROOT"/.device/extra/*.deb; do dpkg -x "$deb" /tmp/gpu-check-extra; done
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/tmp/gpu-check-extra/usr/lib/x86_64-linux-gnu"
  log "libcurl.so.4 missing here: using the carried .device/extra packages"
fi
# A prebuilt binary's runpath names the packer's torch: the loader finds this machine's torch and its
# CUDA libraries (torch/lib, nvidia/*/lib beside it), then the toolkit's, through LD_LIBRARY_PATH,
# set so once the build folder holds the pack (binaries built here keep the path as it was).
PREBUILT_LIBS=""
if [[ "$DEVICE" == cuda ]]; then
  PREBUILT_LIBS=$("$PY" -c 'import glob, os, torch; d = os.path.dirname(torch.__file__)
print(":".join([os.path.join(d, "lib")] + sorted(glob.glob(os.path.join(os.path.dirname(d), "nvidia", "*", "lib")))))' 2>/dev/null || true)
  for dir in /usr/local/cuda/lib64 /usr/local/cuda/extras/CUPTI/lib64; do
    [[ -d "$dir" ]] && PREBUILT_LIBS="${PREBUILT_LIBS:+$PREBUILT_LIBS:}$dir"
  done
fi
use_prebuilt_libs() {
  [[ -f "$BUILD_DIR/.prebuilt" && -n "$PREBUILT_LIBS" ]] &&
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$PREBUILT_LIBS"
  return 0
}
# The stages run in a child bash under `timeout`: they see these through the environment.
export -f stage_build stage_tests stage_bench stage_hf stage_sanitize stage_ncu
export ROOT DEVICE OUT BUILD_DIR JOBS PY PREBUILT="${PREBUILT:-1}" PREBUILT_LIBS PREBUILT_DIR="${PREBUILT_DIR:-$ROOT/.device/prebuilt}" TEST_REGEX="${TEST_REGEX:-}" BENCH_ENV="${BENCH_ENV:-}"
log "device $DEVICE, root $ROOT, build $BUILD_DIR, $JOBS jobs"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' 2>&1
  for so in libcurl.so.4 libssl.so.3; do ldconfig -p | grep -q "$so" && echo "$so: present" || echo "$so: missing"; done
} > "$LOGS/machine.log" 2>&1
cat "$LOGS/machine.log"

built=1
if [[ "${SKIP_BUILD:-0}" == 1 ]] || ! wants build; then skip_stage build "SKIP_BUILD or STAGES"
else run_stage build "${LIMIT_BUILD:-240}" stage_build || built=0; fi
use_prebuilt_libs
declare -A limits=([tests]="${LIMIT_TESTS:-150}" [bench]="${LIMIT_BENCH:-330}" [hf]="${LIMIT_HF:-60}"
                   [sanitize]="${LIMIT_SANITIZE:-120}" [ncu]="${LIMIT_NCU:-90}")
for stage in sanitize ncu; do  # only where named: each needs a GPU and the build
  if ! wants "$stage"; then continue
  elif [[ "$DEVICE" != cuda ]]; then skip_stage "$stage" "no GPU"
  elif [[ $built == 0 ]]; then skip_stage "$stage" "the build failed"
  else run_stage "$stage" "${limits[$stage]}" "stage_$stage" || true; fi
done
for stage in tests bench hf; do
  if ! wants "$stage"; then skip_stage "$stage" "not in STAGES"
  elif [[ $built == 0 && $stage != hf ]]; then skip_stage "$stage" "the build failed"
  else
    run_stage "$stage" "${limits[$stage]}" "stage_$stage" || true
  fi
done

"$PY" "$ROOT/tools/gpu_check_summary.py" "$OUT" "$DEVICE" > "$LOGS/summary.log" 2>&1 || cat "$LOGS/summary.log"
# Logs and bench rows in one archive: the device tool brings back at most 8 files.
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs $(cd "$OUT" && ls -d bench/*.jsonl bench/*.log 2>/dev/null) junit.xml hf.json 2>/dev/null
rm -rf "$LOGS" "$OUT/bench" "$OUT/stages.tsv" "$OUT/junit.xml" "$OUT/hf.json"
log "done: $OUT/summary.md"
cat "$OUT/summary.md" 2>/dev/null
