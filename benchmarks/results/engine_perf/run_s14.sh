#!/bin/bash
# Session 14 (H100): batch-1 decode attention's fixed cost. STAGES picks what runs (space-separated); outputs in $OUT
# as one tarball. BASE: the tree before the session's decode changes, unpacked into .s14base (`mkdir .s14base &&
# git archive 802aae6 lazyattn benchmarks/engine.py benchmarks/kernels.py benchmarks/models | tar x -C .s14base`).
#   dtests     pytest -m gpu tests/kernels/test_decode.py
#   micro      s14/decode_graph.py (decode bs 1 x 10 304 keys per layer, alone and after a RoPE launch): BASE, then
#              this tree with PREFETCHES (default "0 2 4") pages prefetched, alternated twice
#   ab         engine.py decode_rag + ttft_rag (batch 16): BASE and this tree with each of EPREFETCHES (default "0
#              2"), alternated twice
# The prefetch (LAZYATTN_DECODE_PREFETCH, call 1) gained nothing and was taken out: s14/decode_l2_prefetch.patch puts
# it back (`git apply`); without it the variable is ignored and every "this" run is the same tree.
#   ktests     pytest -m gpu tests/kernels
#   etests     pytest -m gpu tests/engine tests/cache tests/model
#   targets    kernels.py --sections targets
#   on         engine.py, every section, defaults
set -u
STAGES=${STAGES:-dtests micro}
PREFETCHES=${PREFETCHES:-0 2 4}
EPREFETCHES=${EPREFETCHES:-0 2}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=/tmp/s14; rm -rf $W; mkdir -p $W; L=$W/s14_$(echo $STAGES | tr ' ' '_').log
. "$(dirname "$0")/lib.sh"  # device_info, step, ab_engine
device_info
MICRO=benchmarks/results/engine_perf/s14/decode_graph.py
for stage in $STAGES; do
  case $stage in
    dtests)  step dtests timeout -k 5 300 python -m pytest -q -m gpu tests/kernels/test_decode.py ;;
    micro)   for r in 1 2; do
               step micro_base_$r timeout -k 5 120 env PYTHONPATH=$PWD/.s14base python $MICRO $W/s14_micro.json base
               for p in $PREFETCHES; do
                 step micro_p${p}_$r timeout -k 5 120 env LAZYATTN_DECODE_PREFETCH=$p python $MICRO \
                   $W/s14_micro.json this_p$p
               done
             done ;;
    ab)      for r in 1 2; do
               step ab_base_$r timeout -k 5 150 env PYTHONPATH=$PWD/.s14base python .s14base/benchmarks/engine.py \
                 --sections decode_rag,ttft_rag --batches 16 --out $W/s14_base_$r
               for p in $EPREFETCHES; do
                 step ab_p${p}_$r timeout -k 5 150 env LAZYATTN_DECODE_PREFETCH=$p python benchmarks/engine.py \
                   --sections decode_rag,ttft_rag --batches 16 --out $W/s14_p${p}_$r
               done
             done ;;
    ktests)  step ktests timeout -k 5 400 python -m pytest -q -m gpu tests/kernels ;;
    etests)  step etests timeout -k 5 400 python -m pytest -q -m gpu tests/engine tests/cache tests/model ;;
    targets) step targets timeout -k 5 300 python benchmarks/kernels.py --sections targets --out $W/s14_targets ;;
    on)      step on timeout -k 5 400 python benchmarks/engine.py --out $W/s14_on ;;
  esac
done
cd $W && tar czf $OUT/s14_$(echo $STAGES | tr ' ' '_').tgz *.json *.md *.log 2>/dev/null
true
