#!/usr/bin/env bash
# Train a SmolLM2 adapter for few-shot prompts whose demonstrations are cached documents, then measure it beside the
# model it starts from on the three few-shot sets (docs/finetune.md, "Few-shot prompts"). About 7 minutes on one H200:
#   SMOLLM2_GGUF=/path/SmolLM2-135M-Instruct.Q4_1.gguf bash benchmarks/finetune_few_shot.sh OUT_DIR
#   bash benchmarks/finetune_few_shot.sh OUT_DIR --smoke      # CPU, a few questions: the script's structure
#
# Training: a LoRA adapter over BASE (smollm2; INIT_ADAPTER continues one, such as smollm2-block) for TRAIN_STEPS (500)
# or TRAIN_MINUTES (4), whichever ends first, at learning rate LR (3e-4), distilled from the model's own full
# attention as training starts, frozen, on plain few-shot prompts made from Sphinx's messages in twelve languages that
# no evaluation set uses (`--few-shot sphinx-languages`): half the rows (FULL_SHARE) full rows, which hold full mode
# where it starts, half ape_prefix block rows (each demonstration encoded after the system line, as lazy mode with
# ape_prefix serves it). EXTRA holds more `lazyattn finetune` arguments (later ones win).
# Evaluation: `lazyattn eval` of the new adapter and of the model it starts from (the latter alongside the training)
# on builtin:icl-language, builtin:icl-language-more and builtin:icl, 5 / 10 / 20 demonstrations, modes full and lazy
# with ape_prefix (EVAL_START=0: the adapter's only).
#
# OUT_DIR gets summary.md (every evaluation's table), finetune.log, adapter/ (with finetune.json) and eval/<model>-<set>/
# (eval.json, eval.md, log).
set -uo pipefail
out="${1:?usage: [SMOLLM2_GGUF=FILE] bash benchmarks/finetune_few_shot.sh OUT_DIR [--smoke]}"
smoke="${2:-}"
mkdir -p "$out/eval"
out="$(cd "$out" && pwd)"
work="${WORK_DIR:-$(mktemp -d /tmp/finetune_few_shot.XXXXXX)}"
cd "$(dirname "$0")/.."
. benchmarks/from_tree.sh "$work"  # lazyattn from the tree; SMOLLM2_GGUF: the model file, where there is no index

base="${BASE:-smollm2}"
from="$base"
init=()
teacher=base
if [ -n "${INIT_ADAPTER:-}" ]; then
    init=(--init-adapter "$INIT_ADAPTER") teacher=start from="$INIT_ADAPTER"
fi
train=(--steps "${TRAIN_STEPS:-500}" --batch-size 16 --max-minutes "${TRAIN_MINUTES:-4}" --prompts 3000)
evalopts=(--num-docs 5,10,20 --batch-size 64 --engine-option warm_up=false --kv-cache-gb 4 --host-cache-gb 0)
sets=(icl-language icl-language-more icl)
if [ "$smoke" = "--smoke" ]; then  # minutes of a CPU: two steps, a few questions of one set
    train=(--steps 2 --batch-size 2 --prompts 8 --held-out 2 --device cpu --max-tokens 1000)
    evalopts=(--num-docs 5 --batch-size 4 --device cpu --limit 4)
    sets=(icl-language)
fi

evaluate() {  # MODEL NAME: every set, one after another
    for s in "${sets[@]}"; do
        local tokens=3
        [ "$s" = icl ] && tokens=8
        $py -m lazyattn eval --model "$1" --dataset "builtin:$s" --modes full,lazy:ape_prefix=true \
            --max-tokens "$tokens" "${evalopts[@]}" --out "$out/eval/$2-$s" > "$out/eval/$2-$s.log" 2>&1 \
            || echo "evaluation of $2 on $s failed: $out/eval/$2-$s.log"
    done
}

stamp "training"
ev=
if [ "${EVAL_START:-1}" = 1 ]; then  # EVAL_START=0: the adapter only (another run measured the start)
    evaluate "$from" start &
    ev=$!
fi
$py -m lazyattn finetune --model "$base" "${init[@]}" --out "$out/adapter" --distill --few-shot sphinx-languages \
    --ape-prefix --teacher "$teacher" --distill-full-share "${FULL_SHARE:-0.5}" --answer-tokens 4 \
    --lr "${LR:-3e-4}" "${train[@]}" --no-progress ${EXTRA:-} > "$out/finetune.log" 2>&1
rc=$?
tail -3 "$out/finetune.log"
[ -z "$ev" ] || wait $ev
[ $rc -eq 0 ] || { echo "training failed ($rc): $out/finetune.log"; exit $rc; }
stamp "evaluating the adapter"
evaluate "$out/adapter" adapter
stamp done
for f in "$out"/eval/*/eval.md; do
    echo "## $(basename "$(dirname "$f")")"
    cat "$f"
    echo
done > "$out/summary.md"
