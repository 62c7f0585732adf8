#!/usr/bin/env bash
# One idempotent setup for darkformer on Debian 12: Debian build deps, a project-local
# venv with the torch==2.11.0 wheel (its LibTorch), the Python tools' packages, and the pinned
# SentencePiece source archive that CMake builds (tools/fetch_sentencepiece.sh).
# The second run checks a stamp and returns in seconds.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
TORCH_VERSION=2.11.0
# The wheel's nvidia-* dependencies are gigabytes; /usr/local/cuda holds most of them. These
# three are NEEDED by libtorch_cuda.so and absent from the toolkit, so they come from PyPI.
NVIDIA_WHEELS=(nvidia-cusparselt-cu13==0.8.0 nvidia-nvshmem-cu13==3.4.5 nvidia-cufile==1.15.1.6)
PY_PACKAGES=(numpy typing_extensions filelock sympy networkx jinja2 fsspec "setuptools<82"
             transformers==5.23.0 safetensors h5py pyyaml matplotlib sentencepiece protobuf psutil
             lm-eval==0.4.13 tensorboard==2.21.0)
# accelerate (lm-eval's `--model hf` needs it) without its dependency on torch's nvidia-* wheels.
NO_DEPS_PACKAGES=(accelerate==1.15.0)
APT_PACKAGES=(cmake ninja-build g++ git pkg-config python3-venv
              libyaml-cpp-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libhdf5-dev
              sentencepiece libgloo-dev libgtest-dev libgmock-dev zlib1g-dev python3.11-doc)

stamp_key="$(printf '%s\n' "$TORCH_VERSION" "${NVIDIA_WHEELS[@]}" "${PY_PACKAGES[@]}" "${NO_DEPS_PACKAGES[@]}" \
             "${APT_PACKAGES[@]}" "$(cat "$ROOT/third_party/sentencepiece.pin")" \
             "$(cat "$ROOT/tools/make_demo_corpus.sh" 2>/dev/null)" | sha256sum | cut -c1-16)"
STAMP="$VENV/.setup-$stamp_key"
# Before the stamp: an archive deleted since the last setup comes back (a checksum when present).
"$ROOT/tools/fetch_sentencepiece.sh"
if [[ -f "$STAMP" ]]; then exit 0; fi

log() { echo "[setup] $*"; }

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "apt-get install ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [[ ! -d /usr/local/cuda ]]; then
  echo "[setup] error: the CUDA toolkit is expected in /usr/local/cuda (LibTorch's CMake config needs it)" >&2
  exit 1
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating $VENV"
  python3 -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
if ! "$VENV/bin/python" -c "import torch,sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  log "installing torch==$TORCH_VERSION (no nvidia-* deps: the toolkit in /usr/local/cuda has them)"
  "${PIP[@]}" --no-deps "torch==$TORCH_VERSION"
fi
log "installing nvidia runtime libraries absent from the toolkit, and the Python tools' packages"
"${PIP[@]}" --no-deps "${NVIDIA_WHEELS[@]}"
"${PIP[@]}" "${PY_PACKAGES[@]}"
"${PIP[@]}" --no-deps "${NO_DEPS_PACKAGES[@]}"
# The transformers plug-in for exported kernel models (docs/python.md), editable: tracks the tree.
"${PIP[@]}" --no-deps -e "$ROOT/python/darkformer_hf"

if [[ -x "$ROOT/tools/make_demo_corpus.sh" ]]; then
  "$ROOT/tools/make_demo_corpus.sh"
fi

rm -f "$VENV"/.setup-*
touch "$STAMP"
log "done"
