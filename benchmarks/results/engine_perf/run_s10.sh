#!/bin/bash
# Session 10 (H100): the first token's host share. STAGES picks what runs (space-separated); outputs land in $OUT.
#   hostcpu  host_ttft.py on this machine's CPU (no GPU): the host path alone, to set beside the local CPU's
#   hostab   host_ttft.py --compare .s10base: this tree's host path against BASE's, alternated, on this machine's CPU
#   anatomy  ttft_anatomy.py --sections engine_graphs,phases,waits (graph spans, host phases, the wait's effect)
#   ab       engine.py decode_rag + ttft_rag, BASE (a checkout in .s10base) and this tree, alternated twice
#   on       engine.py, every section, defaults
#   targets  kernels.py --sections targets
#   ktests   pytest -m gpu tests/kernels
#   etests   pytest -m gpu tests/engine tests/cache tests/model
set -u
STAGES=${STAGES:-anatomy}
export PYTHONUNBUFFERED=1
W=/tmp/s10; rm -rf $W; mkdir -p $W; L=$OUT/s10.log
. "$(dirname "$0")/lib.sh"  # device_info, step, ab_engine
device_info
lscpu | grep -E "Model name|MHz" >> $L
for stage in $STAGES; do
  case $stage in
    hostcpu) for r in 1 2; do
               step hostcpu_$r timeout -k 5 200 env PYTHONPATH=$PWD python benchmarks/host_ttft.py --repeats 300 \
                 --out $W/s10_hostcpu_$r.json
             done ;;
    hostab)  step hostab timeout -k 5 300 env PYTHONPATH=$PWD python benchmarks/host_ttft.py --compare .s10base \
               --repeats 200 --rounds 3 --out $W/s10_hostab.json ;;
    anatomy) step anatomy timeout -k 5 400 env PYTHONPATH=$PWD python benchmarks/ttft_anatomy.py \
               --sections engine_graphs,phases,waits --out $W/s10_anatomy ;;
    ab)      ab_engine .s10base s10 ;;
    on)      step on timeout -k 5 400 env PYTHONPATH=$PWD python benchmarks/engine.py --out $W/s10_on ;;
    targets) step targets timeout -k 5 300 env PYTHONPATH=$PWD python benchmarks/kernels.py --sections targets \
               --out $W/s10_targets ;;
    ktests)  step ktests timeout -k 5 400 env PYTHONPATH=$PWD python -m pytest -q -m gpu tests/kernels ;;
    etests)  step etests timeout -k 5 400 env PYTHONPATH=$PWD python -m pytest -q -m gpu tests/engine tests/cache \
               tests/model ;;
  esac
done
cp $W/*.json $W/*.md $OUT/ 2>/dev/null
true
