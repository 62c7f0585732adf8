#!/usr/bin/env bash
# Data pipeline benchmark (not a test): prepare throughput in MB of text per second per core and
# loader batches per second, on C4 json.gz files with the Gemma tokenizer.
# Usage: [C4_DIR=dir] [TOKENIZER=gemma.model] tools/bench_data.sh [build-dir]
#   C4_DIR defaults to data/c4 and TOKENIZER to data/tokenizers/gemma-256k.model (docs/data.md says
#   where to get both); the build dir must have the data_bench target built.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
C4="${C4_DIR:-$ROOT/data/c4}"
TOKENIZER="${TOKENIZER:-$ROOT/data/tokenizers/gemma-256k.model}"
for need in "$BUILD/data_bench" "$TOKENIZER"; do
  [[ -e "$need" ]] || { echo "bench_data: $need is missing (cmake --build $BUILD --target data_bench)" >&2; exit 1; }
done
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "host: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$BUILD/data_bench" --input "$C4/*.json.gz" --tokenizer "$TOKENIZER" --work-dir "$WORK" \
  --threads 1 --threads "$(nproc)" --batches 20000 --seq-len 1024 --batch-size 8
