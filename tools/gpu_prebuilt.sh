#!/usr/bin/env bash
# The GPU check's two binaries built here, before a lease, so its build stage takes seconds instead
# of minutes (the leases' builds took 108-167 s of their 900, and one failed at the link there).
# This machine's nvcc compiles the CUDA operator for sm_90, as a build there would.
#
#   tools/gpu_prebuilt.sh pack           here: builds darkformer and cuda_tests in BUILD_DIR [build]
#                                        (SKIP_BUILD=1: takes them as they are there), strips them into PREBUILT_DIR [.device/prebuilt] with
#                                        SHA256SUMS of every tracked file the build reads and the torch
#                                        version they link against.
#   tools/gpu_prebuilt.sh install DIR    there (gpu_check.sh's build stage): puts them where a build in
#                                        DIR would (DIR/darkformer, DIR/tests/cuda_tests) when every sum
#                                        still holds, python's torch is that version and the loader
#                                        finds every library they need, and marks DIR as prebuilt
#                                        (DIR/.prebuilt: its tests run without ctest); otherwise says
#                                        why and exits 1, and the stage builds from source.
# Environment: PYTHON [.venv/bin/python, else python3] for torch's version.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREBUILT_DIR="${PREBUILT_DIR:-$ROOT/.device/prebuilt}"
if [[ -z "${PYTHON:-}" && -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; fi
PY="${PYTHON:-python3}"
BINARIES=(darkformer tests/cuda_tests)

torch_version() { "$PY" -c 'import torch; print(torch.__version__)'; }

pack() {
  local build="${BUILD_DIR:-$ROOT/build}"
  git -C "$ROOT" rev-parse --is-inside-work-tree > /dev/null 2>&1 ||
    { echo "gpu_prebuilt: pack needs the git checkout (it sums the files git tracks)" >&2; exit 2; }
  if ! grep -q '^DARKFORMER_CUDA_OP:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
    echo "gpu_prebuilt: $build is not a build with the CUDA operator (DARKFORMER_CUDA_OP=ON in its CMakeCache.txt)" >&2
    exit 2
  fi
  [[ "${SKIP_BUILD:-0}" == 1 ]] || cmake --build "$build" --target darkformer cuda_tests
  rm -rf "$PREBUILT_DIR" && mkdir -p "$PREBUILT_DIR/tests"
  local b
  for b in "${BINARIES[@]}"; do strip -o "$PREBUILT_DIR/$b" "$build/$b" && gzip -9 "$PREBUILT_DIR/$b"; done
  # Every tracked file of the folders CMake reads (tests' scripts and fixtures too: conservative).
  (cd "$ROOT" && git ls-files -z -- CMakeLists.txt cmake src tests third_party ':!:third_party/downloads' |
     xargs -0 sha256sum) > "$PREBUILT_DIR/SHA256SUMS"
  torch_version > "$PREBUILT_DIR/torch_version"
  echo "gpu_prebuilt: $(du -sh "$PREBUILT_DIR" | cut -f1) in $PREBUILT_DIR ($(wc -l < "$PREBUILT_DIR/SHA256SUMS") sources, torch $(cat "$PREBUILT_DIR/torch_version"))"
}

install() {
  local dir=$1 b
  for b in "${BINARIES[@]/%/.gz}" SHA256SUMS torch_version; do
    [[ -f "$PREBUILT_DIR/$b" ]] || { echo "gpu_prebuilt: no $PREBUILT_DIR/$b (tools/gpu_prebuilt.sh pack, here)"; exit 1; }
  done
  local changed
  changed=$(cd "$ROOT" && sha256sum --check --quiet "$PREBUILT_DIR/SHA256SUMS" 2>&1 || true)
  if [[ -n "$changed" ]]; then
    echo "gpu_prebuilt: the sources changed since the pack:"; echo "$changed" | head -5; exit 1
  fi
  local want have
  want=$(cat "$PREBUILT_DIR/torch_version"); have=$(torch_version)
  [[ "$want" == "$have" ]] || { echo "gpu_prebuilt: packed against torch $want, python here has $have"; exit 1; }
  mkdir -p "$dir/tests"
  discard() { local x; for x in "${BINARIES[@]}"; do rm -f "$dir/$x.new"; done; }  # what was there stays
  for b in "${BINARIES[@]}"; do
    gzip -dc "$PREBUILT_DIR/$b.gz" > "$dir/$b.new" && chmod +x "$dir/$b.new"
    local missing
    missing=$(ldd "$dir/$b.new" | grep 'not found' || true)
    if [[ -n "$missing" ]]; then
      discard; echo "gpu_prebuilt: $b needs libraries not found here:"; echo "$missing"; exit 1
    fi
  done
  "$dir/tests/cuda_tests.new" --gtest_list_tests > /dev/null ||
    { discard; echo "gpu_prebuilt: cuda_tests does not start here"; exit 1; }
  for b in "${BINARIES[@]}"; do mv "$dir/$b.new" "$dir/$b"; done
  cp "$PREBUILT_DIR/torch_version" "$dir/.prebuilt"
  echo "gpu_prebuilt: installed ${BINARIES[*]} into $dir (torch $have, $(wc -l < "$PREBUILT_DIR/SHA256SUMS") sources unchanged)"
}

case "${1:-}" in
  pack) pack ;;
  install) [[ $# == 2 ]] || { echo "usage: tools/gpu_prebuilt.sh install DIR" >&2; exit 2; }; install "$2" ;;
  *) echo "usage: tools/gpu_prebuilt.sh pack | install DIR" >&2; exit 2 ;;
esac
