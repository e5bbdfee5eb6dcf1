#!/bin/bash
# Session 8 (H100): the first token's host share. STAGES picks what runs (space-separated); outputs land in $OUT.
#   anatomy  benchmarks/ttft_anatomy.py: graph launch costs (toy graphs and the engine's), the first token's
#            host timeline by phase
#   ttft     engine.py decode_rag + ttft_rag (TTFT median of 40 over the RAG decode step)
#   ab       the same, alternated three times between this tree and .s8base (the session's base, 707fcc7:
#            git archive 707fcc7 lazyattn benchmarks/engine.py benchmarks/models pyproject.toml | tar -x -C .s8base;
#            the call carries .s8base)
#   gemv32   benchmarks/gemv.py at M = 32 (the 17-32-row block) for the 8B layer shapes with the widened tile list,
#            into lazyattn/kernels/gemv_table.json (those entries only); then TTFT and decode at batch 32 with the
#            old table (LAZYATTN_GEMV_TABLE) and the new, alternated twice; the new table comes back in $OUT
#   tables   TTFT and decode at batch 32 over three gemv tables (.s8tables/: old.json, the session's start;
#            A_qkv_o_down.json, old + gemv32's new M = 32 configs for qkv, o and down; B_gate_up.json, old + gate_up's),
#            alternated twice (the call carries .s8tables)
#   ab2      TTFT and the RAG decode step by this benchmarks/engine.py over the base tree's lazyattn (.s8base) and
#            this tree's, alternated twice
#   phases   benchmarks/ttft_anatomy.py --sections phases (the first token's host timeline)
#   on       engine.py, every section, defaults
#   cold     lazyattn bench, lazy vs block, 8B shapes, 20 docs x 2048, Zipf 2.1, 48 requests at saturation, cold
#            document cache (the session-6 protocol); warm: the same with --warm-cache
#   etests   pytest -m gpu tests/engine tests/cache tests/model
#   ktests   pytest -m gpu tests/kernels
set -u
STAGES=${STAGES:-anatomy ttft}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=/tmp/s8; rm -rf $W; mkdir -p $W; L=$OUT/s8.log
. "$(dirname "$0")/lib.sh"  # device_info, step, ab_engine
device_info
SERVE="--model benchmarks/models/llama-3.1-8b --random-weights --modes lazy,block --rate inf --num-docs 20 --num-requests 48 --kv-cache-gb 20 --no-progress"
for stage in $STAGES; do
  case $stage in
    anatomy) step anatomy timeout -k 5 200 python benchmarks/ttft_anatomy.py --out $W/s8_anatomy ;;
    ttft)    step ttft timeout -k 5 120 python benchmarks/engine.py --sections decode_rag,ttft_rag --batches 16 --out $W/s8_ttft ;;
    ab)      for r in 1 2 3; do
               step base$r timeout -k 5 120 env PYTHONPATH=$PWD/.s8base python .s8base/benchmarks/engine.py --sections decode_rag,ttft_rag --batches 16 --out $W/s8_base$r
               step this$r timeout -k 5 120 python benchmarks/engine.py --sections decode_rag,ttft_rag --batches 16 --out $W/s8_this$r
             done ;;
    gemv32)  cp lazyattn/kernels/gemv_table.json $W/table_old.json
             step gemv32 timeout -k 5 300 python benchmarks/gemv.py --shapes 8B:qkv,8B:o,8B:gate_up,8B:down --blocks 32 --out $W/s8_gemv32 --table lazyattn/kernels/gemv_table.json
             cp lazyattn/kernels/gemv_table.json $OUT/gemv_table.json
             for r in 1 2; do
               step oldtable$r timeout -k 5 120 env LAZYATTN_GEMV_TABLE=$W/table_old.json python benchmarks/engine.py --sections decode_rag,ttft_rag --batches 32 --out $W/s8_oldtable$r
               step newtable$r timeout -k 5 120 python benchmarks/engine.py --sections decode_rag,ttft_rag --batches 32 --out $W/s8_newtable$r
             done ;;
    tables)  for r in 1 2; do for t in old A_qkv_o_down B_gate_up; do
               step table_${t}_$r timeout -k 5 120 env LAZYATTN_GEMV_TABLE=$PWD/.s8tables/$t.json python benchmarks/engine.py --sections decode_rag,ttft_rag --batches 32 --out $W/s8_table_${t}_$r
             done; done ;;
    ab2)     cp benchmarks/engine.py .s8base/benchmarks/engine_s8.py
             for r in 1 2; do
               step base_$r timeout -k 5 120 python .s8base/benchmarks/engine_s8.py --sections decode_rag,ttft_rag --batches 16 --out $W/s8_ab2_base$r
               step this_$r timeout -k 5 120 python benchmarks/engine.py --sections decode_rag,ttft_rag --batches 16 --out $W/s8_ab2_this$r
             done ;;
    phases)  step phases timeout -k 5 120 python benchmarks/ttft_anatomy.py --sections phases --out $W/s8_phases ;;
    on)      step on timeout -k 5 220 python benchmarks/engine.py --out $W/s8_on ;;
    cold)    step serving_cold timeout -k 5 200 python -m lazyattn bench $SERVE --out $W/serving_s8_cold ;;
    warm)    step serving_warm timeout -k 5 200 python -m lazyattn bench $SERVE --warm-cache --out $W/serving_s8_warm ;;
    etests)  step etests timeout -k 5 400 python -m pytest -q -m gpu -p no:cacheprovider tests/engine tests/cache tests/model ;;
    ktests)  step ktests timeout -k 5 200 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels ;;
  esac
done
tar -cf $OUT/s8_${STAGES// /_}.tar -C $W . ; for f in $W/*.json; do python -c "import json,sys; d=json.load(open(sys.argv[1])); r=d.get('results',{}); t=r.get('ttft_rag',{}); b=[v for k,v in r.items() if k.startswith('decode_batch')]; print(sys.argv[1].split('/')[-1], 'ttft', round(t.get('ttft_ms',0),3), 'synced', round(t.get('ttft_synced_ms',0),3), 'x', round(t.get('of_decode_step',0),3), 'rag_step', round(r.get('decode_rag',{}).get('step_ms',0),3), 'batch', [round(x.get('step_ms',0),3) for x in b])" $f 2>/dev/null; done >> $L; cat $L
