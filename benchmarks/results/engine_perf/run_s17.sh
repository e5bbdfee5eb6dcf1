#!/bin/bash
# Session 17 device calls. STAGES picks what runs (space-separated); outputs in $OUT as one tarball.
#   probe      s17/decode_probe.py: decode attention variants against Session 16's kernel (call 1: its first form,
#              lanes_probe.py as committed in fa09193, on 62826e8's kernel: 1, 2 and 4 key lanes, with and without the
#              register cap)
#   splits     s17/decode_probe.py's splits section: batch 1 x 10 304 with 16, 24 and 32 splits
#   ncu        s17/ncu_decode.py under Nsight Compute (full set, one launch of each variant in NCU, default "s16 tma=2"; call
#              2 ran "s16 lanes4" on 62826e8's kernel): the reports, their details pages and their SASS source pages
#              (stall samples per instruction)
#   dtests     pytest -m gpu tests/kernels/test_decode.py tests/kernels/test_relink_offsets.py
#   etests     pytest -m gpu tests/engine tests/cache tests/model
#   ktests     pytest -m gpu tests/kernels, then tests/kernels/test_triton_backend.py (no gpu mark: real kernels here)
#   engine     engine.py, every section (the issue-10 table)
#   serving    lazyattn bench, the session-6 protocol (20 docs x 2048, Zipf 2.1, 48 requests at saturation), cold and
#              with a pre-warmed document cache, one run each
#   targets    kernels.py --sections targets, twice (issue 10's attention targets and the deferred-RoPE overhead)
#   tmaab      engine.py decode_short + decode_rag + ttft_rag (batches 16, 64) with LAZYATTN_DECODE_TMA=1 (the default)
#              and 0, alternated twice
set -u
STAGES=${STAGES:-probe}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=/tmp/s17; rm -rf $W; mkdir -p $W; L=$W/s17_$(echo $STAGES | tr ' ' '_').log
. "$(dirname "$0")/lib.sh"  # device_info, step
device_info
TAG=s17  # alternate's output prefix (lib.sh)
for stage in $STAGES; do
  case $stage in
    probe)   TAIL=14 step probe timeout -k 5 400 python benchmarks/results/engine_perf/s17/decode_probe.py \
               $W/s17_decode_probe.json ;;
    splits)  step splits timeout -k 5 200 python benchmarks/results/engine_perf/s17/decode_probe.py \
               $W/s17_decode_splits.json splits ;;
    ncu)     for v in ${NCU:-s16 tma=2}; do
               n=${v//[=,]/_}
               step ncu_$n timeout -k 5 240 ncu --clock-control none --set full --import-source yes \
                 -k regex:_decode_split_kernel -s 2 -c 1 -o $W/s17_ncu_$n -f \
                 python benchmarks/results/engine_perf/s17/ncu_decode.py $v
               ncu --import $W/s17_ncu_$n.ncu-rep --page details > $W/s17_ncu_${n}_details.log 2>&1
               ncu --import $W/s17_ncu_$n.ncu-rep --page source --csv --print-source sass \
                 > $W/s17_ncu_${n}_sass.log 2>&1
             done
             cp $W/*.ncu-rep $OUT/ 2>/dev/null ;;
    dtests)  step dtests timeout -k 5 300 python -m pytest -q -m gpu tests/kernels/test_decode.py \
               tests/kernels/test_relink_offsets.py ;;
    tmaab)   alternate tma tma LAZYATTN_DECODE_TMA "1 0" --sections decode_short,decode_rag,ttft_rag --batches 16,64 ;;
    *)       common_stage $stage ;;  # etests ktests engine serving targets (lib.sh)
  esac
done
pack_outputs
