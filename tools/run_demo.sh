#!/usr/bin/env bash
# The main job on the embedded demo corpus: setup, build, prepare token shards, pretrain a small
# Gemma with exact attention, finetune it with DARKFormer attention, evaluate both. CPU is enough.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
tools/build.sh --target darkformer
DF=build/darkformer
# prepare is resumable: a finished run is a no-op.
$DF prepare -i 'data/demo/c4-demo-train.*.json.gz' --val-input 'data/demo/c4-demo-validation.*.json.gz' \
  -t data/demo/tokenizer.model -o data/demo/shards
$DF train --config configs/demo/pretrain.yaml "$@"
$DF train --config configs/demo/finetune.yaml "$@"
echo "== pretrained (exact):"
$DF eval --config configs/demo/pretrain.yaml
echo "== finetuned (darkformer):"
$DF eval --config configs/demo/finetune.yaml
echo "== a sample from the finetuned model (greedy):"
$DF generate --config configs/demo/finetune.yaml --prompt "The" --max-new-tokens 32 --greedy
echo "run directories: runs/demo-pretrain runs/demo-finetune-darkformer (metrics.jsonl, spikes.jsonl, summary.json)"
