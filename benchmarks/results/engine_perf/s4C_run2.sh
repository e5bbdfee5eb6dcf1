#!/bin/bash
# Second device call (H100) for issue 10, helper C: the engine's decode sections and one profiled decode step with
# the committed dispatch table (lazyattn/kernels/gemv_table.json, from s4C_run1) vs LAZYATTN_GEMV=0, alternated
# twice to show the run-to-run spread; then the engine greedy-token GPU test.
R=/tmp/s4C2; mkdir -p $R
LOG=$R/s4C_run2.log
step() { echo "== $1 $(date -u +%T)" >> $LOG; shift; ( timeout "$@" ) >> $LOG 2>&1; echo "rc=$? $(date -u +%T)" >> $LOG; }
nvidia-smi --query-gpu=name,clocks.max.sm,temperature.gpu --format=csv >> $LOG
export PYTHONUNBUFFERED=1
for i in 1 2; do
  step "engine, gemv on ($i)" 110 python benchmarks/engine.py --sections decode_short,launches --out $R/s4C_engine_on_$i
  step "engine, gemv off ($i)" 110 env LAZYATTN_GEMV=0 python benchmarks/engine.py --sections decode_short,launches --out $R/s4C_engine_off_$i
done
step "gpu tests" 90 python -m pytest -q -m gpu -s -p no:cacheprovider tests/engine/test_gemv_engine_gpu.py
tar -czf $OUT/s4C2.tar.gz -C $R .
cp $LOG $OUT/
