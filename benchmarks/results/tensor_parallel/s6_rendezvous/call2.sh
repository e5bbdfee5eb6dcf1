set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
v() {  # name, args
  local n=$1; shift; local s=$SECONDS
  LAZYATTN_TP_STACKS_AFTER_S=30 timeout -k 3 45 python .dev-lead/standalone.py "$@" > $OUT/v_$n.log 2>&1; local rc=$?
  echo "$n rc $rc $((SECONDS-s)) s | $(grep -E 'started in|shutdown in' $OUT/v_$n.log | tr '\n' ' ')" | tee -a $OUT/summary.txt
  pkill -9 -f multiprocessing.spawn; sleep 1
}
v count --count-first
v cuda --cuda-first
v fault --faulthandler
v imports --import-tests
v destroy --leave destroy
v none --leave none
v syncabort --leave sync_abort
s=$SECONDS
LAZYATTN_TP_STACKS_AFTER_S=30 timeout -k 3 60 python -m pytest -q -s -m gpu -p no:cacheprovider -p no:faulthandler tests/parallel/test_tensor_parallel_gpu.py -k bf16 > $OUT/p_nofault.log 2>&1; echo "pytest no:faulthandler rc $? $((SECONDS-s)) s" | tee -a $OUT/summary.txt
pkill -9 -f multiprocessing.spawn
tar czf $OUT/logs.tgz -C $OUT $(cd $OUT; ls *.log)
