#!/usr/bin/env bash
# Whole training step at L = 2048 (bench/configs/train_step_2048.yaml): exact attention vs feature
# kernels, alternating runs, median step time of steps 3..N (the first two warm up). Not a test;
# run it on a quiet machine (check `uptime`). Usage: tools/bench_train_step.sh [ROUNDS] [KERNELS...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DF="${DF:-build/darkformer}"
PYTHON="${PYTHON:-.venv/bin/python}"
ROUNDS="${1:-3}"
shift || true
KERNELS=("${@:-exact darkformer performer}")
read -r -a KERNELS <<<"${KERNELS[*]}"
OUT=runs/bench/train_step
rm -rf "$OUT"
mkdir -p "$OUT"
for round in $(seq 1 "$ROUNDS"); do
  for kernel in "${KERNELS[@]}"; do
    "$DF" train --config bench/configs/train_step_2048.yaml --set attention.kernel="$kernel" \
      --set log.dir="$OUT/$kernel-$round" >/dev/null 2>"$OUT/$kernel-$round.log" || { cat "$OUT/$kernel-$round.log"; exit 1; }
  done
done
"$PYTHON" - "$OUT" "$ROUNDS" "${KERNELS[@]}" <<'PY'
import json, statistics, sys
out, rounds, kernels = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
med = {}
for k in kernels:
    ms = []
    for r in range(1, rounds + 1):
        rows = [json.loads(l) for l in open(f"{out}/{k}-{r}/metrics.jsonl") if '"step_ms"' in l]
        ms += [row["step_ms"] for row in rows if row["step"] > 2]
    med[k] = statistics.median(ms)
ref = med.get("exact")
for k in kernels:
    ratio = f"  exact/{k} = {ref / med[k]:.2f}x" if ref else ""
    print(f"{k:>12}: median step {med[k]:8.1f} ms over {rounds} runs{ratio}")
    print(json.dumps({"bench": "train_step", "kernel": k, "seq_len": 2048, "median_step_ms": med[k],
                      "speedup_vs_exact": (ref / med[k]) if ref else None}))
PY
