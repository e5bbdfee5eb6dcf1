#!/bin/bash
# Session 19 device calls. STAGES picks what runs (space-separated); outputs in $OUT as one tarball.
#   dprobe     s19/decode_probe.py: decode attention by the Gluon kernel (row and key split) against the Triton
#              decode kernel, batch 1 (PROBE_BATCHES)
#   ceiling    s19/read_ceiling.py: a launch that only reads the decode case's bytes, in the targets' graph form
#   sprobe     s19/short_probe.py: the Gluon short prefill's key split against its row split, questions of <= 16 tokens
#   dsweep     s19/decode_sweep.py: batch-1 decode attention at launch configs beside decode_config's
#   timeline   s19/timeline.py: clock stamps of the Gluon short prefill's phases, batch 1 after the RoPE launch
#   eprobe     s19/epilogue_probe.py: the Gluon partial's store through the Q buffers against .s19base's, batch 1 and 8
#   htests etests ktests engine serving targets ttft: lib.sh common_stage, outputs named s19_*
set -u
STAGES=${STAGES:-dprobe}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=/tmp/s19; rm -rf $W; mkdir -p $W; L=$W/s19_$(echo $STAGES | tr ' ' '_').log
. "$(dirname "$0")/lib.sh"  # device_info, step, common_stage
device_info
TAG=s19
for stage in $STAGES; do
  case $stage in
    dprobe)  probe dprobe decode_probe 6 400 ${PROBE_BATCHES:-1} ;;
    ceiling) probe ceiling read_ceiling 4 300 ;;
    sprobe)  probe sprobe short_probe 6 400 ;;
    dsweep)  probe dsweep decode_sweep 4 300 ;;
    timeline) probe timeline timeline 40 300 ;;
    eprobe)  probe eprobe epilogue_probe 4 300 ;;
    *)       common_stage $stage ;;
  esac
done
pack_outputs
