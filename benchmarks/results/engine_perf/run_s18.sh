#!/bin/bash
# Session 18 device calls. STAGES picks what runs (space-separated); outputs in $OUT as one tarball.
#   probe      s18/prefill_probe.py: the Gluon short prefill against Session 17's, batch 1 and 8 (PROBE_BATCHES)
#   merge      s18/prefill_probe.py merge: batch 1, the combine launch at 4 / 2 / 1 warps and none, after the kernel
#   ab         engine.py decode_rag + ttft_rag (batch 16), Session 17's final tree (8e0b643, unpacked into .s18base:
#              `mkdir .s18base && git archive 8e0b643 lazyattn benchmarks/engine.py benchmarks/models | tar x -C
#              .s18base`; the device call carries it) and this tree alternated twice (lib.sh, ab_engine)
#   reload     s18/reload_probe.py: what a new document's Q rotation costs the Gluon prefill
#   serving    lazyattn bench, the session-6 protocol (20 docs x 2048, Zipf 2.1, 48 requests at saturation), cold and
#              with a pre-warmed document cache, one run each
#   dtests     pytest -m gpu tests/kernels/test_decode.py tests/kernels/test_relink_offsets.py
#   htests     pytest -m gpu tests/kernels/test_prefill_hopper.py tests/kernels/test_prefill.py
#   etests     pytest -m gpu tests/engine tests/cache tests/model
#   ktests     pytest -m gpu tests/kernels, then tests/kernels/test_triton_backend.py (no gpu mark: real kernels here)
#   engine     engine.py, every section (the issue-10 table)
#   targets    kernels.py --sections targets, twice (issue 10's attention targets and the deferred-RoPE overhead)
set -u
STAGES=${STAGES:-probe}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=/tmp/s18; rm -rf $W; mkdir -p $W; L=$W/s18_$(echo $STAGES | tr ' ' '_').log
. "$(dirname "$0")/lib.sh"  # device_info, step, ab_engine
device_info
TAG=s18  # alternate's output prefix (lib.sh)
for stage in $STAGES; do
  case $stage in
    probe)   TAIL=6 step probe timeout -k 5 400 python benchmarks/results/engine_perf/s18/prefill_probe.py \
               $W/s18_prefill_probe.json ${PROBE_BATCHES:-1 8} ;;
    merge)   step merge timeout -k 5 300 python benchmarks/results/engine_perf/s18/prefill_probe.py \
               $W/s18_merge_probe.json merge ;;
    reload)  step reload timeout -k 5 300 python benchmarks/results/engine_perf/s18/reload_probe.py \
               $W/s18_reload_probe.json ;;
    ab)      ab_engine .s18base s18 ;;
    dtests)  step dtests timeout -k 5 300 python -m pytest -q -m gpu tests/kernels/test_decode.py \
               tests/kernels/test_relink_offsets.py ;;
    htests)  step htests timeout -k 5 300 python -m pytest -q -m gpu tests/kernels/test_prefill_hopper.py \
               tests/kernels/test_prefill.py ;;
    *)       common_stage $stage ;;  # etests ktests engine serving targets ttft (lib.sh)
  esac
done
pack_outputs
