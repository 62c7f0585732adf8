#!/usr/bin/env bash
# Benchmark (not a test), ready for the day a GPU is lent; it runs unchanged on the CPU, and
# tests/tools/test_bench_gpu.py runs it there at toy sizes. Its parts run in the order of PARTS,
# the issue's goals first, so a lease's time limit cuts the informative rest (the third lease lost
# its sharp rows behind a slow step).
#  1. Attention alone: exact (SDPA) against performer and darkformer, forward + backward, at
#     Gemma 2B's head shape (8 query heads, 1 KV head, head_dim 256, m = 256), L = 2k / 8k / 32k:
#     ms, peak device memory and the ops each dispatches per layer call (the launch count), via
#     `kernel-check --bench --device $DEVICE --profile` (each timed call ends in a device sync),
#     once per dtype of DTYPES: bf16 as a bf16 model runs it (kernels_<kernel>_bf16.jsonl: SDPA in
#     bf16, flash where it applies; our operator under autocast), and fp32 (kernels_<kernel>.jsonl).
#     Each call's whole output, with the profile of every form (each launch's own device time on
#     CUDA), goes to kernels_<kernel>[_bf16].log.
#  1b. Packed documents (data.document_masking, issue 40): each implementation with masking beside
#     its own unmasked time, at DOCUMENT_LENGTHS with DOCUMENT_BATCH rows of documents of mean
#     length DOCUMENTS; exact also one call per document (`kernel-check --bench-documents`).
#  1c. fla's chunk_linear_attn with Performer features in PyTorch, bf16, against SDPA in the same
#     process (tools/bench_fla.py, fla.jsonl; a row saying why where CUDA, triton or fla is missing).
#  1d. op: cuda cut otherwise (CUDA_CUTS: chunk_size, its sub_chunk key and optionally its
#     segment_chunks key; an x after them: its pairs key, exponentials; a p: its precompute_features
#     key, true), bf16, beside SDPA: kernels_<kernel>_bf16_c<chunk>s<sub>[g<segment>][x][p].jsonl,
#     each row's chunk_size, sub_chunk, segment_chunks, pairs and precompute_features as they ran.
#  2. The paper's step, Gemma 2B q/k/v-only finetuning (bf16 autocast, activation checkpointing,
#     chunked loss), for each of STEP_KERNELS at each of STEP_SHAPES (batch x tokens): ms, tokens/s,
#     MFU, peak device memory, and on CUDA the caching allocator's peak beside `inspect --memory`'s
#     prediction for the same config (steps.jsonl, one row per kernel and shape).
#  3. Sharp rows (issue 53: within 1.2x of ordinary rows), bf16 at SHARP_LENGTHS: ordinary rows,
#     then rows of norm SHARP_NORM (queries near u, keys near -u: `--bench-norm`), one call after
#     the other on the same warm device (sharp_<kernel>.jsonl; each row's bench_norm says which).
#
#   DEVICE=cuda tools/bench_gpu.sh
#
# Environment (defaults in brackets): DEVICE [cuda], OUT [build/bench/gpu-$DEVICE], PARTS [attention
# cuts fla sharp step documents: 1, 1d, 1c, 3, 2, 1b], LENGTHS [2048,8192,32768], DTYPES [bf16 fp32],
# DOCUMENTS [256; 0 skips 1b], DOCUMENT_LENGTHS [4096,16384], DOCUMENT_BATCH [4], FLA [1; 0 skips
# 1c], HEADS [8], KV_HEADS [1], HEAD_DIM [256], FEATURES [256], REPEATS [3], OP [auto:
# chunk_parallel on CUDA; a list, e.g. auto,cuda, times each], CHUNK [64: the feature kernels'
# chunk_size], CUDA_CUTS [none: 1d skipped; a list of chunk:sub_chunk[:segment_chunks][x][p], e.g.
# 64:32,64:32:100000 (whole rows),64:32x (pairs by exponentials),64:32p (features precomputed): op:
# cuda in bf16 so cut, beside SDPA: kernels_<kernel>_bf16_c<chunk>s<sub>[g<segment>][x][p].jsonl and
# .log], CUT_LENGTHS [LENGTHS: 1d's], SHARP_NORM
# [60; 0 skips 3], SHARP_LENGTHS [8192], STEP_OP [the last form of OP: the step's], STEP_KERNELS
# [exact performer darkformer], STEP_SHAPES [8x2048 1x16384], STEPS [4],
# MODEL [configs/model/gemma-2b.yaml], SHARDS_DIR and TOKENIZER [the demo corpus, prepared into
# OUT; token ids only need to fit the model's vocabulary], PEAK_TFLOPS [989: H100/H200 dense
# bf16], PYTHON [the project's .venv], CHECK_ONLY [0; 1 checks PARTS and CUDA_CUTS, says what it
# would run, and exits].
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEVICE="${DEVICE:-cuda}"
OUT="${OUT:-$ROOT/build/bench/gpu-$DEVICE}"
LENGTHS="${LENGTHS:-2048,8192,32768}"
CUT_LENGTHS="${CUT_LENGTHS:-$LENGTHS}"
HEADS="${HEADS:-8}" KV_HEADS="${KV_HEADS:-1}" HEAD_DIM="${HEAD_DIM:-256}" FEATURES="${FEATURES:-256}"
REPEATS="${REPEATS:-3}" OP="${OP:-auto}" DTYPES="${DTYPES:-bf16 fp32}" FLA="${FLA:-1}"
PARTS="${PARTS:-attention cuts fla sharp step documents}"
PARTS="${PARTS//,/ }"  # commas too, so gpu_check.sh's BENCH_ENV (split on spaces) can give a list
DOCUMENTS="${DOCUMENTS:-256}" DOCUMENT_LENGTHS="${DOCUMENT_LENGTHS:-4096,16384}" DOCUMENT_BATCH="${DOCUMENT_BATCH:-4}"
STEP_KERNELS="${STEP_KERNELS:-exact performer darkformer}" STEP_SHAPES="${STEP_SHAPES:-8x2048 1x16384}"
STEPS="${STEPS:-4}" CHUNK="${CHUNK:-64}" SHARP_NORM="${SHARP_NORM:-60}" SHARP_LENGTHS="${SHARP_LENGTHS:-8192}"
STEP_OP="${STEP_OP:-${OP##*,}}"
CUDA_CUTS="${CUDA_CUTS:-}"
for cut in ${CUDA_CUTS//,/ }; do  # checked before anything runs
  [[ "$cut" =~ ^[1-9][0-9]*:[1-9][0-9]*(:[1-9][0-9]*)?x?p?$ ]] ||
    { echo "[bench_gpu] CUDA_CUTS: '$cut' is not chunk:sub_chunk[:segment_chunks][x][p] (positive integers, e.g. 64:32, 64:32x or 64:32p)" >&2; exit 2; }
done
FEATURE_OPTIONS="num_features: $FEATURES, chunk_size: $CHUNK"  # every feature kernel's, in every part
MODEL="${MODEL:-$ROOT/configs/model/gemma-2b.yaml}"
PEAK_TFLOPS="${PEAK_TFLOPS:-989}"
BIN="${DARKFORMER_BIN:-$ROOT/build/darkformer}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
for part in $PARTS; do  # checked before anything runs
  [[ " attention cuts documents fla step sharp " == *" $part "* ]] ||
    { echo "[bench_gpu] PARTS: unknown part '$part' (attention, cuts, documents, fla, step, sharp)" >&2; exit 2; }
done
if [[ "${CHECK_ONLY:-0}" == 1 ]]; then  # tools/gpu_lease.sh's test: the lease's plan is one this takes
  echo "[bench_gpu] would run: parts $PARTS; op $OP; cuts ${CUDA_CUTS:-none} at $CUT_LENGTHS"; exit 0
fi
mkdir -p "$OUT"
echo "[bench_gpu] $(date -u '+%F %H:%M') device $DEVICE | uptime: $(uptime)"
[[ "$DEVICE" == cuda ]] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

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

# 1. Attention alone, per dtype; every call's whole output, profiles included, to kernels_*.log.
# kernel-check for one kernel: attention_call KERNEL DTYPE OPS OPTIONS NAME [LENGTHS] (OUT/NAME.jsonl and .log).
attention_call() {
  "$BIN" kernel-check --bench --device "$DEVICE" --dtype "$2" --kernel "$1" --heads "$HEADS" \
    --kv-heads "$KV_HEADS" --bench-head-dims "$HEAD_DIM" --bench-lengths "${6:-$LENGTHS}" --exact-max-length 32768 \
    --op "$3" --options "{$4}" --repeats "$REPEATS" --profile \
    --json "$OUT/$5.jsonl" > "$OUT/$5.log" 2>&1 || true
  grep -v '^  [a-z]\|^profile' "$OUT/$5.log" || true
}
part_attention() {
  for dtype in $DTYPES; do
    for kernel in performer darkformer; do  # exact is timed beside each feature kernel, in the same run
      attention_call "$kernel" "$dtype" "$OP" "$FEATURE_OPTIONS" "kernels_$kernel$([[ $dtype == fp32 ]] || echo "_$dtype")"
    done
  done
}

# 1d. op: cuda at other cuts (CUDA_CUTS: chunk:sub_chunk[:segment_chunks][x][p]; its keys, which
# other forms refuse), bf16.
part_cuts() {
  for cut in ${CUDA_CUTS//,/ }; do
    local pairs="" precompute=""
    if [[ "$cut" == *p ]]; then precompute=true; cut="${cut%p}"; fi
    if [[ "$cut" == *x ]]; then pairs=exponentials; cut="${cut%x}"; fi
    IFS=: read -r chunk sub segment <<< "$cut"
    local options="num_features: $FEATURES, chunk_size: $chunk, sub_chunk: $sub" name="c${chunk}s${sub}"
    if [[ -n "$segment" ]]; then options+=", segment_chunks: $segment"; name+="g$segment"; fi
    if [[ -n "$pairs" ]]; then options+=", pairs: $pairs"; name+="x"; fi
    if [[ -n "$precompute" ]]; then options+=", precompute_features: true"; name+="p"; fi
    for kernel in performer darkformer; do
      attention_call "$kernel" bf16 cuda "$options" "kernels_${kernel}_bf16_$name" "$CUT_LENGTHS"
    done
  done
}

# 1b. Packed documents: masked / unmasked per implementation (documents_<kernel>.jsonl).
part_documents() {
  if (( DOCUMENTS > 0 )); then
    for kernel in performer darkformer; do
      "$BIN" kernel-check --bench --device "$DEVICE" --kernel "$kernel" --heads "$HEADS" --kv-heads "$KV_HEADS" \
        --bench-head-dims "$HEAD_DIM" --bench-lengths "$DOCUMENT_LENGTHS" --bench-batch "$DOCUMENT_BATCH" \
        --bench-documents "$DOCUMENTS" --exact-max-length 32768 --op "$OP" \
        --options "{$FEATURE_OPTIONS}" \
        --repeats "$REPEATS" --json "$OUT/documents_$kernel.jsonl"
    done
  fi
}

# 1c. fla's chunk form, bf16, against SDPA in its own process (a row saying why where it cannot run).
part_fla() {
  if [[ "$FLA" == 1 ]]; then
    "$PY" "$ROOT/tools/bench_fla.py" --lengths "$LENGTHS" --heads "$HEADS" --kv-heads "$KV_HEADS" \
      --head-dim "$HEAD_DIM" --features "$FEATURES" --dtype bf16 --repeats "$REPEATS" --json "$OUT/fla.jsonl" ||
      echo "[bench_gpu] bench_fla.py failed (exit $?)"
  fi
}

# 2. The training step.
part_step() {
  if [[ -z "${SHARDS_DIR:-}" ]]; then
    SHARDS_DIR="$OUT/demo_shards" TOKENIZER="$ROOT/data/demo/tokenizer.model"
    [[ -f "$SHARDS_DIR/manifest.yaml" ]] || "$BIN" prepare -i "$ROOT/data/demo/c4-demo-train.*.json.gz" \
      -t "$TOKENIZER" -o "$SHARDS_DIR" --val-fraction 0.05 >/dev/null
  fi
  : "${TOKENIZER:?set TOKENIZER with SHARDS_DIR}"
  for shape in $STEP_SHAPES; do
    batch=${shape%x*} tokens=${shape#*x}
    for kernel in $STEP_KERNELS; do
      name="step_${kernel}_${batch}x$tokens"
      run="$OUT/$name"
      rm -rf "$run"
      kernel_options=""
      [[ $kernel != exact ]] && kernel_options="  $kernel: {$FEATURE_OPTIONS, op: $STEP_OP}"
      {
        echo "model:"
        grep -v '^#' "$MODEL" | sed 's/^/  /'
        cat <<YAML
attention:
  kernel: $kernel
$kernel_options
data: {shards_dir: $SHARDS_DIR, tokenizer: $TOKENIZER, seq_len: $tokens, batch_size: $batch}
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
      } > "$OUT/$name.yaml"
      "$BIN" train --config "$OUT/$name.yaml" > "$OUT/$name.log" 2>&1 &
      pid=$!
      peak=$(peak_memory_of "$pid")
      rc=0
      wait "$pid" || rc=$?
      if [[ $rc -ne 0 ]]; then
        echo "[bench_gpu] $kernel step at $batch x $tokens tokens: train exited $rc (see $OUT/$name.log)"
        tail -5 "$OUT/$name.log"
        continue
      fi
      # The memory estimate's predicted peak for the same config, beside the allocator's measured one.
      predicted=$("$BIN" inspect --config "$OUT/$name.yaml" --memory 2>/dev/null |
                  sed -n 's/.*predicted peak.*(\([0-9,]*\) bytes).*/\1/p' | tr -d ,)
      "$PY" "$ROOT/tools/bench_gpu_summary.py" "$run/metrics.jsonl" "$OUT/$name.yaml" "$peak" "$PEAK_TFLOPS" \
        "$DEVICE" "$OUT/steps.jsonl" "$predicted"
    done
  done
}

# 3. Sharp rows beside ordinary ones, bf16 (sharp_<kernel>.jsonl).
part_sharp() {
  if [[ "$SHARP_NORM" != 0 ]]; then
    for kernel in performer darkformer; do
      rm -f "$OUT/sharp_$kernel.jsonl"
      for norm in 0 "$SHARP_NORM"; do
        "$BIN" kernel-check --bench --device "$DEVICE" --dtype bf16 --kernel "$kernel" --heads "$HEADS" \
          --kv-heads "$KV_HEADS" --bench-head-dims "$HEAD_DIM" --bench-lengths "$SHARP_LENGTHS" --exact-max-length 32768 \
          --op "$OP" --options "{$FEATURE_OPTIONS}" --repeats "$REPEATS" --bench-norm "$norm" \
          --json "$OUT/sharp_$kernel.part.jsonl"
        cat "$OUT/sharp_$kernel.part.jsonl" >> "$OUT/sharp_$kernel.jsonl" && rm -f "$OUT/sharp_$kernel.part.jsonl"
      done
    done
  fi
}

for part in $PARTS; do "part_$part"; done

echo "[bench_gpu] JSON lines: $OUT/kernels_*.jsonl, $OUT/documents_*.jsonl, $OUT/fla.jsonl, $OUT/sharp_*.jsonl, $OUT/steps.jsonl"
