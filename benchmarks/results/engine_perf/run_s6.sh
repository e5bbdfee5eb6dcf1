set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
s=$SECONDS
timeout -k 5 200 python benchmarks/engine.py --out $OUT/s6_engine > $OUT/engine.log 2>&1; echo "engine rc $? $((SECONDS-s)) s" >> $OUT/summary.txt
s=$SECONDS
timeout -k 5 340 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels tests/engine tests/cache -x > $OUT/gpu_tests.log 2>&1; echo "gpu tests rc $? $((SECONDS-s)) s" >> $OUT/summary.txt
tail -3 $OUT/gpu_tests.log >> $OUT/summary.txt
cat $OUT/summary.txt
