set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
pip list 2>/dev/null | grep -i -E "pytest|timeout" > $OUT/plugins.txt
echo "TMPDIR=${TMPDIR:-unset}" >> $OUT/plugins.txt
( timeout -k 3 50 python -m pytest -q -s -m gpu -p no:cacheprovider tests/parallel/test_tensor_parallel_gpu.py -k bf16 > $OUT/p.log 2>&1 ) &
sleep 28
for p in $(pgrep -f "pytest|multiprocessing.spawn"); do
  echo "== pid $p: $(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-120)"
  echo "wchan: $(cat /proc/$p/wchan)"
  for t in /proc/$p/task/*; do echo "  task $(basename $t) $(cat $t/comm) $(cat $t/wchan)"; done | sort -k3 | uniq -c -f2 | head -20
  ls -l /proc/$p/fd 2>/dev/null | grep -c socket
  tr '\0' '\n' < /proc/$p/environ | grep -E "TMP|NCCL|SYMM|TORCH|CUDA" 
  cat /proc/$p/stack 2>/dev/null | head
done > $OUT/procs.txt 2>&1
ls -la /tmp | head -40 >> $OUT/procs.txt
cat /proc/sys/kernel/yama/ptrace_scope >> $OUT/procs.txt 2>&1
wait
pkill -9 -f multiprocessing.spawn; sleep 1
engine="python benchmarks/engine.py --sections decode_short,ttft_rag --batches 16"
timeout -k 5 60 $engine --out $OUT/e_tp1 > $OUT/e_tp1.log 2>&1; echo "tp1 rc $?" >> $OUT/summary.txt
pkill -9 -f multiprocessing.spawn
timeout -k 5 75 $engine --tensor-parallel-size 2 --out $OUT/e_tp2 --sections decode_short,ttft_rag,launches > $OUT/e_tp2.log 2>&1; echo "tp2 rc $?" >> $OUT/summary.txt
cd $OUT && tar czf all.tgz *.txt *.log *.md *.json 2>/dev/null; ls
