#!/bin/bash
# Session 17 device calls. STAGES picks what runs (space-separated); outputs in $OUT as one tarball.
#   probe      s17/lanes_probe.py: decode attention with 1, 2 and 4 key lanes per tile, with and without the register cap
#   dtests     pytest -m gpu tests/kernels/test_decode.py tests/kernels/test_relink_offsets.py
#   etests     pytest -m gpu tests/engine tests/cache tests/model
#   ktests     pytest -m gpu tests/kernels, then tests/kernels/test_triton_backend.py (no gpu mark: real kernels here)
#   engine     engine.py, every section (the issue-10 table)
set -u
STAGES=${STAGES:-probe}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=/tmp/s17; rm -rf $W; mkdir -p $W; L=$W/s17_$(echo $STAGES | tr ' ' '_').log
. "$(dirname "$0")/lib.sh"  # device_info, step
device_info
for stage in $STAGES; do
  case $stage in
    probe)   TAIL=14 step probe timeout -k 5 400 python benchmarks/results/engine_perf/s17/lanes_probe.py \
               $W/s17_lanes_probe.json ;;
    dtests)  step dtests timeout -k 5 300 python -m pytest -q -m gpu tests/kernels/test_decode.py \
               tests/kernels/test_relink_offsets.py ;;
    etests)  step etests timeout -k 5 400 python -m pytest -q -m gpu tests/engine tests/cache tests/model ;;
    ktests)  step ktests timeout -k 5 400 python -m pytest -q -m gpu tests/kernels
             step tbackend timeout -k 5 200 python -m pytest -q tests/kernels/test_triton_backend.py ;;
    engine)  step engine timeout -k 5 300 python benchmarks/engine.py --out $W/s17_engine ;;
  esac
done
cd $W && tar czf $OUT/s17_$(echo $STAGES | tr ' ' '_').tgz *.json *.md *.log 2>/dev/null
true
