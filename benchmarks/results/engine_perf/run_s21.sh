#!/bin/bash
# Session 21 device calls. STAGES picks what runs (space-separated); outputs in $OUT as one tarball.
#   merge      s21/prefill_merge.py: the short prefill's merge in the kernel against prefill's combine launch (and
#              the launch with the cooperative attribute, and no merge), batch MERGE_BATCHES (default 1,2,4,8)
#   parts      s21/merge_parts.py: the fused merge's wait and loads apart, one round of loads, bf16 partials (batch 1)
#   bf16       s21/bf16_partials.py: the short prefill's partials in bf16 against .s21base's fp32 ones (carry .s21base)
#   early      s21/early_tiles.py: the short prefill's first tiles copied before the PDL wait, batch EARLY_BATCHES (1,2,8)
#   dprofile   s21/decode_profile.py: a batch-1 short decode step kernel by kernel, PDL off and on
#   dgaps      s21/decode_gaps.py: idle gaps on the GPU between overlapped batch-1 decode steps
#   dvariants  s21/decode_variants.py: decode's running sum summed once, its page tables loaded a tile ahead (1,8)
#   dab        s20/decode_ab.py against .s21base (carry it), batch 1, 8, 32, five rounds
#   abengine   engine.py decode_rag + ttft_rag (batch 16), .s21base's tree and this one alternated twice
#   fusedoff   engine.py ttft_rag + decode_rag with LAZYATTN_PREFILL_FUSED_MERGE=0 and 1, alternated twice
#   htests etests ktests engine serving targets ttft: lib.sh common_stage, outputs named s21_*
set -u
STAGES=${STAGES:-merge}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=/tmp/s21; rm -rf $W; mkdir -p $W; L=$W/s21_$(echo $STAGES | tr ' ' '_').log
. "$(dirname "$0")/lib.sh"  # device_info, step, common_stage, pack_outputs
device_info
TAG=s21
for stage in $STAGES; do
  case $stage in
    merge)     probe merge prefill_merge 60 500 ${MERGE_BATCHES:-1,2,4,8} ;;
    parts)     probe parts merge_parts 8 400 ;;
    bf16)      probe bf16 bf16_partials 60 500 ${BF16_BATCHES:-1,2,4,8} ;;
    early)     probe early early_tiles 60 400 ${EARLY_BATCHES:-1,2,8} ;;
    dprofile)  for v in 0 auto; do
                 step dprofile_$v timeout -k 5 200 env LAZYATTN_PDL=$v python \
                   benchmarks/results/engine_perf/s21/decode_profile.py $W/s21_dprofile_$v.json
               done ;;
    dgaps)     probe dgaps decode_gaps 80 300 ;;
    dvariants) probe dvariants decode_variants 60 400 ${DV_BATCHES:-1,8} ;;
    dab)       TAIL=6 step dab timeout -k 5 400 env ROUNDS=5 python benchmarks/results/engine_perf/s20/decode_ab.py \
                 $W/s21_decode_ab.json 1,8,32 .s21base ;;
    abengine)  ab_engine .s21base s21_abengine ;;
    fusedoff)  alternate fusedoff fusedoff LAZYATTN_PREFILL_FUSED_MERGE "0 1" --sections decode_rag,ttft_rag ;;
    *)         common_stage $stage ;;
  esac
done
pack_outputs
