#!/usr/bin/env bash
# Tensor parallelism on 2 or 4 GPUs (docs/benchmarks.md, "Tensor parallelism"): the all-reduce routes, the GPU tests
# of tests/parallel (every TP size the machine has), this GPU's skinny-GEMM table, then benchmarks/engine.py at
# Llama-3.1-8B shapes on one GPU, two and four (overlapped scheduling on and off at two), at Llama-3.1-70B shapes on
# four (and on two where a GPU has more than 100 GB: 70B bf16 is 140 GB of weights), and the serving benchmark
# (8B on one and two GPUs; 70B lazy, block, prefix at TP=4 and, on big GPUs, TP=2). Random bf16 weights throughout.
# Writes tensor_parallel.log, gemv.*, engine_*.{json,md} and serving_*/bench.json into OUT_DIR. Every stage has a
# time limit, so one that hangs cannot take the others' time; a stage needing more GPUs (or memory) than the machine
# has is skipped with a line in the log.
#   bash benchmarks/tensor_parallel.sh OUT_DIR [BUDGET_S]
# STAGES=allreduce_routes,engine_8b_tp2,... runs only those stages; LAZYATTN_TP_TRACE=DIR records dispatch lags.
# On four GPUs within ten minutes, e.g.:
#   STAGES=gpu_tests,engine_8b_tp1,engine_8b_tp2,engine_8b_tp4,engine_70b_tp4,serving_70b_tp4_lazy,\
#   serving_70b_tp4_block,serving_70b_tp4_prefix bash benchmarks/tensor_parallel.sh OUT 570
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

read -r gpus gpu_gb < <(python3 -c 'import torch; n = torch.cuda.device_count()
print(n, min((torch.cuda.get_device_properties(i).total_memory >> 30 for i in range(n)), default=0))')
gpus=${gpus:-0} gpu_gb=${gpu_gb:-0}
need=(1 0)  # what the next stage needs: GPUs, GiB per GPU (set with `needs N GB` just before it)
needs() { need=("$1" "$2"); }

stage() {  # stage NAME LIMIT_S COMMAND...: run within LIMIT_S and the budget left; its status is the command's
    local name="$1" limit="$2" start=$SECONDS
    shift 2
    local want=("${need[@]}")
    need=(1 0)
    if [[ -n "${STAGES:-}" && ",$STAGES," != *",$name,"* ]]; then  # STAGES=a,b: only those
        return 0
    fi
    if ((gpus < want[0] || gpu_gb < want[1])); then
        echo "[$name] skipped: needs ${want[0]} GPUs of >= ${want[1]} GiB; this machine has ${gpus} of ${gpu_gb} GiB" |
            tee -a "$log"
        return 125
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
echo "${gpus} GPUs of ${gpu_gb} GiB" | tee -a "$log"
# The all-reduce routes (parallel/all_reduce.py): NCCL vs symmetric memory by message size, sums checked, on two
# ranks and on four.
needs 2 0
stage allreduce_routes 30 python3 -m benchmarks.tp_allreduce --rows 1,16,64,128,512,2048 --out "$out/allreduce_routes.json"
needs 4 0
stage allreduce_routes_tp4 30 python3 -m benchmarks.tp_allreduce --rows 1,16,64,128,512,2048 --world-size 4 \
    --out "$out/allreduce_routes_tp4.json"
# TESTS_K / TESTS_S: a pytest -k filter and time limit for the tests, when the budget is short (about 20 s an engine
# start; on four GPUs the tests start about 20 engines)
needs 2 0
stage gpu_tests "${TESTS_S:-300}" python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/parallel ${TESTS_K:+-k "$TESTS_K"}
tests_rc=$?
graphs=()
if ((tests_rc == 124)); then  # a hang: measure the engines without CUDA graphs rather than not at all
    graphs=(--no-cuda-graphs)
fi
# This GPU's skinny-GEMM dispatch table (kernels/gemv.py; the 8B and 70B shapes and their TP halves), written into
# this tree's table so that the engines below use it; commit the table to keep it.
stage gemv_table 150 python3 -m benchmarks.gemv --out "$out/gemv" --table lazyattn/kernels/gemv_table.json
# Decode time per token and cached-request TTFT against the weight-read limit of the GPUs used ("of limit").
engine=(python3 -m benchmarks.engine --sections decode_short,ttft_rag --batches 16)
stage engine_8b_tp1 60 "${engine[@]}" --out "$out/engine_8b_tp1"
needs 2 0
stage engine_8b_tp2 75 "${engine[@]}" --tensor-parallel-size 2 "${graphs[@]}" --out "$out/engine_8b_tp2" \
    --sections decode_short,ttft_rag,launches  # + rank 0's kernels per step
# The same without overlapped scheduling (engine/overlap.py; on by default with CUDA)
needs 2 0
stage engine_8b_tp2_sync 75 "${engine[@]}" --tensor-parallel-size 2 --no-async-scheduling "${graphs[@]}" \
    --out "$out/engine_8b_tp2_sync"
needs 4 0
stage engine_8b_tp4 75 "${engine[@]}" --tensor-parallel-size 4 "${graphs[@]}" --out "$out/engine_8b_tp4" \
    --sections decode_short,ttft_rag,launches
# 70B: 140 GB of bf16 weights, 35 GB a GPU at TP=4 (fits 80 GB H100s), 70 GB at TP=2 (needs the H200s' 141 GB)
needs 4 60
stage engine_70b_tp4 110 "${engine[@]}" --tensor-parallel-size 4 "${graphs[@]}" \
    --model benchmarks/models/llama-3.1-70b --out "$out/engine_70b_tp4"
needs 2 100
stage engine_70b_tp2 110 "${engine[@]}" --tensor-parallel-size 2 "${graphs[@]}" \
    --model benchmarks/models/llama-3.1-70b --out "$out/engine_70b_tp2"
# If time is left: serving throughput at saturation on the paper workload (lazyattn bench), one GPU vs two at 8B,
# and lazy vs block vs prefix at 70B on four (and two) GPUs (one process per mode: each builds its own 70B engine).
serving=(python3 -m lazyattn bench --random-weights --device cuda --rate inf --no-progress --output-len 16
         --num-requests "${SERVING_REQUESTS:-24}")
needs 2 0
stage serving_8b_tp2 80 "${serving[@]}" --model benchmarks/models/llama-3.1-8b --modes lazy --tensor-parallel-size 2 \
    --out "$out/serving_8b_tp2"
stage serving_8b_tp1 80 "${serving[@]}" --model benchmarks/models/llama-3.1-8b --modes lazy --out "$out/serving_8b_tp1"
for tp in 4 2; do
    for mode in lazy block prefix; do
        if ((tp == 4)); then needs 4 60; else needs 2 100; fi
        stage "serving_70b_tp${tp}_$mode" 150 "${serving[@]}" --model benchmarks/models/llama-3.1-70b --modes "$mode" \
            --tensor-parallel-size "$tp" --out "$out/serving_70b_tp${tp}_$mode"
    done
done
echo "done in ${SECONDS} s" | tee -a "$log"
