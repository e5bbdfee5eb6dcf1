#!/bin/bash
# Session 16 (device calls on an H200: no H100 was lent). STAGES picks what runs (space-separated); outputs in $OUT
# as one tarball. dtests, probe and ab ran on the tree of 54872cc (the two-lane decode kernel, since reverted: probe
# and ab pass lanes= / LAZYATTN_DECODE_LANES, which only that tree knows).
#   dtests     pytest -m gpu tests/kernels/test_decode.py tests/kernels/test_relink_offsets.py
#   probe      s16/lanes_probe.py: decode attention with one and two lanes per program
#   ab         engine.py decode_rag + ttft_rag (batch 16), LAZYATTN_DECODE_LANES=1 and the default (2), alternated twice
#   pdl        engine.py decode_short + decode_rag + ttft_rag (batches 16, 64), LAZYATTN_PDL=1 and 0, alternated twice
#   pdlfam     the same sections with LAZYATTN_PDL per kernel family: 1, 0, all but gemv, gemv only, attention only;
#              alternated twice
#   final      the tree with the H200's PDL default (every family but gemv): engine.py, every section; then
#              pytest -m gpu on the GEMM, fused and greedy kernels
#   pdlh100    (on an H100) the same sections with LAZYATTN_PDL=1 and every family but gemv, alternated twice
#   breakdown  s16/decode_breakdown.py: batch-1 decode attention over 10 304 keys, part by part
#   warps      s16/warps_probe.py: batch-1 decode with 1-2 warps per program and 16-64 splits
#   etests     pytest -m gpu tests/engine tests/cache tests/model
#   ktests     pytest -m gpu tests/kernels, then tests/kernels/test_triton_backend.py (no gpu mark: real kernels here)
#   engine     engine.py, every section (the issue-10 table), then its launches section with LAZYATTN_PDL=0 (kernel
#              times that do not count a PDL wait)
set -u
STAGES=${STAGES:-dtests probe ab}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=/tmp/s16; rm -rf $W; mkdir -p $W; L=$W/s16_$(echo $STAGES | tr ' ' '_').log
. "$(dirname "$0")/lib.sh"  # device_info, step
device_info
SECTIONS="--sections decode_short,decode_rag,ttft_rag --batches 16,64"
TAG=s16  # alternate's output prefix (lib.sh)
for stage in $STAGES; do
  case $stage in
    dtests)  step dtests timeout -k 5 300 python -m pytest -q -m gpu tests/kernels/test_decode.py \
               tests/kernels/test_relink_offsets.py ;;
    probe)   TAIL=30 step probe timeout -k 5 400 python benchmarks/results/engine_perf/s16/lanes_probe.py \
               $W/s16_lanes_probe.json ;;
    ab)      alternate ab_lanes lanes LAZYATTN_DECODE_LANES "1 2" --sections decode_rag,ttft_rag --batches 16 ;;
    pdl)     alternate pdl pdl LAZYATTN_PDL "1 0" $SECTIONS ;;
    pdlfam)  alternate pdlfam_ pdlfam_ LAZYATTN_PDL "1 0 attention,rope,norm,sampling gemv attention" $SECTIONS ;;
    final)   step final timeout -k 5 200 python benchmarks/engine.py --out $W/s16_final
             step ftests timeout -k 5 200 python -m pytest -q -m gpu tests/kernels/test_gemv.py \
               tests/kernels/test_gemv_fused.py tests/kernels/test_fused.py tests/kernels/test_greedy.py ;;
    pdlh100) alternate pdlh100_ pdlh100_ LAZYATTN_PDL "1 attention,rope,norm,sampling" $SECTIONS ;;
    breakdown) step breakdown timeout -k 5 200 python benchmarks/results/engine_perf/s16/decode_breakdown.py \
               $W/s16_decode_breakdown.json ;;
    warps)   TAIL=14 step warps timeout -k 5 300 python benchmarks/results/engine_perf/s16/warps_probe.py \
               $W/s16_warps_probe.json ;;
    etests)  step etests timeout -k 5 400 python -m pytest -q -m gpu tests/engine tests/cache tests/model ;;
    ktests)  step ktests timeout -k 5 400 python -m pytest -q -m gpu tests/kernels
             step tbackend timeout -k 5 200 python -m pytest -q tests/kernels/test_triton_backend.py ;;
    engine)  step engine timeout -k 5 300 python benchmarks/engine.py --out $W/s16_engine
             step engine_pdl0 timeout -k 5 200 env LAZYATTN_PDL=0 python benchmarks/engine.py --sections launches \
               --out $W/s16_engine_pdl0 ;;
  esac
done
cd $W && tar czf $OUT/s16_$(echo $STAGES | tr ' ' '_').tgz *.json *.md *.log 2>/dev/null
true
