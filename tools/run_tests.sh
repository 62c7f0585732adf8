#!/usr/bin/env bash
# The test command: setup (idempotent), build, then every ctest test on the CPU. No GPU needed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/tools/build.sh"
cd "$ROOT/build"
ctest --output-on-failure -j"$(nproc)" "$@"
