#!/bin/bash
# One device call (H100) for issue 10, helper C: the skinny-GEMM sweep (tunes and writes the dispatch table), then
# the engine's decode sections with the kernel dispatched by that table vs LAZYATTN_GEMV=0 (F.linear), then the
# GPU tests of the kernel. Everything lands in $OUT/s4C.tar.gz plus the console log.
R=/tmp/s4C; mkdir -p $R
LOG=$R/s4C_run.log
step() { echo "== $1 $(date -u +%T)" >> $LOG; shift; ( timeout "$@" ) >> $LOG 2>&1; echo "rc=$? $(date -u +%T)" >> $LOG; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,temperature.gpu --format=csv >> $LOG
export PYTHONUNBUFFERED=1
step "gemv sweep" 200 python benchmarks/gemv.py --out $R/s4C_gemv --table $R/gemv_table.json
cp $R/gemv_table.json lazyattn/kernels/gemv_table.json 2>/dev/null
step "engine, gemv on" 140 python benchmarks/engine.py --sections decode_short --out $R/s4C_engine_gemv_on
step "engine, gemv off" 140 env LAZYATTN_GEMV=0 python benchmarks/engine.py --sections decode_short --out $R/s4C_engine_gemv_off
step "gpu tests" 100 python -m pytest -q -m gpu -s -p no:cacheprovider tests/kernels/test_gemv.py tests/engine/test_gemv_engine_gpu.py
tar -czf $OUT/s4C.tar.gz -C $R .
cp $LOG $OUT/
