#!/usr/bin/env bash
# Tensor parallelism on two GPUs (about 4-5 minutes on two H200s; docs/benchmarks.md, "Tensor parallelism"):
# the all-reduce routes, the GPU tests of tests/parallel, this GPU's skinny-GEMM table, then benchmarks/engine.py at
# Llama-3.1-8B shapes on one GPU and on two (overlapped scheduling on and off), at Llama-3.1-70B shapes on two (random
# bf16 weights), and the serving benchmark (8B on one and two GPUs; 70B lazy, block, prefix on two). Writes
# tensor_parallel.log, gemv.*, engine_*.{json,md} and serving_*/bench.json into OUT_DIR. Every stage has a time
# limit, so one that hangs cannot take the others' time.
#   bash benchmarks/tensor_parallel.sh OUT_DIR [BUDGET_S]
# STAGES=allreduce_routes,engine_8b_tp2,... runs only those stages; LAZYATTN_TP_TRACE=DIR records dispatch lags.
set -uo pipefail
out="${1:?usage: bash benchmarks/tensor_parallel.sh OUT_DIR [BUDGET_S]}"
budget="${2:-300}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.."
# NVLink multicast stays off on shared hosts (docs/design.md, "Tensor parallelism"); the workers inherit it.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
log="$out/tensor_parallel.log"

stage() {  # stage NAME LIMIT_S COMMAND...: run within LIMIT_S and the budget left; its status is the command's
    local name="$1" limit="$2" start=$SECONDS
    shift 2
    if [[ -n "${STAGES:-}" && ",$STAGES," != *",$name,"* ]]; then  # STAGES=a,b: only those
        return 0
    fi
    local left=$((budget - SECONDS))
    ((left < limit)) && limit=$left
    if ((limit < 20)); then
        echo "[$name] skipped: ${left} s of the budget left" | tee -a "$log"
        return 125
    fi
    echo "[$name] $* (limit ${limit} s)" | tee -a "$log"
    timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$log"
    local rc=${PIPESTATUS[0]}
    echo "[$name] exit ${rc} after $((SECONDS - start)) s" | tee -a "$log"
    return "$rc"
}

python3 -c 'import torch; print("torch", torch.__version__, "GPUs", torch.cuda.device_count(),
"NCCL", torch.cuda.nccl.version())' 2>&1 | tee -a "$log"
nvidia-smi topo -m 2>&1 | tee -a "$log"
# The all-reduce routes (parallel/all_reduce.py): NCCL vs symmetric memory by message size, sums checked.
stage allreduce_routes 30 python3 -m benchmarks.tp_allreduce --rows 1,16,64,128,512,2048 --out "$out/allreduce_routes.json"
# TESTS_K / TESTS_S: a pytest -k filter and time limit for the tests, when the budget is short
stage gpu_tests "${TESTS_S:-100}" python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/parallel ${TESTS_K:+-k "$TESTS_K"}
tests_rc=$?
graphs=()
if ((tests_rc == 124)); then  # a hang: measure the engines without CUDA graphs rather than not at all
    graphs=(--no-cuda-graphs)
fi
# This GPU's skinny-GEMM dispatch table (kernels/gemv.py; the 8B and 70B shapes and their TP halves), written into
# this tree's table so that the engines below use it; commit the table to keep it.
stage gemv_table 150 python3 -m benchmarks.gemv --out "$out/gemv" --table lazyattn/kernels/gemv_table.json
engine=(python3 -m benchmarks.engine --sections decode_short,ttft_rag --batches 16)
stage engine_8b_tp1 60 "${engine[@]}" --out "$out/engine_8b_tp1"
stage engine_8b_tp2 75 "${engine[@]}" --tensor-parallel-size 2 "${graphs[@]}" --out "$out/engine_8b_tp2" \
    --sections decode_short,ttft_rag,launches  # + rank 0's kernels per step
# The same without overlapped scheduling (engine/overlap.py; on by default with CUDA)
stage engine_8b_tp2_sync 75 "${engine[@]}" --tensor-parallel-size 2 --no-async-scheduling "${graphs[@]}" \
    --out "$out/engine_8b_tp2_sync"
stage engine_70b_tp2 110 "${engine[@]}" --tensor-parallel-size 2 "${graphs[@]}" \
    --model benchmarks/models/llama-3.1-70b --out "$out/engine_70b_tp2"
# If time is left: serving throughput at saturation on the paper workload (lazyattn bench), one GPU vs two at 8B,
# and lazy vs block vs prefix at 70B on two (one process per mode: each builds its own 70B engine).
serving=(python3 -m lazyattn bench --random-weights --device cuda --rate inf --no-progress --output-len 16
         --num-requests "${SERVING_REQUESTS:-24}")
stage serving_8b_tp2 80 "${serving[@]}" --model benchmarks/models/llama-3.1-8b --modes lazy --tensor-parallel-size 2 \
    --out "$out/serving_8b_tp2"
stage serving_8b_tp1 80 "${serving[@]}" --model benchmarks/models/llama-3.1-8b --modes lazy --out "$out/serving_8b_tp1"
for mode in lazy block prefix; do
    stage "serving_70b_tp2_$mode" 150 "${serving[@]}" --model benchmarks/models/llama-3.1-70b --modes "$mode" \
        --tensor-parallel-size 2 --out "$out/serving_70b_tp2_$mode"
done
echo "done in ${SECONDS} s" | tee -a "$log"
