#!/usr/bin/env bash
# APE's tilt beside the shared prefix (docs/quality.md, "Tilting the documents' weights"): SmolLM2 and smollm2-block
# on the three realistic sets, 5 and 10 documents, gold first / middle / last, full attention against lazy mode with
# the prefix at tilts 0, 0.5, 1 and 2; then the label-free calibration of the tilt on Jargon File prompts, both
# layouts. Every evaluation runs at once on one GPU; about 3 minutes on one H200:
#   SMOLLM2_GGUF=/path/SmolLM2-135M-Instruct.Q4_1.gguf bash benchmarks/quality_ape_tilt.sh OUT_DIR
# OUT_DIR gets one folder per evaluation (eval.md, eval.json; calibrate.md, calibrate.json) and its log.
set -uo pipefail
out="${1:?usage: [SMOLLM2_GGUF=FILE] bash benchmarks/quality_ape_tilt.sh OUT_DIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
. benchmarks/smollm2_gguf.sh "$out"  # SMOLLM2_GGUF: the model file, where there is no package index
engine=(--engine-option warm_up=false --kv-cache-gb 4 --host-cache-gb 0 --no-progress)
ev() {  # name model set layout modes
    timeout 420 python3 -m lazyattn.cli eval --model "$2" --dataset "builtin:$3" --prompt-layout "$4" --modes "$5" \
        --num-docs 5,10 --gold-position first,middle,last --batch-size 64 "${engine[@]}" --out "$out/$1" \
        >"$out/$1.log" 2>&1 &
}
p=lazy:ape_prefix=true
for set in real real-heldout real-heldout-readme; do
    for layout in block-attention short-answer; do
        ev "blk-$set-$layout" smollm2-block "$set" "$layout" "full,$p,$p:ape_tilt=0.5,$p:ape_tilt=1,$p:ape_tilt=2"
    done
    ev "base-$set-block-attention" smollm2 "$set" block-attention "full,$p,$p:ape_tilt=1,$p:ape_tilt=2"
done
for layout in block-attention short-answer; do
    timeout 420 python3 -m lazyattn.cli eval --calibrate --model smollm2-block --calibrate-documents jargon-file \
        --calibrate-prefix on --temperatures 1 --tilts=0,0.5,1,2 --num-docs 5 --prompt-layout "$layout" \
        "${engine[@]}" --out "$out/cal-$layout" >"$out/cal-$layout.log" 2>&1 &
done
failed=0
for pid in $(jobs -p); do wait "$pid" || failed=$((failed + 1)); done
for f in "$out"/*.log; do echo "== $(basename "$f"): $(grep -E "cells in|^chosen" "$f" | tail -1)"; done
[ "$failed" = 0 ] || { echo "$failed run(s) failed: see $out/*.log"; exit 1; }
