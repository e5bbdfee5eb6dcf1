set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
py="python -m pytest -q -s -m gpu -p no:cacheprovider"
s=$SECONDS
timeout -k 5 100 $py tests/kernels/test_decode.py > $OUT/1_decode.log 2>&1; echo "decode rc $? $((SECONDS-s)) s" | tee -a $OUT/summary.txt
s=$SECONDS
LAZYATTN_TP_STACKS_AFTER_S=40 timeout -k 5 100 $py -o faulthandler_timeout=45 tests/parallel/test_tensor_parallel_gpu.py -k bf16 > $OUT/2_hang.log 2>&1; rc=$?; echo "bf16 symm rc $rc $((SECONDS-s)) s" | tee -a $OUT/summary.txt
pkill -9 -f multiprocessing.spawn; sleep 2
s=$SECONDS
LAZYATTN_TP_STACKS_AFTER_S=40 timeout -k 5 90 python .dev-lead/standalone.py > $OUT/3_standalone.log 2>&1; echo "standalone rc $? $((SECONDS-s)) s" | tee -a $OUT/summary.txt
pkill -9 -f multiprocessing.spawn; sleep 2
s=$SECONDS
LAZYATTN_TP_ALLREDUCE=nccl timeout -k 5 200 $py tests/parallel/test_tensor_parallel_gpu.py -k "bf16 or overlapped" > $OUT/4_nccl.log 2>&1; echo "nccl tests rc $? $((SECONDS-s)) s" | tee -a $OUT/summary.txt
pkill -9 -f multiprocessing.spawn
cat $OUT/summary.txt
