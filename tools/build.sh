#!/usr/bin/env bash
# Configures and builds darkformer into build/ (after tools/setup.sh). Incremental when possible.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/tools/setup.sh"
if [[ ! -f "$ROOT/build/build.ninja" ]]; then
  cmake -S "$ROOT" -B "$ROOT/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$ROOT/build.configure.log" 2>&1 ||
    { cat "$ROOT/build.configure.log"; exit 1; }
fi
cmake --build "$ROOT/build" -j"$(nproc)" "$@"
