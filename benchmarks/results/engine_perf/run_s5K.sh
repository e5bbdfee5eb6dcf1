#!/bin/bash
# Helper K, session 5, final device call (H100): on branch s5-attn (.) and main 8b7798f (./base, with this
# branch's benchmarks/kernels.py copied in as benchmarks/kernels_s5K.py for the targets section), in one call:
# kernel GPU tests, kernels.py targets after/before, engine.py decode_rag,ttft_rag,launches after/before,
# engine GPU tests. Everything lands in $OUT/s5K_final.tar (8 files at most come back), the tables also as .md.
W=/tmp/s5K; mkdir -p $W; L=$W/s5K_final.log
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > $L
step() { local name=$1; shift; echo "== $name ($(date -u +%T))" >> $L; ( "$@" ) >> $L 2>&1; echo "rc=$?" >> $L; }
step "kernel GPU tests" timeout 80 env PYTHONPATH=$PWD python -m pytest -q -m gpu -p no:cacheprovider tests/kernels
step "targets after" timeout 60 env PYTHONPATH=$PWD python benchmarks/kernels.py --sections targets --out $W/s5K_targets_after
step "targets before" timeout 60 env -C base PYTHONPATH=$PWD/base python benchmarks/kernels_s5K.py --sections targets --out $W/s5K_targets_before
step "engine after" timeout 110 env PYTHONPATH=$PWD python benchmarks/engine.py --sections decode_rag,ttft_rag,launches --out $W/s5K_engine_after
step "engine before" timeout 110 env -C base PYTHONPATH=$PWD/base python benchmarks/engine.py --sections decode_rag,ttft_rag,launches --out $W/s5K_engine_before
step "engine GPU tests" timeout 90 env PYTHONPATH=$PWD python -m pytest -q -m gpu -p no:cacheprovider tests/engine/test_engine_gpu.py tests/engine/test_relink.py
tar -cf $OUT/s5K_final.tar -C $W .
cp $W/*.md $L $OUT/
