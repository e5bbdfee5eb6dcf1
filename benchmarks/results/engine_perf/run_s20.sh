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
#   htests etests ktests engine serving targets ttft: lib.sh common_stage, outputs named s20_*
set -u
STAGES=${STAGES:-tread}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=/tmp/s20; rm -rf $W; mkdir -p $W; L=$W/s20_$(echo $STAGES | tr ' ' '_').log
. "$(dirname "$0")/lib.sh"  # device_info, step, common_stage, pack_outputs
device_info
TAG=s20
for stage in $STAGES; do
  case $stage in
    tread)     probe tread tma_read 40 300 ;;
    dtimeline) probe dtimeline decode_timeline 40 300 ;;
    dwarps)    probe dwarps decode_warps 40 300 ;;
    gdecode)   probe gdecode gluon_decode 20 400 ${GD_BATCHES:-1,2,4,8} ;;
    norope)    for r in 1 2; do
                 for v in 0 1; do
                   step norope${v}_$r timeout -k 5 200 env NO_DECODE_ROPE=$v python \
                     benchmarks/results/engine_perf/s20/no_rope_probe.py --sections decode_short,decode_rag \
                     --batches 16 --out $W/s20_norope${v}_$r
                 done
               done ;;
    strip)     probe strip prefill_strip 4 400 ;;
    dstrip)    probe dstrip decode_strip 4 400 ;;
    dab)       probe dab decode_ab 6 400 ;;
    abengine)  ab_engine .s20base s20_abengine ;;
    dwarps2)   probe dwarps2 decode_warps2 4 300 ;;
    *)         common_stage $stage ;;
  esac
done
pack_outputs
