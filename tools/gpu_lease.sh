#!/usr/bin/env bash
# The two calls of a 15-minute GPU lease (docs/gpu.md, "Running it"), declared here once so a lease
# runs them as planned, not as retyped. On the GPU machine, from the project's root:
#
#   source .device/setup.sh && tools/gpu_lease.sh 1    # device tool: timeout_s 540
#   source .device/setup.sh && tools/gpu_lease.sh 2    # at once, on the warm machine: timeout_s 560
#
# 1: build (the pack from tools/gpu_prebuilt.sh, else from source), the device tests, the sanitizers
#    and Nsight Compute; 2: the benchmark (issue 53's rows first, then op: cuda's cuts, the step,
#    the sharp rows, fla, documents) and transformers' parity, on call 1's build. Call 2 installs the
#    carried wheels (WHEELS [.device/wheels]: fla-core, einops) into WHEELS_TARGET [.device/py] and
#    puts that on PYTHONPATH; without them fla's row says so. Each setting below can be overridden
#    from the environment (LIMIT_BENCH less where call 1 ran long: the pack refused and it built).
# GPU_CHECK [tools/gpu_check.sh] is the command run (tests/tools/test_gpu_lease.py stands one in).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GPU_CHECK="${GPU_CHECK:-$ROOT/tools/gpu_check.sh}"
PY="${PYTHON:-python3}"

case "${1:-}" in
  1)
    export STAGES="${STAGES:-build tests sanitize ncu}"
    export LIMIT_TESTS="${LIMIT_TESTS:-100}" LIMIT_SANITIZE="${LIMIT_SANITIZE:-100}" LIMIT_NCU="${LIMIT_NCU:-75}"
    ;;
  2)
    WHEELS="${WHEELS:-$ROOT/.device/wheels}" WHEELS_TARGET="${WHEELS_TARGET:-$ROOT/.device/py}"
    wheels=("$WHEELS"/*.whl)
    if [[ -e "${wheels[0]}" ]]; then
      # fla is one row of the bench: a wheel that will not install costs that row, not the call.
      if PIP_DISABLE_PIP_VERSION_CHECK=1 "$PY" -m pip install -q --no-deps --no-compile --upgrade --target "$WHEELS_TARGET" "${wheels[@]}"; then
        export PYTHONPATH="$WHEELS_TARGET${PYTHONPATH:+:$PYTHONPATH}"
      else
        echo "gpu_lease: the wheels in $WHEELS did not install: fla's row will say it is missing" >&2
      fi
    else
      echo "gpu_lease: no wheels in $WHEELS: fla's row will say it is missing" >&2
    fi
    export SKIP_BUILD="${SKIP_BUILD:-1}" STAGES="${STAGES:-bench hf}" LIMIT_BENCH="${LIMIT_BENCH:-470}"
    # The cuts (chunk:sub_chunk, p = precompute_features, x = pairs: exponentials, a third field
    # segment_chunks) and why each: docs/cuda_op.md, "What the next lease should read".
    export BENCH_ENV="${BENCH_ENV:-OP=cuda,auto DTYPES=bf16 CUDA_CUTS=64:8p,16:8,8:8,8:8p,64:16,64:32,64:64,64:64p,64:64x,64:64:100000,256:64 CUT_LENGTHS=2048,8192 PARTS=attention,cuts,step,sharp,fla,documents}"
    ;;
  *)
    echo "usage: tools/gpu_lease.sh 1|2 (docs/gpu.md, \"Running it\")" >&2
    exit 2
    ;;
esac
exec bash "$GPU_CHECK"
