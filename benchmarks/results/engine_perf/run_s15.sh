#!/bin/bash
# Session 15 (H100), prepared and checked on the CPU only: this session had no device time left (the earlier tries at
# the same work had spent it). STAGES picks what runs (space-separated); outputs in $OUT as one tarball.
#   etests     pytest -m gpu tests/engine tests/cache tests/model (not re-run since session 14's decode change)
#   dtests     pytest -m gpu tests/kernels/test_decode.py
#   ktests     pytest -m gpu tests/kernels, then tests/kernels/test_triton_backend.py (no gpu mark: on a GPU it runs the
#              real kernels, a head-major pool among them)
#   probe      s15/layout_probe.py: decode bs 1 x 10 304 keys and the RAG prefill, token-major vs head-major pages
#   ab         engine.py decode_rag + ttft_rag (batch 16) with the pool token-major, token-major without the Gluon
#              prefill (what head-major pages run for short prefill calls), and head-major; alternated twice
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
    ktests)  step ktests timeout -k 5 400 python -m pytest -q -m gpu tests/kernels
             step tbackend timeout -k 5 200 python -m pytest -q tests/kernels/test_triton_backend.py ;;
    probe)   TAIL=40 step probe timeout -k 5 400 python benchmarks/results/engine_perf/s15/layout_probe.py \
               $W/s15_layout_probe.json ;;
    ab)      for r in 1 2; do
               for v in token:1 token:0 head:1; do
                 step ab_${v/:/_g}_$r timeout -k 5 150 env LAZYATTN_KV_LAYOUT=${v%:*} LAZYATTN_GLUON_PREFILL=${v#*:} \
                   python benchmarks/engine.py --sections decode_rag,ttft_rag --batches 16 --out $W/s15_${v/:/_g}_$r
               done
             done ;;
  esac
done
cd $W && tar czf $OUT/s15_$(echo $STAGES | tr ' ' '_').tgz *.json *.md *.log 2>/dev/null
true
