#!/bin/bash
# One device call: BEFORE = main 5dc8cac (git archive, ./base), AFTER = branch qkern; benchmarks on GPU 0, GPU tests on GPU 1.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=/tmp/s3q; mkdir -p $R
nvidia-smi --query-gpu=index,name,clocks.max.sm --format=csv > $R/gpus.txt
(CUDA_VISIBLE_DEVICES=1 PYTHONPATH=$PWD timeout 400 python -m pytest -q -m gpu -s -p no:cacheprovider tests/kernels tests/engine \
   > $R/gpu_tests_s3q.log 2>&1; echo "rc=$?" >> $R/gpu_tests_s3q.log) &
export CUDA_VISIBLE_DEVICES=0
step() { echo "== $1" >> $R/bench_s3q.log; shift; ( timeout 150 "$@" ) >> $R/bench_s3q.log 2>&1; echo "rc=$?" >> $R/bench_s3q.log; }
step "before attention_splits" env -C base PYTHONPATH=$PWD/base python benchmarks/attention_splits.py --prefill-only --out $R/attention_splits_s3q_before.json
step "after attention_splits" env PYTHONPATH=$PWD python benchmarks/attention_splits.py --prefill-only --out $R/attention_splits_s3q_after.json
step "before kernels overhead" env -C base PYTHONPATH=$PWD/base python benchmarks/kernels.py --sections overhead --out $R/kernels_h200_overhead_s3q_before
step "after kernels overhead" env PYTHONPATH=$PWD python benchmarks/kernels.py --sections overhead --out $R/kernels_h200_overhead_s3q_after
step "before engine" env -C base PYTHONPATH=$PWD/base python benchmarks/engine.py --out $R/engine_s3q_before
step "after engine" env PYTHONPATH=$PWD python benchmarks/engine.py --out $R/engine_s3q_after
wait
cp $R/bench_s3q.log $R/gpu_tests_s3q.log $OUT/
tar -czf $OUT/s3q.tar.gz -C $R .
