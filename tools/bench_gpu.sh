#!/usr/bin/env bash
# Benchmark (not a test), ready for the day a GPU is lent; it runs unchanged on the CPU, and
# tests/tools/test_bench_gpu.py runs it there at toy sizes.
#  1. Attention alone: exact (SDPA) against performer and darkformer, forward + backward, at
#     Gemma 2B's head shape (8 query heads, 1 KV head, head_dim 256, m = 256), L = 2k / 8k / 32k:
#     ms, peak device memory and the ops each dispatches per layer call (the launch count), via
#     `kernel-check --bench --device $DEVICE --profile` (each timed call ends in a device sync).
#  1b. Packed documents (data.document_masking, issue 40): each implementation with masking beside
#     its own unmasked time, at DOCUMENT_LENGTHS with DOCUMENT_BATCH rows of documents of mean
#     length DOCUMENTS; exact also one call per document (`kernel-check --bench-documents`).
#  2. A Gemma 2B q/k/v-only finetuning step (darkformer, bf16 autocast, activation checkpointing,
#     chunked loss) at 2048 and 8192 tokens: tokens/s, MFU and peak device memory, and on CUDA the
#     caching allocator's peak beside `inspect --memory`'s prediction for the same config.
#
#   DEVICE=cuda tools/bench_gpu.sh
#
# Environment (defaults in brackets): DEVICE [cuda], OUT [build/bench/gpu-$DEVICE], LENGTHS
# [2048,8192,32768], DOCUMENTS [256; 0 skips 1b], DOCUMENT_LENGTHS [4096,16384], DOCUMENT_BATCH [4], HEADS [8], KV_HEADS [1], HEAD_DIM [256], FEATURES [256], REPEATS [3], OP
# [auto: chunk_parallel on CUDA], STEP_TOKENS ["2048 8192": sequence lengths], STEP_BATCH [1], STEPS [4], MODEL
# [configs/model/gemma-2b.yaml], SHARDS_DIR and TOKENIZER [the demo corpus, prepared into OUT;
# token ids only need to fit the model's vocabulary], PEAK_TFLOPS [989: H100/H200 dense bf16].
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEVICE="${DEVICE:-cuda}"
OUT="${OUT:-$ROOT/build/bench/gpu-$DEVICE}"
LENGTHS="${LENGTHS:-2048,8192,32768}"
HEADS="${HEADS:-8}" KV_HEADS="${KV_HEADS:-1}" HEAD_DIM="${HEAD_DIM:-256}" FEATURES="${FEATURES:-256}"
REPEATS="${REPEATS:-3}" OP="${OP:-auto}"
DOCUMENTS="${DOCUMENTS:-256}" DOCUMENT_LENGTHS="${DOCUMENT_LENGTHS:-4096,16384}" DOCUMENT_BATCH="${DOCUMENT_BATCH:-4}"
STEP_TOKENS="${STEP_TOKENS:-2048 8192}" STEP_BATCH="${STEP_BATCH:-1}" STEPS="${STEPS:-4}"
MODEL="${MODEL:-$ROOT/configs/model/gemma-2b.yaml}"
PEAK_TFLOPS="${PEAK_TFLOPS:-989}"
BIN="${DARKFORMER_BIN:-$ROOT/build/darkformer}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
mkdir -p "$OUT"
echo "[bench_gpu] $(date -u '+%F %H:%M') device $DEVICE | uptime: $(uptime)"
[[ "$DEVICE" == cuda ]] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

# 1. Attention alone.
for kernel in exact performer darkformer; do
  [[ $kernel == exact ]] && continue  # timed beside each feature kernel, in the same run
  "$BIN" kernel-check --bench --device "$DEVICE" --kernel "$kernel" --heads "$HEADS" --kv-heads "$KV_HEADS" \
    --bench-head-dims "$HEAD_DIM" --bench-lengths "$LENGTHS" --exact-max-length 32768 --op "$OP" \
    --options "{num_features: $FEATURES}" --repeats "$REPEATS" --profile --json "$OUT/kernels_$kernel.jsonl" |
    grep -v '^  [a-z]\|^profile' || true
done

# 1b. Packed documents: masked / unmasked per implementation (documents_<kernel>.jsonl).
if (( DOCUMENTS > 0 )); then
  for kernel in performer darkformer; do
    "$BIN" kernel-check --bench --device "$DEVICE" --kernel "$kernel" --heads "$HEADS" --kv-heads "$KV_HEADS" \
      --bench-head-dims "$HEAD_DIM" --bench-lengths "$DOCUMENT_LENGTHS" --bench-batch "$DOCUMENT_BATCH" \
      --bench-documents "$DOCUMENTS" --exact-max-length 32768 --op "$OP" --options "{num_features: $FEATURES}" \
      --repeats "$REPEATS" --json "$OUT/documents_$kernel.jsonl"
  done
fi

# 2. The training step.
if [[ -z "${SHARDS_DIR:-}" ]]; then
  SHARDS_DIR="$OUT/demo_shards" TOKENIZER="$ROOT/data/demo/tokenizer.model"
  [[ -f "$SHARDS_DIR/manifest.yaml" ]] || "$BIN" prepare -i "$ROOT/data/demo/c4-demo-train.*.json.gz" \
    -t "$TOKENIZER" -o "$SHARDS_DIR" --val-fraction 0.05 >/dev/null
fi
: "${TOKENIZER:?set TOKENIZER with SHARDS_DIR}"

# Peak device memory of a process: nvidia-smi's memory.used (CUDA context included) on a GPU,
# VmHWM (peak RSS) on the CPU; sampled every 0.2 s.
peak_memory_of() {
  local pid=$1 peak=0 now
  while kill -0 "$pid" 2>/dev/null; do
    if [[ "$DEVICE" == cuda ]]; then
      now=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
            awk -F', ' -v p="$pid" '$1 == p {print $2 * 1048576}')
    else
      now=$(awk '/VmHWM/ {print $2 * 1024}' "/proc/$pid/status" 2>/dev/null)
    fi
    [[ -n "${now:-}" ]] && (( ${now%.*} > peak )) && peak=${now%.*}
    sleep 0.2
  done
  echo "$peak"
}

for tokens in $STEP_TOKENS; do
  run="$OUT/step_$tokens"
  rm -rf "$run"
  {
    echo "model:"
    grep -v '^#' "$MODEL" | sed 's/^/  /'
    cat <<YAML
attention:
  kernel: darkformer
  darkformer: {num_features: $FEATURES, op: $OP}
data: {shards_dir: $SHARDS_DIR, tokenizer: $TOKENIZER, seq_len: $tokens, batch_size: $STEP_BATCH}
train:
  device: $DEVICE
  steps: $STEPS
  trainable: ["*q_proj*", "*k_proj*", "*v_proj*", "*.kernel.*"]
  precision: bf16_autocast
  activation_checkpointing: true
  loss_chunk_tokens: 1024
  frozen_weights_bf16: true
  checkpoint_every: 0
  warmup_steps: 1
eval: {every: 0, batches: 1}
log: {dir: $run, every: 1}
YAML
  } > "$OUT/step_$tokens.yaml"
  "$BIN" train --config "$OUT/step_$tokens.yaml" > "$OUT/step_$tokens.log" 2>&1 &
  pid=$!
  peak=$(peak_memory_of "$pid")
  rc=0
  wait "$pid" || rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "[bench_gpu] step at $tokens tokens: train exited $rc (see $OUT/step_$tokens.log)"
    tail -5 "$OUT/step_$tokens.log"
    continue
  fi
  # The memory estimate's predicted peak for the same config, beside the allocator's measured one.
  predicted=$("$BIN" inspect --config "$OUT/step_$tokens.yaml" --memory 2>/dev/null |
              sed -n 's/.*predicted peak.*(\([0-9,]*\) bytes).*/\1/p' | tr -d ,)
  "$PY" "$ROOT/tools/bench_gpu_summary.py" "$run/metrics.jsonl" "$OUT/step_$tokens.yaml" "$peak" "$PEAK_TFLOPS" \
    "$DEVICE" "$OUT/steps.jsonl" "$predicted"
done
echo "[bench_gpu] JSON lines: $OUT/kernels_*.jsonl, $OUT/steps.jsonl"
