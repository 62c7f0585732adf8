#!/usr/bin/env bash
# The paper's protocol (DARKFormer §6) at our scale: prepare C4, pretrain a small Gemma with exact
# attention, then three finetuning sweeps (all kernels; q/k/v-only; seven learning rates for
# performer and darkformer) and the plots.
# Usage: tools/run_experiments.sh PART, one of the parts below (CPU_PARTS: the cpu protocol's parts).
#   micro: CPU smoke test, under 10 minutes on 2 cores.  gpu: about 25 minutes on one H100.
#   cpu: the protocol where attention matters, on 2 cores: multi-query associative recall (MQAR,
#        generated; pretrain exact to 0.99 answer accuracy, then kernels x m x init, q/k/v-only and
#        seven learning rates, three seeds each) and C4 at 256 tokens (kernels, three seeds).
#   cpu-kernels: the other seeds' kernels on cpu's MQAR task (gerf, saderf, trig, slay, flexformer;
#        mqar_seed_kernels.yaml), from cpu's MQAR pretrain (run here when it is not there yet).
#   cpu-seeds: five seeds where three left a paired interval straddling 0 (mqar_five_seeds.yaml),
#        and the seven learning rates with five seeds for the fig. 5 spread (mqar_lr_stability.yaml).
#   cpu-c4, cpu-c4-qkv: C4 where attention matters: 512 tokens, a longer exact pretrain
#        (c4_long_pretrain.yaml, run by whichever part comes first), then 1,000-step finetunes of
#        exact, constant, performer, darkformer and lfk, three seeds, full (cpu-c4, also saderf and
#        sderf) or q/k/v-only (cpu-c4-qkv). They need C4: C4_GLOB must match json.gz files (docs/data.md).
#   cpu-c4-kernels: the other seeds' kernels on the same C4 setting (gerf, saderf, aderf, sderf,
#        trig, flexformer, slay; c4_long_seed_kernels.yaml) beside seed-matched performer,
#        darkformer, constant and exact runs; needs C4.
#   cpu-c4-steps: cpu-c4's performer and darkformer finetunes three times as long (3,000 steps,
#        c4_long_steps.yaml): does Performer close the gap given more steps (fig. 3)? Needs C4.
#   cpu-c4-shared: cpu-c4's performer and darkformer finetunes beside darkformer with one M per
#        layer instead of one per query head (c4_long_shared_m.yaml). Needs C4.
#   cpu-c4-queries: the same finetunes with M on the queries only (apply_to: queries, a learned
#        bilinear form of the same size, no metric) beside both sides, per query head and one per
#        layer (c4_long_queries_map.yaml): the metric, or the parameters? Needs C4.
#   cpu-c4-importance: the same finetunes with darkformer's draws importance-weighted (target:
#        softmax: Performer's kernel, M the proposal's covariance only) beside darkformer and
#        Performer (c4_long_importance.yaml): lower variance, or the changed kernel? Then every
#        final model under the other seeds' draws (swap_draws.py, redraw_table.py). Needs C4.
#   cpu-c4-redraw: cpu-c4-importance's three arms trained with a fresh draw every step
#        (c4_long_redraw.yaml): does any of darkformer's gain survive when M must help every draw?
#        Evaluated the same way, and against cpu-c4-importance's models when that part has run
#        (against_fixed.md). Needs C4.
#   cpu-c4-redraw-every-n: the same arms with a fresh draw every 10 and every 100 steps
#        (c4_long_redraw_every_n.yaml), between the two; evaluated the same way, per interval
#        (redraw_every10.md, against_fixed_every10.md, ...). Needs C4.
#   cpu-c4-qkv-importance, cpu-c4-qkv-redraw, cpu-c4-qkv-redraw-every-n: the same parts under
#        q/k/v-only finetuning (c4_long_qkv_importance.yaml, c4_long_qkv_redraw.yaml, the last every
#        100 steps only: c4_long_qkv_redraw_every_n.yaml; the redrawn compare with the first's models
#        when it has run). Needs C4.
#   cpu-c4-lr: finding 4 on C4 (c4_long_lr_stability.yaml): performer and darkformer over five
#        learning rates, three seeds, 300 steps each from the same pretrain; needs C4 as well.
#   cpu-c4-masked: cpu-c4's finetunes of exact, constant, performer and darkformer with and without
#        data.document_masking (c4_long_masking.yaml), every run then evaluated with masking on;
#        tools/masking_effect.py pairs the arms. Needs C4.
#   cpu-c4-short-masked, cpu-c4-shorter-masked: the same question where windows hold about 4 or 8
#        documents: C4 cut to each document's first 128 or 64 tokens (prepare --max-document-tokens),
#        500-step finetunes (c4_short_docs_masking.yaml, c4_shorter_docs_masking.yaml) from the same
#        pretrain. Need C4.
#   cpu-c4-2k-masked: the same question in the paper's setting, windows of 2,048 tokens of uncut
#        documents (half the causal pairs across documents): an exact pretrain at 2,048 tokens
#        (c4_2k_pretrain.yaml), then 500-step performer and darkformer finetunes (c4_2k_masking.yaml,
#        five seeds), then exact and constant ones (c4_2k_baselines.yaml, three seeds). Needs C4.
#   cpu-c4-2k-features: the same 2,048-token finetunes with m = 256 features beside m = 64, exact
#        and constant (c4_2k_features.yaml, three seeds), then from the same pretrain in windows of
#        512 (c4_2k_short_windows.yaml): are the features per position, or the window, why random
#        features recover little of exact's gain there? Needs C4.
#   cpu-c4-2k-steps: cpu-c4-2k-features' m = 64 finetunes, exact and constant three times as long
#        (1,500 steps, c4_2k_steps.yaml, three seeds) beside the same runs at 500 steps (c4_2k_features'
#        m = 64 arms): do longer finetunes close the rest of the gap at 2,048 tokens? Needs C4.
# Environment: DF (darkformer binary; default build/darkformer, built with tools/build.sh unless
# SKIP_BUILD=1), C4_GLOB (C4 json.gz files), PYTHON (with matplotlib; default .venv/bin/python).
# Everything is resumable: rerun the same command after an interruption.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SIZES=(micro cpu gpu)
CPU_PARTS=(cpu-kernels cpu-seeds cpu-c4 cpu-c4-qkv cpu-c4-kernels cpu-c4-steps cpu-c4-shared cpu-c4-queries cpu-c4-importance cpu-c4-redraw cpu-c4-redraw-every-n cpu-c4-qkv-importance cpu-c4-qkv-redraw cpu-c4-qkv-redraw-every-n cpu-c4-lr cpu-c4-masked cpu-c4-short-masked cpu-c4-shorter-masked cpu-c4-2k-masked cpu-c4-2k-features cpu-c4-2k-steps)
one_of() {  # one_of WORD LIST...: whether WORD is one of LIST
  local word="$1" each
  shift
  for each in "$@"; do [[ "$each" == "$word" ]] && return 0; done
  return 1
}
SIZE="${1:-}"
if one_of "$SIZE" "${SIZES[@]}"; then
  PART="$SIZE"
elif one_of "$SIZE" "${CPU_PARTS[@]}"; then
  PART="$SIZE"
  SIZE=cpu
else
  echo "usage: tools/run_experiments.sh PART: the part must be one of ${SIZES[*]} ${CPU_PARTS[*]}, got '$SIZE'" >&2
  exit 2
fi
CONF="configs/experiments/$SIZE"
RUNS="runs/experiments/$SIZE"
DF="${DF:-build/darkformer}"
PYTHON="${PYTHON:-.venv/bin/python}"
C4_GLOB="${C4_GLOB:-$ROOT/data/c4/*.json.gz}"  # docs/data.md: where to get C4
start=$(date +%s)
[[ "${SKIP_BUILD:-0}" == 1 ]] || tools/build.sh --target darkformer

# A sweep exits 1 when some run failed (recorded in its summary); go on with the rest.
status=0
sweep() {  # sweep NAME [--set ...]
  echo "== sweep $1"
  local name="$1"
  shift
  "$DF" sweep --config "$CONF/$name.yaml" "$@" || status=$?
  [[ $status == 130 ]] && exit 130
  return 0
}

# The c4_long parts' first steps, on C4 itself (no stand-in): its shards, then the exact pretrain
# at 512 tokens (c4_pretrain CONFIG: another pretrain's config, c4_2k_pretrain's 2,048 tokens). Both
# resumable: nothing to do when they have finished.
c4_pretrain() {
  local config="$1"
  compgen -G "$C4_GLOB" >/dev/null || { echo "$PART needs C4: no file matches C4_GLOB=$C4_GLOB (docs/data.md)" >&2; exit 2; }
  SHARDS=data/c4/shards
  "$DF" prepare -i "$C4_GLOB" --val-fraction 0.05 -t data/demo/tokenizer.model -o "$SHARDS"
  echo "== C4 step 1: pretrain $config (exact attention; nothing to do when it has finished)"
  "$DF" train --config "$CONF/$config.yaml" --set "data.shards_dir=$SHARDS"
}
c4_long_pretrain() { c4_pretrain c4_long_pretrain; }

if [[ "$PART" == cpu-kernels || "$PART" == cpu-seeds ]]; then  # MQAR only: no C4 needed
  echo "== MQAR step 1: pretrain (exact attention; nothing to do when it has finished)"
  "$DF" train --config "$CONF/mqar_pretrain.yaml"
  if [[ "$PART" == cpu-kernels ]]; then names=(mqar_seed_kernels); else names=(mqar_five_seeds mqar_lr_stability); fi
  for name in "${names[@]}"; do
    sweep "$name"
    "$PYTHON" tools/aggregate_runs.py --runs "$RUNS/$name" --md "$RUNS/$name/aggregate.md" --json "$RUNS/$name/aggregate.json"
  done
  if [[ "$PART" == cpu-seeds ]]; then
    "$PYTHON" tools/lr_stability.py --sweep "$RUNS/mqar_lr_stability" --pair "darkformer m=64 identity" "performer m=64" \
      --json "$RUNS/mqar_lr_stability/stability.json" | tee "$RUNS/mqar_lr_stability/stability.md"
  fi
  echo "done in $(( $(date +%s) - start )) s; tables: $RUNS/{${names[*]// /,}}/aggregate.md"
  exit $status
fi

if [[ "$PART" == cpu-c4-lr ]]; then  # finding 4 on C4 (issue 38): C4 itself, no stand-in
  c4_long_pretrain
  sweep c4_long_lr_stability --set "fixed.data.shards_dir=$SHARDS"
  "$PYTHON" tools/aggregate_runs.py --runs "$RUNS/c4_long_lr_stability" --md "$RUNS/c4_long_lr_stability/aggregate.md" \
    --json "$RUNS/c4_long_lr_stability/aggregate.json"
  "$PYTHON" tools/lr_stability.py --sweep "$RUNS/c4_long_lr_stability" --pair "darkformer m=64 identity" "performer m=64" \
    --json "$RUNS/c4_long_lr_stability/stability.json" | tee "$RUNS/c4_long_lr_stability/stability.md"
  echo "done in $(( $(date +%s) - start )) s; tables: $RUNS/c4_long_lr_stability/{aggregate,stability}.md"
  exit $status
fi

if [[ "$PART" == cpu-c4-masked || "$PART" == cpu-c4-short-masked || "$PART" == cpu-c4-shorter-masked ||
      "$PART" == cpu-c4-2k-masked ]]; then  # issue 40: packed windows with and without document masking
  names=(c4_long_masking) cut=0
  if [[ "$PART" == cpu-c4-2k-masked ]]; then c4_pretrain c4_2k_pretrain; names=(c4_2k_masking c4_2k_baselines); else c4_long_pretrain; fi
  [[ "$PART" == cpu-c4-short-masked ]] && names=(c4_short_docs_masking) cut=128
  [[ "$PART" == cpu-c4-shorter-masked ]] && names=(c4_shorter_docs_masking) cut=64
  if (( cut > 0 )); then  # the pretrain's documents and split, each cut to its first $cut tokens
    SHARDS=data/c4/shards-cut$cut
    "$DF" prepare -i "$C4_GLOB" --val-fraction 0.05 --max-document-tokens $cut -t data/demo/tokenizer.model -o "$SHARDS"
  fi
  for name in "${names[@]}"; do
    sweep "$name" --set "fixed.data.shards_dir=$SHARDS"
    echo "== masked evaluation of every finished run of $name (both arms)"
    for run in "$RUNS/$name"/*/; do
      [[ -f "$run/summary.json" && ! -f "$run/masked_eval.json" ]] || continue
      "$DF" eval --config "$run/config.yaml" --checkpoint "$run" --set data.document_masking=true >"$run/masked_eval.json.tmp" &&
        mv "$run/masked_eval.json.tmp" "$run/masked_eval.json" || status=1
    done
    "$PYTHON" tools/masking_effect.py --sweep "$RUNS/$name" --json "$RUNS/$name/masking.json" | tee "$RUNS/$name/masking.md"
  done
  tables=("${names[@]/#/$RUNS/}")
  echo "done in $(( $(date +%s) - start )) s; tables: ${tables[*]/%//masking.md}"
  exit $status
fi

if [[ "$PART" == cpu-c4-kernels ]]; then  # the other seeds' kernels, paired with performer and darkformer
  c4_long_pretrain
  name=c4_long_seed_kernels
  sweep "$name" --set "fixed.data.shards_dir=$SHARDS"
  "$PYTHON" tools/aggregate_runs.py --runs "$RUNS/$name" --md "$RUNS/$name/aggregate.md" --json "$RUNS/$name/aggregate.json"
  pairs=()
  for kernel in "gerf m=64" "aderf m=64" "trig m=64" "flexformer m=64 stationary" "flexformer m=64 nonstationary" "slay m=16"; do
    pairs+=(--pair "$kernel" "performer m=64" --pair "darkformer m=64 identity" "$kernel" --pair "$kernel" constant)
  done
  # seed 002's order of the FAVOR estimators' variance: gerf > saderf > aderf > sderf
  pairs+=(--pair "saderf m=64" "gerf m=64" --pair "aderf m=64" "saderf m=64" --pair "sderf m=64" "aderf m=64")
  pairs+=(--pair "darkformer m=64 identity" "performer m=64" --pair exact constant --pair exact "darkformer m=64 identity")
  "$PYTHON" tools/paired_diff.py --sweep "$RUNS/$name" "${pairs[@]}" --step 100 --step 500 --step 1000 | tee "$RUNS/$name/paired.md"
  echo "done in $(( $(date +%s) - start )) s; tables: $RUNS/$name/{aggregate,paired}.md"
  exit $status
fi

if [[ "$PART" == cpu-c4-steps ]]; then  # fig. 3's narrowing: the same finetunes, three times as long
  c4_long_pretrain
  name=c4_long_steps
  sweep "$name" --set "fixed.data.shards_dir=$SHARDS"
  "$PYTHON" tools/aggregate_runs.py --runs "$RUNS/$name" --md "$RUNS/$name/aggregate.md" --json "$RUNS/$name/aggregate.json"
  "$PYTHON" tools/paired_diff.py --sweep "$RUNS/$name" --pair "darkformer m=64 identity" "performer m=64" \
    --step 250 --step 500 --step 1000 --step 2000 --step 3000 | tee "$RUNS/$name/paired.md"
  echo "done in $(( $(date +%s) - start )) s; tables: $RUNS/$name/{aggregate,paired}.md"
  exit $status
fi

if [[ "$PART" == cpu-c4-shared ]]; then  # darkformer's M per query head against one per layer
  c4_long_pretrain
  name=c4_long_shared_m
  sweep "$name" --set "fixed.data.shards_dir=$SHARDS"
  "$PYTHON" tools/aggregate_runs.py --runs "$RUNS/$name" --md "$RUNS/$name/aggregate.md" --json "$RUNS/$name/aggregate.json"
  per_head="darkformer m=64 identity share_across_heads=False" shared="darkformer m=64 identity share_across_heads=True"
  "$PYTHON" tools/paired_diff.py --sweep "$RUNS/$name" --pair "$per_head" "performer m=64" --pair "$shared" "performer m=64" \
    --pair "$per_head" "$shared" --step 100 --step 500 --step 1000 | tee "$RUNS/$name/paired.md"
  echo "done in $(( $(date +%s) - start )) s; tables: $RUNS/$name/{aggregate,paired}.md"
  exit $status
fi

if [[ "$PART" == cpu-c4-queries ]]; then  # darkformer's M on both sides (a metric) or the queries only
  c4_long_pretrain
  name=c4_long_queries_map
  sweep "$name" --set "fixed.data.shards_dir=$SHARDS"
  "$PYTHON" tools/aggregate_runs.py --runs "$RUNS/$name" --md "$RUNS/$name/aggregate.md" --json "$RUNS/$name/aggregate.json"
  point() { echo "darkformer m=64 identity apply_to=$1 share_across_heads=$2"; }
  "$PYTHON" tools/paired_diff.py --sweep "$RUNS/$name" --pair "$(point both False)" "performer m=64" \
    --pair "$(point queries False)" "performer m=64" --pair "$(point both False)" "$(point queries False)" \
    --pair "$(point both True)" "$(point queries True)" --pair "$(point queries True)" "performer m=64" \
    --step 100 --step 500 --step 1000 | tee "$RUNS/$name/paired.md"
  echo "done in $(( $(date +%s) - start )) s; tables: $RUNS/$name/{aggregate,paired}.md"
  exit $status
fi

if [[ "$PART" =~ ^cpu-c4(-qkv)?-(importance|redraw|redraw-every-n)$ ]]; then  # M as the kernel's metric or a proposal only
  family=c4_long${BASH_REMATCH[1]:+_qkv}  # full or q/k/v-only finetuning
  name=${family}_${BASH_REMATCH[2]//-/_}
  c4_long_pretrain
  sweep "$name" --set "fixed.data.shards_dir=$SHARDS"
  "$PYTHON" tools/aggregate_runs.py --runs "$RUNS/$name" --md "$RUNS/$name/aggregate.md" --json "$RUNS/$name/aggregate.json"
  # The sweep's run names say its redraw policies: none ("performer-m64_seed0"), every step
  # ("performer-m64-redraw-every-step_seed0") or every n ("...-redraw-every-n-redraw-interval10_seed0").
  firsts=("$RUNS/$name"/performer-m64*_seed0)
  for first in "${firsts[@]}"; do
    suffix=${first##*/performer-m64} suffix=${suffix%_seed0}
    interval=""
    [[ "$suffix" == *-redraw-interval* ]] && interval=${suffix##*-redraw-interval}
    tag=${interval:+_every$interval}  # one table set per interval
    label=""  # aggregate_runs.py names the interval in a point's label only where it tells points apart
    (( ${#firsts[@]} > 1 )) && label=${interval:+ redraw_interval=$interval}
    point() { echo "darkformer m=64 identity$label target=$1"; }
    plain="performer m=64$label"
    "$PYTHON" tools/paired_diff.py --sweep "$RUNS/$name" --pair "$(point metric)" "$plain" \
      --pair "$(point softmax)" "$plain" --pair "$(point metric)" "$(point softmax)" \
      --step 100 --step 500 --step 1000 | tee "$RUNS/$name/paired$tag.md"
    # Each final model under its own draw and under the other seeds' draws (tools/swap_draws.py):
    # how much of it fits its own sample.
    evals="$RUNS/$name/redraw$tag.jsonl" swapped="$RUNS/$name/swapped.h5"
    : > "$evals"
    performer=performer-m64$suffix metric=darkformer-m64-init-identity-target-metric$suffix
    softmax=darkformer-m64-init-identity-target-softmax$suffix
    for dir in "$performer" "$metric" "$softmax"; do
      for seed in 0 1 2; do
        run="$RUNS/$name/${dir}_seed$seed"
        for draw in 0 1 2; do
          checkpoint="$run/checkpoints/step_00001000.h5"
          if [[ $draw != "$seed" ]]; then
            "$PYTHON" tools/swap_draws.py "$checkpoint" "$RUNS/$name/${dir}_seed$draw/checkpoints/step_00001000.h5" "$swapped" >/dev/null
            checkpoint="$swapped"
          fi
          echo "{\"point\": \"$dir\", \"seed\": $seed, \"draw_from\": $draw, \"eval\": $("$DF" eval --config "$run/config.yaml" --checkpoint "$checkpoint" 2>/dev/null | tail -1)}" >> "$evals"
        done
      done
    done
    rm -f "$swapped"
    "$PYTHON" tools/redraw_table.py --evals "$evals" --pair "$softmax" "$performer" --pair "$metric" "$performer" \
      --pair "$metric" "$softmax" | tee "$RUNS/$name/redraw$tag.md"
    fixed="$RUNS/${family}_importance/redraw.jsonl"  # the same arms trained on one draw, when that part has run
    if [[ -n "$suffix" && -f "$fixed" ]]; then
      echo "== redrawn${interval:+ every $interval steps} against fixed-draw training, seed by seed"
      "$PYTHON" tools/redraw_table.py --evals "$evals" "$fixed" --pair "$performer" "${performer%"$suffix"}" \
        --pair "$metric" "${metric%"$suffix"}" --pair "$softmax" "${softmax%"$suffix"}" | tee "$RUNS/$name/against_fixed$tag.md"
    fi
  done
  echo "done in $(( $(date +%s) - start )) s; tables: $RUNS/$name/{aggregate,paired*,redraw*}.md"
  exit $status
fi

if [[ "$PART" == cpu-c4-2k-steps ]]; then  # the rest of the gap at 2,048 tokens: three times the steps
  c4_pretrain c4_2k_pretrain
  name=c4_2k_steps
  sweep "$name" --set "fixed.data.shards_dir=$SHARDS"
  "$PYTHON" tools/aggregate_runs.py --runs "$RUNS/$name" --md "$RUNS/$name/aggregate.md" --json "$RUNS/$name/aggregate.json"
  "$PYTHON" tools/paired_diff.py --sweep "$RUNS/$name" --pair "darkformer m=64 identity" "performer m=64" \
    --pair exact constant --pair "performer m=64" constant --pair "darkformer m=64 identity" constant \
    --step 500 --step 1000 --step 1500 | tee "$RUNS/$name/paired.md"
  # The same seeds at 500 steps: c4_2k_features' m = 64 arms (its m = 256 ones left for that part).
  sweep c4_2k_features --set "fixed.data.shards_dir=$SHARDS" --set "grid.attention=[{kernel: performer, \
performer: {num_features: 64}}, {kernel: darkformer, darkformer: {num_features: 64, init: identity}}, {kernel: exact}, \
{kernel: constant}]"
  "$PYTHON" tools/compare_sweeps.py --a "$RUNS/$name" --b "$RUNS/c4_2k_features" --label-a 1500 --label-b 500 \
    --baseline constant | tee "$RUNS/$name/against_500.md"
  echo "done in $(( $(date +%s) - start )) s; tables: $RUNS/$name/{aggregate,paired,against_500}.md"
  exit $status
fi

if [[ "$PART" == cpu-c4-2k-features ]]; then  # the features per position at 2,048 tokens
  c4_pretrain c4_2k_pretrain
  name=c4_2k_features
  sweep "$name" --set "fixed.data.shards_dir=$SHARDS"
  "$PYTHON" tools/aggregate_runs.py --runs "$RUNS/$name" --md "$RUNS/$name/aggregate.md" --json "$RUNS/$name/aggregate.json"
  "$PYTHON" tools/paired_diff.py --sweep "$RUNS/$name" --pair "performer m=256" "performer m=64" \
    --pair "darkformer m=256 identity" "darkformer m=64 identity" --pair "darkformer m=64 identity" "performer m=64" \
    --pair "darkformer m=256 identity" "performer m=256" --pair exact constant \
    --pair "performer m=64" constant --pair "performer m=256" constant \
    --pair "darkformer m=64 identity" constant --pair "darkformer m=256 identity" constant \
    --step 100 --step 200 --step 500 | tee "$RUNS/$name/paired.md"
  name=c4_2k_short_windows
  sweep "$name" --set "fixed.data.shards_dir=$SHARDS"
  "$PYTHON" tools/aggregate_runs.py --runs "$RUNS/$name" --md "$RUNS/$name/aggregate.md" --json "$RUNS/$name/aggregate.json"
  "$PYTHON" tools/paired_diff.py --sweep "$RUNS/$name" --pair "darkformer m=64 identity" "performer m=64" \
    --pair exact constant --pair "performer m=64" constant --pair "darkformer m=64 identity" constant \
    --step 100 --step 200 --step 500 | tee "$RUNS/$name/paired.md"
  echo "done in $(( $(date +%s) - start )) s; tables: $RUNS/{c4_2k_features,$name}/{aggregate,paired}.md"
  exit $status
fi

if [[ "$PART" == cpu-c4 || "$PART" == cpu-c4-qkv ]]; then  # C4 itself: no stand-in
  c4_long_pretrain
  name=$([[ "$PART" == cpu-c4 ]] && echo c4_long_kernels || echo c4_long_qkv)
  sweep "$name" --set "fixed.data.shards_dir=$SHARDS"
  "$PYTHON" tools/aggregate_runs.py --runs "$RUNS/$name" --md "$RUNS/$name/aggregate.md" --json "$RUNS/$name/aggregate.json"
  "$PYTHON" tools/paired_diff.py --sweep "$RUNS/$name" --pair "exact" "constant" \
    --pair "darkformer m=64 identity" "performer m=64" --pair "darkformer m=64 identity" "lfk m=64" \
    --step 100 --step 200 --step 500 --step 1000 | tee "$RUNS/$name/paired.md"
  echo "done in $(( $(date +%s) - start )) s; tables: $RUNS/$name/{aggregate,paired}.md"
  exit $status
fi

# Data: C4 shards with the demo tokenizer; without a C4 sample, the demo corpus stands in.
SHARDS=data/c4/shards
if compgen -G "$C4_GLOB" >/dev/null; then
  "$DF" prepare -i "$C4_GLOB" --val-fraction 0.05 -t data/demo/tokenizer.model -o "$SHARDS"
else
  echo "no C4 files match C4_GLOB=$C4_GLOB: using the demo corpus shards as a stand-in" >&2
  "$DF" prepare -i 'data/demo/c4-demo-train.*.json.gz' --val-input 'data/demo/c4-demo-validation.*.json.gz' \
    -t data/demo/tokenizer.model -o data/demo/shards
  SHARDS=data/demo/shards
fi

if [[ "$SIZE" == cpu ]]; then
  echo "== MQAR step 1: pretrain (exact attention)"
  "$DF" train --config "$CONF/mqar_pretrain.yaml"
  for name in mqar_kernels mqar_qkv mqar_lr_sweep; do sweep "$name"; done
  echo "== C4 step 1: pretrain (exact attention)"
  "$DF" train --config "$CONF/c4_pretrain.yaml" --set "data.shards_dir=$SHARDS"
  sweep c4_kernels --set "fixed.data.shards_dir=$SHARDS"
else
  echo "== step 1: pretrain (exact attention)"
  "$DF" train --config "$CONF/pretrain.yaml" --set "data.shards_dir=$SHARDS"
  for name in kernels qkv lr_sweep; do sweep "$name" --set "fixed.data.shards_dir=$SHARDS"; done
fi

echo "== plots"
"$PYTHON" tools/plot_runs.py --runs "$RUNS" --out "$RUNS/plots" --label "$SIZE"
# Mean and 95 % t-interval over seeds for every sweep point (docs/results.md quotes these).
"$PYTHON" tools/aggregate_runs.py --runs "$RUNS" --md "$RUNS/aggregate.md" --json "$RUNS/aggregate.json"
echo "done in $(( $(date +%s) - start )) s; tables: $RUNS/*/summary.md, plots: $RUNS/plots/"
exit $status
