#!/usr/bin/env bash
# Data pipeline benchmark (not a test): prepare throughput in MB of text per second per core and
# loader batches per second, on the C4 sample in ../shared/data/c4 with the Gemma tokenizer.
# Usage: tools/bench_data.sh [build-dir]   (the build dir must have the data_bench target built)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
SHARED="${DARKFORMER_SHARED:-$ROOT/../shared}"
C4="$SHARED/data/c4"
TOKENIZER="$SHARED/tokenizers/gemma-256k.model"
for need in "$BUILD/data_bench" "$TOKENIZER"; do
  [[ -e "$need" ]] || { echo "bench_data: $need is missing (cmake --build $BUILD --target data_bench)" >&2; exit 1; }
done
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "host: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$BUILD/data_bench" --input "$C4/*.json.gz" --tokenizer "$TOKENIZER" --work-dir "$WORK" \
  --threads 1 --threads "$(nproc)" --batches 20000 --seq-len 1024 --batch-size 8
