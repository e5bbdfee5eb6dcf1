#!/bin/bash
# One device call (H100, helper D, session 4): engine TTFT/decode on branch ttft (after) and on main 4a964bd
# (./base, before), GPU tests, the kernels' overhead section (after). Results under $OUT, named s4D_*.
R=$OUT
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > $R/s4D_bench.log  # 8 files at most come back
step() { local name=$1; shift; echo "== $name" >> $R/s4D_bench.log; ( "$@" ) >> $R/s4D_bench.log 2>&1; echo "rc=$?" >> $R/s4D_bench.log; }
step "after engine" timeout 110 env PYTHONPATH=$PWD python benchmarks/engine.py --sections decode_rag,ttft_rag,launches --out $R/s4D_after
(PYTHONPATH=$PWD timeout 200 python -m pytest -q -m gpu -s -p no:cacheprovider tests/kernels/test_prefill.py \
   tests/kernels/test_decode.py tests/kernels/test_rotated_runs.py tests/kernels/test_cache_ops.py \
   tests/engine/test_engine_gpu.py tests/engine/test_relink.py > $R/s4D_gpu_tests.log 2>&1; echo "rc=$?" >> $R/s4D_gpu_tests.log)
step "rag_case[1] errors" timeout 30 env PYTHONPATH=$PWD python benchmarks/results/engine_perf/rag_case_errors.py
step "before engine" timeout 90 env -C base PYTHONPATH=$PWD/base python benchmarks/engine.py --sections decode_rag,ttft_rag --out $R/s4D_before
step "after kernels overhead" timeout 45 env PYTHONPATH=$PWD python benchmarks/kernels.py --sections overhead --out $R/s4D_kernels_overhead
