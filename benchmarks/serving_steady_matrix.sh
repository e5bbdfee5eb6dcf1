#!/usr/bin/env bash
# The steady-state matrix (docs/benchmarks.md, "Steady state"): runs of serving_steady.sh spread over a machine's
# GPUs, one run per GPU at a time, each GPU taking the next run of the list when it frees, then one merge per folder.
#   bash benchmarks/serving_steady_matrix.sh OUT [RUNS]
# RUNS is a file of lines "NAME MODE [options]" ('#' starts a comment); without it, the list below, most wanted first.
# A run writes OUT/NAME/MODE (serving_steady.sh OUT/NAME MODE options) and the merge OUT/NAME/merged.
# BUDGET_S (470) is each run's budget; END_S (none), seconds from the start: a run that could not end by then is not
# started, and is listed in OUT/skipped.txt. GPUS: how many workers (default: nvidia-smi's GPU count, else 1).
set -uo pipefail
out="${1:?usage: bash benchmarks/serving_steady_matrix.sh OUT [RUNS]}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
here="$(cd "$(dirname "$0")" && pwd)"
runs="$out/runs.txt"
if [ -n "${2:-}" ]; then
    grep -v '^\s*\(#\|$\)' "$2" > "$runs"
else
    cat > "$runs" <<'LIST'
paper lazy
paper block
paper prefix
paper full
paper-host lazy --host-cache-gb 32
paper-host block --host-cache-gb 32
long lazy --workload long
long block --workload long
wide lazy --workload wide
wide block --workload wide
paper-membound lazy --workload paper-membound
paper-membound block --workload paper-membound
long prefix --workload long
long full --workload long
wide prefix --workload wide
wide full --workload wide
wide-membound lazy --workload wide-membound
wide-membound block --workload wide-membound
long-membound lazy --workload long-membound
long-membound block --workload long-membound
LIST
fi
gpus="${GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)}"
[ "${gpus:-0}" -ge 1 ] 2>/dev/null || gpus=1
budget="${BUDGET_S:-470}"
start=$SECONDS
claims="$out/.claims"
rm -rf "$claims" "$out/skipped.txt"
mkdir -p "$claims"

worker() {
    local gpu=$1 i=0 name mode opts
    while IFS= read -r line; do
        i=$((i + 1))
        mkdir "$claims/$i" 2>/dev/null || continue # another worker took it
        read -r name mode opts <<< "$line"
        if [ -n "${END_S:-}" ] && [ $((SECONDS - start + ${budget%.*} + 40)) -gt "$END_S" ]; then
            echo "$line" >> "$out/skipped.txt"
            continue
        fi
        echo "[$((SECONDS - start)) s] GPU $gpu: $name $mode $opts"
        # shellcheck disable=SC2086  # the options are words
        CUDA_VISIBLE_DEVICES=$gpu BUDGET_S=$budget bash "$here/serving_steady.sh" "$out/$name" "$mode" $opts > /dev/null
        echo "[$((SECONDS - start)) s] GPU $gpu: $name $mode done (exit $?)"
    done < "$runs"
}

for ((g = 0; g < gpus; g++)); do worker "$g" & done
wait
for name in $(cut -d' ' -f1 "$runs" | sort -u); do
    [ -d "$out/$name" ] && bash "$here/serving_steady.sh" "$out/$name" --merge > "$out/$name/merge.log" 2>&1
done
rm -rf "$claims"
[ -f "$out/skipped.txt" ] && echo "not started (END_S): $(wc -l < "$out/skipped.txt") runs, listed in $out/skipped.txt"
exit 0
