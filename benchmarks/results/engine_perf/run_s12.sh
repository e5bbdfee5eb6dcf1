#!/bin/bash
# Session 12 (H100): where the attention kernels' time goes. STAGES picks what runs (space-separated); outputs in $OUT.
#   ncu      Nsight Compute, full set, on one call of each CASES entry (s12/profile_case.py); per case the details
#            page and the source page (SASS with its stall samples) of the attention kernel, as text
#   targets  kernels.py --sections targets
#   ktests   pytest -m gpu tests/kernels
#   etests   pytest -m gpu tests/engine tests/cache tests/model
#   on       engine.py, every section, defaults
#   ab       engine.py decode_rag + ttft_rag, LAZYATTN_GLUON_PREFILL=0 (prefill.py's kernel) and 1 (the Gluon kernel),
#            alternated twice
#   serving  lazyattn bench, pre-warmed document cache (the session-6 protocol), LAZYATTN_GLUON_PREFILL=1 then 0
#   sweep    s12/gluon_sweep.py (the Gluon kernel against prefill.py's at batch 1-8, several split counts)
set -u
STAGES=${STAGES:-ncu}
CASES=${CASES:-decode1 triton1 triton8 gluon8}
export PYTHONUNBUFFERED=1
W=/tmp/s12; rm -rf $W; mkdir -p $W; L=$OUT/s12.log
. "$(dirname "$0")/lib.sh"  # device_info, step, ab_engine
device_info
P=benchmarks/results/engine_perf/s12/profile_case.py
for stage in $STAGES; do
  case $stage in
    ncu)     for c in $CASES; do
               step ncu_$c timeout -k 5 240 env PYTHONPATH=$PWD ncu --profile-from-start off --clock-control none \
                 --set full --import-source yes -f -o $W/$c python $P $c
               ncu -i $W/$c.ncu-rep --page details > $W/${c}_details.txt 2>&1
               ncu -i $W/$c.ncu-rep --page source --csv --print-source sass > $W/${c}_sass.csv 2>&1
               gzip -f $W/${c}_sass.csv
             done ;;
    targets) step targets timeout -k 5 300 env PYTHONPATH=$PWD python benchmarks/kernels.py --sections targets \
               --out $W/s12_targets ;;
    ktests)  step ktests timeout -k 5 400 env PYTHONPATH=$PWD python -m pytest -q -m gpu tests/kernels ;;
    etests)  step etests timeout -k 5 400 env PYTHONPATH=$PWD python -m pytest -q -m gpu tests/engine tests/cache \
               tests/model ;;
    ab)      for r in 1 2; do
               for g in 0 1; do
                 step ab_g${g}_$r timeout -k 5 150 env PYTHONPATH=$PWD LAZYATTN_GLUON_PREFILL=$g python \
                   benchmarks/engine.py --sections decode_rag,ttft_rag --batches 16 --out $W/s12_g${g}_$r
               done
             done ;;
    serving) for g in 1 0; do
               step serving_g$g timeout -k 5 240 env PYTHONPATH=$PWD LAZYATTN_GLUON_PREFILL=$g python -m lazyattn bench \
                 --model benchmarks/models/llama-3.1-8b --random-weights --modes lazy,block --rate inf --num-docs 20 \
                 --num-requests 48 --kv-cache-gb 20 --no-progress --warm-cache --out $W/serving_g$g
               cp $W/serving_g$g/bench.json $W/serving_warm_g$g.json
             done ;;
    sweep)   step sweep timeout -k 5 300 env PYTHONPATH=$PWD python benchmarks/results/engine_perf/s12/gluon_sweep.py \
               $W/s12_gluon_sweep.json ;;
    on)      step on timeout -k 5 400 env PYTHONPATH=$PWD python benchmarks/engine.py --out $W/s12_on ;;
  esac
done
cd $W && tar czf $OUT/s12_$(echo $STAGES | tr ' ' '_').tgz *.json *.md *.txt *.gz *.log 2>/dev/null
true
