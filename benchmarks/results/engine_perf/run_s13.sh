#!/bin/bash
# Session 13 (H100): the short-question prefill's fixed cost. STAGES picks what runs (space-separated); outputs in
# $OUT as one tarball.
#   htests     pytest -m gpu tests/kernels/test_prefill_hopper.py tests/kernels/test_prefill.py
#   breakdown  s13/breakdown.py at BATCHES (default "1 8"): the Gluon prefill's parts, PDL on and off
#   ktests     pytest -m gpu tests/kernels
#   etests     pytest -m gpu tests/engine tests/cache tests/model
#   targets    kernels.py --sections targets
#   ab         engine.py decode_rag + ttft_rag, BASE (session 12's tree, d50d50a, unpacked into .s13base: `mkdir .s13base
#              && git archive d50d50a lazyattn benchmarks/engine.py benchmarks/models | tar x -C .s13base`) and this
#              tree, alternated twice
#   launches0  engine.py ttft_rag + launches with LAZYATTN_PDL=0: each kernel's own time in the prefill and decode
#              steps, without PDL's overlapped waits
#   on         engine.py, every section, defaults
#   abk        s13/breakdown.py at BATCHES, the previous kernel (4335f51, unpacked into .s13b: `mkdir .s13b && git archive
#              4335f51 lazyattn benchmarks/kernels.py benchmarks/engine.py benchmarks/models
#              benchmarks/results/engine_perf/s13/breakdown.py | tar x -C .s13b`) and this tree, alternated twice
#   abe        engine.py decode_rag + ttft_rag, .s13b (above) and this tree alternated twice (lib.sh, ab_engine)
#   aber       the same, this tree first
#   gemv32     engine.py decode_rag + ttft_rag with the shipped GEMV table and with s13/gemv_table_m32_as_m16.json
#              (LAZYATTN_GEMV_TABLE; the 8B shapes' 32-row configs replaced by their 16-row ones), alternated twice
#   ncu        Nsight Compute, full set, on s13/profile_gluon.py at batch 1 (the Gluon kernel and the combine): the
#              details page, and the source page (SASS with its stall samples) as gzipped CSV
set -u
STAGES=${STAGES:-htests breakdown}
BATCHES=${BATCHES:-1 8}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=/tmp/s13; rm -rf $W; mkdir -p $W; L=$W/s13_$(echo $STAGES | tr ' ' '_').log
. "$(dirname "$0")/lib.sh"  # device_info, step, ab_engine
device_info
for stage in $STAGES; do
  case $stage in
    htests)    step htests timeout -k 5 300 python -m pytest -q -m gpu tests/kernels/test_prefill_hopper.py \
                 tests/kernels/test_prefill.py ;;
    breakdown) step breakdown timeout -k 5 400 python benchmarks/results/engine_perf/s13/breakdown.py \
                 $W/s13_breakdown.json $BATCHES ;;
    ktests)    step ktests timeout -k 5 400 python -m pytest -q -m gpu tests/kernels ;;
    etests)    step etests timeout -k 5 400 python -m pytest -q -m gpu tests/engine tests/cache tests/model ;;
    targets)   step targets timeout -k 5 300 python benchmarks/kernels.py --sections targets --out $W/s13_targets ;;
    ab)        ab_engine .s13base s13 ;;
    abe)       ab_engine .s13b s13k ;;
    aber)      ab_engine .s13b s13r "this base" ;;
    gemv32)    for r in 1 2; do
                 step gemv_shipped_$r timeout -k 5 150 python benchmarks/engine.py --sections decode_rag,ttft_rag \
                   --batches 16 --out $W/s13g_shipped_$r
                 step gemv_m16_$r timeout -k 5 150 env \
                   LAZYATTN_GEMV_TABLE=benchmarks/results/engine_perf/s13/gemv_table_m32_as_m16.json python \
                   benchmarks/engine.py --sections decode_rag,ttft_rag --batches 16 --out $W/s13g_m16_$r
               done ;;
    abk)       for r in 1 2; do
                 for t in base this; do
                   d=$PWD; [ $t = base ] && d=$PWD/.s13b
                   step abk_${t}_$r timeout -k 5 300 env PYTHONPATH=$d python \
                     $d/benchmarks/results/engine_perf/s13/breakdown.py $W/s13_abk_${t}_$r.json $BATCHES
                 done
               done ;;
    launches0) step launches0 timeout -k 5 200 env LAZYATTN_PDL=0 python benchmarks/engine.py \
                 --sections ttft_rag,launches --batches 16 --out $W/s13_launches0 ;;
    ncu)       step ncu timeout -k 5 240 ncu --profile-from-start off --clock-control none --set full --import-source yes \
                 -f -o $W/gluon1 python benchmarks/results/engine_perf/s13/profile_gluon.py 1
               ncu -i $W/gluon1.ncu-rep --page details > $W/gluon1_details.log 2>&1
               ncu -i $W/gluon1.ncu-rep --page source --csv --print-source sass > $W/gluon1_sass.csv 2>&1
               gzip -f $W/gluon1_sass.csv; cp $W/gluon1_sass.csv.gz $OUT/ ;;
    on)        step on timeout -k 5 400 python benchmarks/engine.py --out $W/s13_on ;;
  esac
done
cd $W && tar czf $OUT/s13_$(echo $STAGES | tr ' ' '_').tgz *.json *.md *.log 2>/dev/null
true
