#!/bin/bash
# Session 15 (H100), prepared and checked on the CPU only: this session had no device time left (the earlier tries at
# the same work had spent it). STAGES picks what runs (space-separated); outputs in $OUT as one tarball.
#   etests     pytest -m gpu tests/engine tests/cache tests/model (not re-run since session 14's decode change)
#   dtests     pytest -m gpu tests/kernels/test_decode.py
#   probe      s15/layout_probe.py: decode bs 1 x 10 304 keys and the RAG prefill, token-major vs head-major pages
set -u
STAGES=${STAGES:-etests probe}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=/tmp/s15; rm -rf $W; mkdir -p $W; L=$W/s15_$(echo $STAGES | tr ' ' '_').log
. "$(dirname "$0")/lib.sh"  # device_info, step
device_info
for stage in $STAGES; do
  case $stage in
    etests)  step etests timeout -k 5 400 python -m pytest -q -m gpu tests/engine tests/cache tests/model ;;
    dtests)  step dtests timeout -k 5 300 python -m pytest -q -m gpu tests/kernels/test_decode.py ;;
    probe)   TAIL=40 step probe timeout -k 5 400 python benchmarks/results/engine_perf/s15/layout_probe.py \
               $W/s15_layout_probe.json ;;
  esac
done
cd $W && tar czf $OUT/s15_$(echo $STAGES | tr ' ' '_').tgz *.json *.log 2>/dev/null
true
