#!/usr/bin/env bash
# Configures and builds darkformer into build/ (after tools/setup.sh). Incremental when possible.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/tools/setup.sh"
# A full build writes about 1.5 GB (precompiled headers, test binaries); say so before the compiler
# fails with "No space left on device" halfway through.
free_kb=$(df -Pk "$ROOT" | awk 'NR==2 {print $4}')
if (( free_kb < 2 * 1024 * 1024 )); then
  echo "[build] warning: only $((free_kb / 1024)) MB free on the disk holding $ROOT; a full build needs about 1.5 GB" >&2
fi
if [[ ! -f "$ROOT/build/build.ninja" ]]; then
  cmake -S "$ROOT" -B "$ROOT/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$ROOT/build.configure.log" 2>&1 ||
    { cat "$ROOT/build.configure.log"; exit 1; }
fi
cmake --build "$ROOT/build" -j"$(nproc)" "$@"
