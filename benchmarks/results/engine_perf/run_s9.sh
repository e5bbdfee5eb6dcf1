#!/bin/bash
# Session 9 (H100): the host's plan of the short-query prefill's splits. STAGES picks what runs (space-separated);
# outputs land in $OUT.
#   sweep    s9_plan_sweep.py: the prefill kernel with the host plan against its own chunking (kernel alone)
#   ab       engine.py decode_rag + ttft_rag with the plan off (LAZYATTN_PREFILL_PLAN=0) and on, alternated twice
#   targets  kernels.py --sections targets (issue 10's attention targets; prefill split as the engine's graphs do)
#   on       engine.py, every section, defaults
#   ktests   pytest -m gpu tests/kernels
#   etests   pytest -m gpu tests/engine tests/cache tests/model
set -u
STAGES=${STAGES:-ab}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=/tmp/s9; rm -rf $W; mkdir -p $W; L=$OUT/s9.log
. "$(dirname "$0")/lib.sh"  # device_info, step, ab_engine
device_info
for stage in $STAGES; do
  case $stage in
    sweep)   step sweep timeout -k 5 300 python benchmarks/results/engine_perf/s9_plan_sweep.py $W/s9_plan_sweep.json ;;
    ab)      for r in 1 2; do
               for p in 0 1; do
                 step plan${p}_$r timeout -k 5 150 env LAZYATTN_PREFILL_PLAN=$p python benchmarks/engine.py \
                   --sections decode_rag,ttft_rag --batches 16 --out $W/s9_plan${p}_$r
               done
             done ;;
    targets) step targets timeout -k 5 300 python benchmarks/kernels.py --sections targets --out $W/s9_targets ;;
    on)      step on timeout -k 5 400 python benchmarks/engine.py --out $W/s9_on ;;
    ktests)  step ktests timeout -k 5 400 python -m pytest -q -m gpu tests/kernels ;;
    etests)  step etests timeout -k 5 400 python -m pytest -q -m gpu tests/engine tests/cache tests/model ;;
  esac
done
cp $W/*.json $W/*.md $OUT/ 2>/dev/null
true
