set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
py="python -m pytest -q -s -m gpu -p no:cacheprovider tests/parallel/test_tensor_parallel_gpu.py -k bf16"
s=$SECONDS
( PYTHONFAULTHANDLER=1 timeout -k 3 40 $py > $OUT/A_abrt.log 2>&1 ) &
for t in 12 22 32; do sleep 10; for p in $(pgrep -f multiprocessing.spawn); do echo "t=$t worker $p threads $(ls /proc/$p/task | wc -l) wchan $(cat /proc/$p/wchan)" >> $OUT/A_threads.txt; done; done
for p in $(pgrep -f multiprocessing.spawn); do kill -ABRT $p; done
wait; echo "A $((SECONDS-s)) s" >> $OUT/summary.txt
pkill -9 -f multiprocessing.spawn; sleep 1
s=$SECONDS
PYTHONPATH=$PWD:$PWD/.dev-lead/plug timeout -k 3 60 $py -p cudafirst > $OUT/B_cudafirst.log 2>&1; echo "B cudafirst rc $? $((SECONDS-s)) s" >> $OUT/summary.txt
pkill -9 -f multiprocessing.spawn; sleep 1
python -m compileall -q lazyattn tests > /dev/null 2>&1
s=$SECONDS
LAZYATTN_TP_PROBE_TIMEOUT_S=40 timeout -k 3 150 $py > $OUT/C_bounded.log 2>&1; echo "C compiled+bounded rc $? $((SECONDS-s)) s" >> $OUT/summary.txt
pkill -9 -f multiprocessing.spawn
cat $OUT/summary.txt
