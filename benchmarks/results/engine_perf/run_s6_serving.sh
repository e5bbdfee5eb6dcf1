set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
b="python -m lazyattn bench --model benchmarks/models/llama-3.1-8b --random-weights --modes lazy,block --rate inf --num-docs 20 --num-requests 48 --kv-cache-gb 20 --no-progress"
s=$SECONDS; timeout -k 5 170 $b --out $OUT/cold > $OUT/serving_s6_cold.log 2>&1; echo "cold rc $? $((SECONDS-s)) s" >> $OUT/summary.txt
s=$SECONDS; timeout -k 5 170 $b --warm-cache --out $OUT/warm > $OUT/serving_s6_warm.log 2>&1; echo "warm rc $? $((SECONDS-s)) s" >> $OUT/summary.txt
cp $OUT/cold/bench.json $OUT/serving_s6_cold.json; cp $OUT/warm/bench.json $OUT/serving_s6_warm.json
rm -rf $OUT/cold $OUT/warm
cat $OUT/summary.txt
