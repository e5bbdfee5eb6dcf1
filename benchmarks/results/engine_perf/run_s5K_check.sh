#!/bin/bash
# Helper K, session 5, last device call (H100) after the plan's slack rule: kernel GPU tests, targets and engine
# (after only; before is run_s5K.sh's).
W=/tmp/s5K; mkdir -p $W; L=$W/s5K_check.log
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > $L
step() { local name=$1; shift; echo "== $name ($(date -u +%T))" >> $L; ( "$@" ) >> $L 2>&1; echo "rc=$?" >> $L; }
step "kernel GPU tests" timeout 100 env PYTHONPATH=$PWD python -m pytest -q -m gpu -p no:cacheprovider tests/kernels
step "targets after" timeout 30 env PYTHONPATH=$PWD python benchmarks/kernels.py --sections targets --out $W/s5K_targets_final
step "engine after" timeout 70 env PYTHONPATH=$PWD python benchmarks/engine.py --sections decode_rag,ttft_rag,launches --out $W/s5K_engine_final
cp $W/* $OUT/
