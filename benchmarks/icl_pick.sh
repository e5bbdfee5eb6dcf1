#!/usr/bin/env bash
# The few-shot setting picked on labelled questions, per set and model, and checked on the others (docs/quality.md,
# "In-context learning"): `lazyattn eval --pick-on 100` over builtin:icl-language, builtin:icl-language-more and the
# two hold-outs, builtin:icl-language-heldout and builtin:icl-language-heldout-wagtail, for smollm2 and smollm2-block,
# the eight runs side by side on one GPU. The candidates: lazy mode with the shared prefix, alone and with each
# demonstration's last 2, 3, 4, 6 or 8 rows recomputed in context.
#   SMOLLM2_GGUF=/path/SmolLM2-135M-Instruct.Q4_1.gguf bash benchmarks/icl_pick.sh OUT_DIR
#   bash benchmarks/icl_pick.sh OUT_DIR --smoke      # CPU, a few questions of one set: the script's structure
#   bash benchmarks/icl_pick.sh OUT_DIR --guided-choice   # any other argument goes to every lazyattn eval
#
# OUT_DIR gets summary.md (each run's pick and check) and <model>-<set>/ (eval.json, eval.md) with <model>-<set>.log.
set -uo pipefail
out="${1:?usage: [SMOLLM2_GGUF=FILE] bash benchmarks/icl_pick.sh OUT_DIR [--smoke] [EVAL_ARG ...]}"
shift
smoke=
extra=()
for a in "$@"; do
    if [ "$a" = "--smoke" ]; then smoke=$a; else extra+=("$a"); fi
done
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.."
. benchmarks/from_tree.sh "${WORK_DIR:-$(mktemp -d /tmp/icl_pick.XXXXXX)}"

p=lazy:ape_prefix=true
modes=full,$p,$p:relink_last_tokens=2,$p:relink_last_tokens=3,$p:relink_last_tokens=4,$p:relink_last_tokens=6
modes=$modes,$p:relink_last_tokens=8
opts=(--num-docs 5,10,20 --max-tokens 3 --batch-size 64 --pick-on 100 --engine-option warm_up=false --kv-cache-gb 4
    --host-cache-gb 0 --no-progress)
sets=(icl-language icl-language-more icl-language-heldout icl-language-heldout-wagtail)
models=(smollm2 smollm2-block)
if [ "$smoke" = "--smoke" ]; then
    opts=(--num-docs 5 --max-tokens 3 --batch-size 4 --pick-on 2 --limit 4 --device cpu --no-progress)
    sets=(icl-language-heldout-wagtail)
    models=(smollm2)
fi

stamp "picking"
for m in "${models[@]}"; do
    for s in "${sets[@]}"; do
        $py -m lazyattn eval --model "$m" --dataset "builtin:$s" --modes "$modes" "${opts[@]}" "${extra[@]}" --out "$out/$m-$s" \
            > "$out/$m-$s.log" 2>&1 || echo "$m on $s failed: $out/$m-$s.log" &
    done
done
wait
stamp done
for m in "${models[@]}"; do
    for s in "${sets[@]}"; do
        echo "## $m, $s"
        grep -A1 "^Picked on the first" "$out/$m-$s/eval.md" || tail -3 "$out/$m-$s.log"
        echo
    done
done > "$out/summary.md"
cat "$out/summary.md"
