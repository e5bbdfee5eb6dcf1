#!/usr/bin/env bash
# Train a SmolLM2 adapter for the encoding lazy mode serves with ape_prefix=True, then measure it beside the shipped
# smollm2-block (docs/finetune.md, "Training for the shared prefix"). About 7 minutes on one H200:
#   SMOLLM2_GGUF=/path/SmolLM2-135M-Instruct.Q4_1.gguf bash benchmarks/finetune_prefix.sh OUT_DIR
#   bash benchmarks/finetune_prefix.sh OUT_DIR --smoke      # CPU, a few questions: the script's structure
#
# Training: continues smollm2-block (--init-adapter) for TRAIN_STEPS (250) or TRAIN_MINUTES (3), whichever ends
# first, at learning rate LR (1e-4), distilled on the Jargon File (real prose that shares no source with the
# evaluation sets) from smollm2-block's own full attention as training starts, frozen (--teacher start): half the
# rows (FULL_SHARE) full rows, which hold full mode where it starts, half ape_prefix block rows (documents read the
# system prompt, as lazy mode with ape_prefix encodes them), both prompt layouts in turn, gold first / middle / last.
# LABELLED_SHARE (0) of the rows may come from the labelled synthetic set instead; TEACHER=self FULL_SHARE=0 distils
# from the adapter being trained (a moving target) with block rows only.
# Evaluation: `lazyattn eval` of the new adapter and of smollm2-block on builtin:real and builtin:real-heldout, 5 and 10
# documents, gold first / middle / last, layouts block-attention and short-answer, modes full and lazy with
# ape_prefix. smollm2-block's runs go alongside the training (the GPU has room for both), the new adapter's after it.
#
# OUT_DIR gets three files: summary.md (the comparison of benchmarks/finetune_prefix_summary.py, then every eval
# table), finetune.log, and results.tar.gz (the new adapter in adapter/, each evaluation's eval.json, eval.md,
# accuracy.png and log under eval/). The work happens in WORK_DIR (default: a new folder under /tmp).
# SmolLM2's GGUF: `--model smollm2` resolves through $LAZYATTN_CACHE; a machine that cannot fetch it (no package
# index) gets it from SMOLLM2_GGUF, linked into a cache in WORK_DIR.
set -uo pipefail
out="${1:?usage: [SMOLLM2_GGUF=FILE] bash benchmarks/finetune_prefix.sh OUT_DIR [--smoke]}"
smoke="${2:-}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="${WORK_DIR:-$(mktemp -d /tmp/finetune_prefix.XXXXXX)}"
mkdir -p "$work/eval"
cd "$(dirname "$0")/.."
# The device image has torch, transformers and peft but not lazyattn installed: run from the tree.
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -n "${SMOLLM2_GGUF:-}" ]; then
    export LAZYATTN_CACHE="$work/cache"
    mkdir -p "$LAZYATTN_CACHE/models/smollm2"
    ln -sf "$(realpath "$SMOLLM2_GGUF")" "$LAZYATTN_CACHE/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
fi
py="${PYTHON:-python3}"
start=$(date +%s)
stamp() { echo "[$(($(date +%s) - start)) s] $*"; }

# About 0.7 s a step of 8 rows on an H200 (eager attention, rows up to ~2,100 tokens): 250 steps fill 3 minutes, so
# the learning rate ends its cosine near where the time limit stops it.
train=(--steps "${TRAIN_STEPS:-250}" --batch-size 8 --max-minutes "${TRAIN_MINUTES:-3}" --prompts 1200 --examples 8000)
evalopts=(--num-docs 5,10 --gold-position first,middle,last --batch-size 64 --engine-option warm_up=false
    --kv-cache-gb 4 --host-cache-gb 0)
# Each evaluation is stopped after this many seconds (BLOCK_SECONDS, PREFIX_SECONDS; SETS: the builtin sets), so
# that the whole run ends inside 9 minutes: smollm2-block's
# start with the training, the new adapter's after it.
block_seconds=${BLOCK_SECONDS:-480} prefix_seconds=${PREFIX_SECONDS:-240} background=1
if [ "$smoke" = "--smoke" ]; then  # minutes of a CPU: two steps, one cell per evaluation, one at a time
    train=(--steps 2 --batch-size 2 --prompts 8 --examples 8 --held-out 2 --device cpu --answer-tokens 4
        --docs-per-prompt 2,3 --max-tokens 1000)  # fp32 eager attention on a CPU: short rows
    evalopts=(--num-docs 5 --gold-position first --batch-size 2 --device cpu --limit 2 --max-tokens 4)
    block_seconds=1800 prefix_seconds=1800 background=0
fi

# name dataset layout model seconds: one `lazyattn eval` (in the background on the GPU), its log beside its results
run_eval() {
    local name="$1-$2-$3"
    mkdir -p "$work/eval/$name"
    timeout "$5" "$py" -m lazyattn.cli eval --model "$4" --dataset "builtin:$2" --prompt-layout "$3" \
        --modes full,lazy:ape_prefix=true --no-progress "${evalopts[@]}" --out "$work/eval/$name" \
        >"$work/eval/$name/eval.log" 2>&1 &
    [ "$background" = 1 ] || wait $! || stamp "$name failed: see eval/$name/eval.log"
}
wait_all() {  # every background job; the failures counted
    local failed=0 pid
    for pid in $(jobs -p); do wait "$pid" || failed=$((failed + 1)); done
    [ "$failed" = 0 ] || stamp "$failed evaluation(s) failed or timed out: see eval/*/eval.log"
}

"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
"$py" -c "from lazyattn.model.hub import resolve_model; print(resolve_model('smollm2'))" || exit 1

stamp "smollm2-block evaluations start"
for set in ${SETS:-real real-heldout}; do
    for layout in block-attention short-answer; do run_eval block "$set" "$layout" smollm2-block "$block_seconds"; done
done

stamp "training starts"
"$py" -m lazyattn.cli finetune --model smollm2 --init-adapter smollm2-block --out "$work/adapter" \
    --ape-prefix --prompt-layouts block-attention,short-answer --lr "${LR:-1e-4}" \
    --distill --documents jargon-file --teacher "${TEACHER:-start}" --distill-full-share "${FULL_SHARE:-0.5}" \
    --docs-per-prompt 2,3,4,5,6,8,10 --passage-chars 1000 --answer-tokens 32 --max-tokens 1800 \
    --labelled-share "${LABELLED_SHARE:-0}" --no-progress "${train[@]}" 2>&1 |
    tee "$work/finetune.log"
trained=${PIPESTATUS[0]}
stamp "training done (exit $trained)"

if [ "$trained" = 0 ]; then
    for set in ${SETS:-real real-heldout}; do
        for layout in block-attention short-answer; do
            run_eval prefix "$set" "$layout" "$work/adapter" "$prefix_seconds"
        done
    done
fi
wait_all
stamp "evaluations done"

{
    echo "# ape_prefix adapter (prefix) vs smollm2-block (block)"
    echo
    grep -h "^loss\|^distillation KL" "$work/finetune.log"
    echo
    "$py" -m benchmarks.finetune_prefix_summary "$work"
    for f in "$work"/eval/*/eval.md; do
        printf '\n## %s\n\n' "$(basename "$(dirname "$f")")"
        cat "$f"
    done
} >"$work/summary.md"
tar -czf "$out/results.tar.gz" -C "$work" --exclude ./cache . && cp "$work/summary.md" "$work/finetune.log" "$out/"
stamp "wrote $out/summary.md, finetune.log and results.tar.gz (work in $work)"
head -n 40 "$work/summary.md"
[ "$trained" = 0 ]
