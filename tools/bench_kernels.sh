#!/usr/bin/env bash
# The random-feature attention benchmark of the fused causal operator (not a test; run on a quiet
# machine, check `uptime` first): forward+backward at B=1, H=8, D=64, m=256, fp32, against exact
# attention (SDPA) and the naive composite path, L = 1k ... 64k; then Gemma 2B's multi-query shape
# (8 query heads, 1 KV head, D=256). Rows are medians of alternating repeats; JSON lines in $OUT.
# Usage: tools/bench_kernels.sh [OUT_DIR]   (DF: the darkformer binary, default build/darkformer)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DF="${DF:-build/darkformer}"
OUT="${1:-runs/bench/kernels}"
mkdir -p "$OUT"
uptime
for kernel in darkformer performer; do
  "$DF" kernel-check --bench --kernel "$kernel" --options '{num_features: 256}' --heads 8 \
    --bench-head-dims 64 --bench-lengths 1024,4096,16384 --naive --repeats 3 --json "$OUT/$kernel-mha.jsonl"
done
# 64k: exact attention is skipped (its quadratic time is prohibitive here); fused vs naive.
"$DF" kernel-check --bench --kernel darkformer --options '{num_features: 256}' --heads 8 --bench-head-dims 64 \
  --bench-lengths 65536 --naive --repeats 1 --json "$OUT/darkformer-64k.jsonl"
# Gemma 2B's attention shape: multi-query, D = 256.
for kernel in performer darkformer; do
  "$DF" kernel-check --bench --kernel "$kernel" --options '{num_features: 256}' --heads 8 --kv-heads 1 \
    --bench-head-dims 256 --bench-lengths 4096 --naive --repeats 3 --json "$OUT/$kernel-mqa.jsonl"
done
