#!/bin/bash
# Session 7 (H100): the decode fusion and programmatic dependent launch (PDL) landed in session 6's last commits
# without a GPU run. STAGES picks what runs (space-separated); every stage's output lands in $OUT.
#   on       engine.py, every section, defaults (fusion on, PDL on)
#   nopdl    engine.py decode/TTFT sections, LAZYATTN_PDL=0
#   base     engine.py decode/TTFT sections, LAZYATTN_DECODE_FUSION=0 LAZYATTN_PDL=0 (session 6's path)
#   maxm64   engine.py, every section, LAZYATTN_GEMV_MAX_M=64 (the skinny kernel for up to 64 rows)
#   pf4/pf16 engine.py decode sections, LAZYATTN_GEMV_PREFETCH=4/16 (L2 prefetch of weights before the PDL wait)
#   on2      the defaults again (noise)
#   gtests   pytest -m gpu: the skinny product and the fused kernels only
#   cold     lazyattn bench, lazy vs block, 8B shapes, 48 requests at saturation, cold document cache (session 6's)
#   warm     the same with --warm-cache
#   ttftprof the TTFT timeline (session 4's s4_ttft_profile.py: host phases, graph launch, GPU span); ttftprof0 with
#            LAZYATTN_PDL=0
#   targets  benchmarks/kernels.py --sections targets (the attention targets)
#   tt1a/b, tt0a/b  TTFT and the RAG decode step with the prefill graphs in two pieces (1) and in one (0), alternated
#            (tree 1222492; the two-piece capture and its LAZYATTN_PREFILL_GRAPH_HEAD were reverted after: no difference)
#   ktests   pytest -m gpu tests/kernels
#   etests   pytest -m gpu tests/engine tests/cache tests/model
set -u
STAGES=${STAGES:-on nopdl base ktests}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=/tmp/s7; rm -rf $W; mkdir -p $W; L=$OUT/s7.log
TAIL=${TAIL:-3}  # the log keeps each step's last 3 lines
. "$(dirname "$0")/lib.sh"  # device_info, step, ab_engine
device_info
SERVE="--model benchmarks/models/llama-3.1-8b --random-weights --modes lazy,block --rate inf --num-docs 20 --num-requests 48 --kv-cache-gb 20 --no-progress"
SEC=decode_short,decode_rag,ttft_rag,launches
for stage in $STAGES; do
  case $stage in
    on)     step on timeout -k 5 220 python benchmarks/engine.py --out $W/s7_on ;;
    nopdl)  step nopdl timeout -k 5 130 env LAZYATTN_PDL=0 python benchmarks/engine.py --sections $SEC --batches 16 --out $W/s7_nopdl ;;
    base)   step base timeout -k 5 130 env LAZYATTN_PDL=0 LAZYATTN_DECODE_FUSION=0 python benchmarks/engine.py --sections $SEC --batches 16 --out $W/s7_base ;;
    maxm64) step maxm64 timeout -k 5 130 env LAZYATTN_GEMV_MAX_M=64 python benchmarks/engine.py --out $W/s7_maxm64 ;;
    pf4)    step pf4 timeout -k 5 130 env LAZYATTN_GEMV_PREFETCH=4 python benchmarks/engine.py --sections decode_short,decode_rag --batches 16 --out $W/s7_pf4 ;;
    pf16)   step pf16 timeout -k 5 130 env LAZYATTN_GEMV_PREFETCH=16 python benchmarks/engine.py --sections decode_short,decode_rag --batches 16 --out $W/s7_pf16 ;;
    on2)    step on2 timeout -k 5 130 python benchmarks/engine.py --sections $SEC --batches 16 --out $W/s7_on2 ;;
    gtests) step gtests timeout -k 5 150 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_gemv_fused.py tests/kernels/test_gemv.py tests/kernels/test_fused.py tests/kernels/test_greedy.py ;;
    cold)   step serving_cold timeout -k 5 200 python -m lazyattn bench $SERVE --out $W/cold ;;
    warm)   step serving_warm timeout -k 5 200 python -m lazyattn bench $SERVE --warm-cache --out $W/warm ;;
    ttftprof) step ttft_profile timeout -k 5 150 python benchmarks/results/engine_perf/s4_ttft_profile.py $W/ttft ;;
    ttftprof0) step ttft_profile_nopdl timeout -k 5 150 env LAZYATTN_PDL=0 python benchmarks/results/engine_perf/s4_ttft_profile.py $W/ttft0 ;;
    targets) step targets timeout -k 5 120 python benchmarks/kernels.py --sections targets --out $W/s7_targets ;;
    tt1a|tt1b) step $stage timeout -k 5 100 python benchmarks/engine.py --sections decode_rag,ttft_rag --batches 16 --out $W/s7_$stage ;;
    tt0a|tt0b) step $stage timeout -k 5 100 env LAZYATTN_PREFILL_GRAPH_HEAD=0 python benchmarks/engine.py --sections decode_rag,ttft_rag --batches 16 --out $W/s7_$stage ;;
    ktests) step ktests timeout -k 5 150 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels ;;
    etests) step etests timeout -k 5 400 python -m pytest -q -m gpu -p no:cacheprovider tests/engine tests/cache tests/model ;;
  esac
done
tar -cf $OUT/s7_${STAGES// /_}.tar -C $W . ; grep -h "^\[" $W/*.log | cut -c1-300 >> $L; cat $L
