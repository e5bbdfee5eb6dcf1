#!/bin/bash
# Session 22 device calls. STAGES picks what runs (space-separated); outputs in $OUT as one tarball.
#   fi         s22/flashinfer_baseline.py: FlashInfer's paged decode and prefill kernels beside ours at issue 10's
#              batch-1 attention targets (batch FI_BATCHES, default 1,8); carry .fi (s22/flashinfer_build.py makes it)
#   anatomy    ttft_anatomy.py engine_graphs,phases (the first token's GPU span and host timeline) and host_ttft.py
#              (the host path alone, no GPU work: this host's speed)
#   htests etests ktests engine serving targets ttft: lib.sh common_stage, outputs named s22_*
set -u
STAGES=${STAGES:-fi}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=/tmp/s22; rm -rf $W; mkdir -p $W; L=$W/s22_$(echo $STAGES | tr ' ' '_').log
. "$(dirname "$0")/lib.sh"  # device_info, step, common_stage, probe, pack_outputs
device_info
TAG=s22
for stage in $STAGES; do
  case $stage in
    fi) python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
          .fi/whl/*.whl >> $L 2>&1
        export PYTHONPATH=$PWD:/tmp/site; probe fi flashinfer_baseline 80 500 ${FI_BATCHES:-1,8} ;;
    anatomy) step anatomy timeout -k 5 300 python benchmarks/ttft_anatomy.py --out $W/s22_anatomy \
               --sections engine_graphs,phases
             step hostttft timeout -k 5 200 python benchmarks/host_ttft.py --repeats 300 --out $W/s22_host_ttft.json ;;
    *)  common_stage $stage ;;
  esac
done
pack_outputs
