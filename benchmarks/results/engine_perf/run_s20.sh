#!/bin/bash
# Session 20 device calls. STAGES picks what runs (space-separated); outputs in $OUT as one tarball.
#   tread      s20/tma_read.py: a launch that only reads the batch-1 decode case's tiles by the copy engine, beside
#              the engine's decode kernel and Session 19's register read
#   dtimeline  s20/decode_timeline.py: clock stamps of the batch-1 decode kernel's phases
#   dwarps     s20/decode_warps.py: batch-1 decode with each warp on its own sub-tile of a page, against the engine's
#   gdecode    s20/gluon_decode.py: decode by the Gluon kernel (one consumer, fused merge) against the Triton kernel
#   norope     s20/no_rope_probe.py: engine.py decode_short + decode_rag (batch 16) with and without the decode RoPE
#              launch, alternated twice
#   strip      s20/prefill_strip.py: the batch-1 short prefill with its merge, products, softmax or table loads taken out
#   dstrip     s20/decode_strip.py: batch-1 decode with its merge, softmax or table loads taken out
#   dab        s20/decode_ab.py: this tree's decode kernel against .s20base's (carry .s20base), batch 1, 8, 32
#   abengine   engine.py decode_rag + ttft_rag (batch 16), .s20base's tree and this one alternated twice
#   dwarps2    s20/decode_warps2.py: batch-1 decode with 2 warps a program against the default 4
#   htests     pytest -m gpu tests/kernels/test_prefill_hopper.py tests/kernels/test_decode.py
#   etests ktests engine serving targets ttft: lib.sh common_stage, outputs named s20_*
set -u
STAGES=${STAGES:-tread}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=/tmp/s20; rm -rf $W; mkdir -p $W; L=$W/s20_$(echo $STAGES | tr ' ' '_').log
. "$(dirname "$0")/lib.sh"  # device_info, step, common_stage, pack_outputs
device_info
TAG=s20
for stage in $STAGES; do
  case $stage in
    tread)     TAIL=40 step tread timeout -k 5 300 python benchmarks/results/engine_perf/s20/tma_read.py \
                 $W/s20_tma_read.json ;;
    dtimeline) TAIL=40 step dtimeline timeout -k 5 300 python benchmarks/results/engine_perf/s20/decode_timeline.py \
                 $W/s20_decode_timeline.json ;;
    dwarps)    TAIL=40 step dwarps timeout -k 5 300 python benchmarks/results/engine_perf/s20/decode_warps.py \
                 $W/s20_decode_warps.json ;;
    gdecode)   TAIL=20 step gdecode timeout -k 5 400 python benchmarks/results/engine_perf/s20/gluon_decode.py \
                 $W/s20_gluon_decode.json ${GD_BATCHES:-1,2,4,8} ;;
    norope)    for r in 1 2; do
                 for v in 0 1; do
                   step norope${v}_$r timeout -k 5 200 env NO_DECODE_ROPE=$v python \
                     benchmarks/results/engine_perf/s20/no_rope_probe.py --sections decode_short,decode_rag \
                     --batches 16 --out $W/s20_norope${v}_$r
                 done
               done ;;
    strip)     TAIL=4 step strip timeout -k 5 400 python benchmarks/results/engine_perf/s20/prefill_strip.py \
                 $W/s20_prefill_strip.json ;;
    dstrip)    TAIL=4 step dstrip timeout -k 5 400 python benchmarks/results/engine_perf/s20/decode_strip.py \
                 $W/s20_decode_strip.json ;;
    dab)       TAIL=6 step dab timeout -k 5 400 python benchmarks/results/engine_perf/s20/decode_ab.py \
                 $W/s20_decode_ab.json ;;
    abengine)  ab_engine .s20base s20_abengine ;;
    dwarps2)   TAIL=4 step dwarps2 timeout -k 5 300 python benchmarks/results/engine_perf/s20/decode_warps2.py \
                 $W/s20_decode_warps2.json ;;
    htests)    step htests timeout -k 5 300 python -m pytest -q -m gpu tests/kernels/test_prefill_hopper.py \
                 tests/kernels/test_decode.py ;;
    *)         common_stage $stage ;;
  esac
done
pack_outputs
