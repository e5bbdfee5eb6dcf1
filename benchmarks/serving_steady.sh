#!/usr/bin/env bash
# The steady-state headline (docs/benchmarks.md, "Steady state"): one mode per GPU, each inside a time budget, then
# one merge into the side-by-side table and plot.
#   CUDA_VISIBLE_DEVICES=0 bash benchmarks/serving_steady.sh OUT lazy [lazyattn bench options]   # OUT/lazy/
#   bash benchmarks/serving_steady.sh OUT --merge                                                # OUT/merged/
# A run writes OUT/MODE/steady.{json,md}, the TTFT-vs-rate plot and OUT/MODE.log; steady.json is rewritten after every
# point, so what was measured survives a stop from outside. BUDGET_S (default 470) is the run's time from the start
# of `lazyattn bench`, model load and warm-up included; the process is killed at BUDGET_S + 35 s whatever happens.
# Defaults: Llama-3.1-8B shapes with random bf16 weights, the paper workload, 40 GiB of KV, no host tier, a search
# start per mode near its expected sustainable rate on an H100; any option given after the mode overrides them.
set -uo pipefail
out="${1:?usage: bash benchmarks/serving_steady.sh OUT MODE|--merge [lazyattn bench options]}"
what="${2:?usage: bash benchmarks/serving_steady.sh OUT MODE|--merge [lazyattn bench options]}"
shift 2
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.."
# The device image has torch, triton, numpy, matplotlib and tqdm but not lazyattn installed: run from the tree.
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "$what" = "--merge" ]; then
    runs=()
    for mode in lazy block prefix full; do
        [ -f "$out/$mode/steady.json" ] && runs+=("$out/$mode")
    done
    python3 -m lazyattn bench --merge "${runs[@]}" --out "$out/merged" "$@"
    exit $?
fi
case "$what" in
    lazy) start=16 ;;
    block) start=8 ;;
    *) start=2 ;;
esac
budget="${BUDGET_S:-470}"
timeout -k 5 "$((${budget%.*} + 35))" python3 -m lazyattn bench --model benchmarks/models/llama-3.1-8b --random-weights \
    --dtype bfloat16 --kv-cache-gb 40 --host-cache-gb 0 --workload paper --rate-search --modes "$what" \
    --search-start "$start" --budget-s "$budget" --no-progress --out "$out/$what" "$@" 2>&1 | tee "$out/$what.log"
exit "${PIPESTATUS[0]}"
