#!/usr/bin/env bash
# Benchmark (not a test): the paper's model at the paper's precision on this machine. Makes a
# random Gemma-2B with google/gemma-2b's config (transformers, bf16, sharded safetensors),
# converts it with tools/convert_hf_gemma.py to-h5, prepares C4 with Gemma's tokenizer, then runs
# a q/k/v-only darkformer finetune at 1 x 2048 tokens for each precision / memory setting and
# reports s/step (median of the steps after the first) and peak RSS, next to `inspect --memory`'s
# prediction when the binary has it.
#
#   C4_GLOB='path/c4/*.json.gz' TOKENIZER=path/gemma.model tools/bench_gemma2b_qkv.sh [setting ...]
#
# Settings: all (bf16 + checkpointing + chunked loss), all_frozen_bf16 (and frozen weights stored in
# bf16), bf16_ckpt, bf16_chunk, fp32_all, fp32_none;
# `prepare` makes the model, its .h5 and the shards only.
# A setting whose RSS passes RSS_LIMIT_GB (default 21) is stopped and reported as not fitting.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${BENCH_DIR:-$ROOT/build/bench/gemma2b}"
STEPS="${STEPS:-3}"
RSS_LIMIT_GB="${RSS_LIMIT_GB:-21}"
: "${C4_GLOB:?set C4_GLOB to C4 json.gz files}"
: "${TOKENIZER:?set TOKENIZER to the Gemma SentencePiece model}"
PY="$ROOT/.venv/bin/python"
BIN="$ROOT/build/darkformer"
mkdir -p "$WORK"

if [[ ! -f "$WORK/hf/config.json" ]]; then
  echo "[bench] making a random Gemma-2B (google/gemma-2b's config) in $WORK/hf"
  "$PY" - "$WORK/hf" <<'PYEOF'
import sys, torch
from transformers import GemmaConfig, GemmaForCausalLM
torch.manual_seed(0)
config = GemmaConfig(vocab_size=256000, hidden_size=2048, intermediate_size=16384, num_hidden_layers=18,
                     num_attention_heads=8, num_key_value_heads=1, head_dim=256, hidden_act="gelu_pytorch_tanh")
GemmaForCausalLM(config).to(torch.bfloat16).save_pretrained(sys.argv[1], max_shard_size="2GB")
PYEOF
fi
[[ -f "$WORK/gemma2b.h5" ]] || "$PY" "$ROOT/tools/convert_hf_gemma.py" to-h5 "$WORK/hf" "$WORK/gemma2b.h5"
[[ -d "$WORK/shards" ]] || "$BIN" prepare -i "$C4_GLOB" -t "$TOKENIZER" -o "$WORK/shards" --val-fraction 0.05
[[ "${1:-}" == prepare ]] && exit 0  # model, weights and data only

config_for() {  # setting -> run config path
  local name=$1 precision=float32 ckpt=false chunk=0 frozen_bf16=false
  case $name in
    all) precision=bf16_autocast ckpt=true chunk=1024 ;;
    all_frozen_bf16) precision=bf16_autocast ckpt=true chunk=1024 frozen_bf16=true ;;
    bf16_ckpt) precision=bf16_autocast ckpt=true ;;
    bf16_chunk) precision=bf16_autocast chunk=1024 ;;
    fp32_all) ckpt=true chunk=1024 ;;
    fp32_none) ;;
    *) echo "unknown setting $name" >&2; exit 2 ;;
  esac
  {
  echo "model:"
  grep -v '^#' "$ROOT/configs/model/gemma-2b.yaml" | sed 's/^/  /'
  cat <<YAML
attention:
  kernel: darkformer
  darkformer: {num_features: 128}
data:
  shards_dir: $WORK/shards
  tokenizer: $TOKENIZER
  seq_len: 2048
  batch_size: 1
train:
  init_from: $WORK/gemma2b.h5
  steps: $STEPS
  trainable: ["*q_proj*", "*k_proj*", "*v_proj*", "*.kernel.*"]
  precision: $precision
  activation_checkpointing: $ckpt
  loss_chunk_tokens: $chunk
  frozen_weights_bf16: $frozen_bf16
  checkpoint_every: 0
  warmup_steps: 1
eval: {every: 0, batches: 1}
log: {dir: $WORK/runs/$name, every: 1}
YAML
  } > "$WORK/$name.yaml"
  echo "$WORK/$name.yaml"
}

# Runs one setting, sampling RSS every 0.5 s (the peak is max VmHWM) and stopping it past the limit.
run_setting() {
  local name=$1 config peak_kb=0 limit_kb=$((RSS_LIMIT_GB * 1024 * 1024)) verdict=ok
  config=$(config_for "$name")
  rm -rf "$WORK/runs/$name"
  local predicted=""
  if "$BIN" inspect --help 2>/dev/null | grep -q -- --memory; then
    predicted=$("$BIN" inspect --config "$config" --memory 2>/dev/null | grep -i "peak" | head -1 || true)
  fi
  "$BIN" train --config "$config" > "$WORK/$name.log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    local hwm
    hwm=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
    [[ -n "$hwm" && "$hwm" -gt "$peak_kb" ]] && peak_kb=$hwm
    if [[ "$peak_kb" -gt "$limit_kb" ]]; then
      kill -9 "$pid" 2>/dev/null || true
      verdict="stopped: RSS passed ${RSS_LIMIT_GB} GB"
      break
    fi
    sleep 0.5
  done
  wait "$pid" 2>/dev/null || true
  local steps
  steps=$("$PY" "$ROOT/tools/bench_step_summary.py" "$WORK/runs/$name/metrics.jsonl")
  printf '[bench] %-10s | peak RSS %.2f GiB | %s | %s%s\n' "$name" "$(echo "$peak_kb / 1048576" | bc -l)" "$steps" \
    "$verdict" "${predicted:+ | inspect --memory: $predicted}"
}

echo "[bench] $(date -u +%H:%M) uptime: $(uptime)"
for setting in "${@:-all bf16_ckpt bf16_chunk fp32_all fp32_none}"; do
  for s in $setting; do run_setting "$s"; done
done
