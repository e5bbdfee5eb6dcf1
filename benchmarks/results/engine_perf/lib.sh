# What the device-call scripts run_s7.sh ... run_s13.sh share; each sources it after setting W (a work folder) and L
# (its log file).
#   device_info         the GPU, its top SM clock, torch and Triton versions, into $L (a new file)
#   step NAME CMD...    CMD's output into $W/NAME.log; its exit status, seconds and the log's tail onto $L
#   ab_engine BASE OUT [ORDER]
#                       benchmarks/engine.py decode_rag + ttft_rag (batch 16), a checkout of another tree in BASE and
#                       this tree, alternated twice in ORDER (default "base this"): $W/OUT_{base,this}_{1,2}.{json,md}
#   common_stage STAGE  the stages sessions 17 on run alike, outputs named by $TAG (returns 1 for any other STAGE):
#                       etests   pytest -m gpu tests/engine tests/cache tests/model
#                       ktests   pytest -m gpu tests/kernels, then tests/kernels/test_triton_backend.py (no gpu mark)
#                       engine   engine.py, every section (the issue-10 table)
#                       serving  lazyattn bench, the session-6 protocol (20 docs x 2048, Zipf 2.1, 48 requests at
#                                saturation), cold and with a pre-warmed document cache, one run each
#                       targets  kernels.py --sections targets, twice
#                       ttft     engine.py decode_rag + ttft_rag, twice
#                       htests   pytest -m gpu tests/kernels/test_prefill_hopper.py tests/kernels/test_decode.py
#   probe NAME FILE TAIL LIMIT [ARGS...]
#                       step NAME: python benchmarks/results/engine_perf/$TAG/FILE.py $W/${TAG}_FILE.json ARGS under a
#                       LIMIT-second timeout, the log's last TAIL lines onto $L
#   pack_outputs        $W's json, md and log files into $OUT/${TAG}_<stages>.tgz (what the device call brings back)
#   alternate STEP OUT VAR "VALUES" ARGS...
#                       benchmarks/engine.py ARGS with VAR set to each value in turn, twice; step STEP<value>_<round>,
#                       output $W/${TAG}_OUT<value>_<round> (a value's commas become +)
device_info() { nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > $L
                python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $L; }
step() { local name=$1; shift; local s=$SECONDS; echo "== $name ($(date -u +%T))" >> $L; ( "$@" ) > $W/$name.log 2>&1;
         echo "$name rc=$? $((SECONDS-s)) s" | tee -a $L; tail -${TAIL:-40} $W/$name.log >> $L; }
ab_engine() { local base=$1 out=$2 order=${3:-base this} r t d
              for r in 1 2; do
                for t in $order; do
                  d=$PWD; [ $t = base ] && d=$PWD/$base
                  step ab_${t}_$r timeout -k 5 150 env PYTHONPATH=$d python $d/benchmarks/engine.py \
                    --sections decode_rag,ttft_rag --batches 16 --out $W/${out}_${t}_$r
                done
              done; }
alternate() { local name=$1 out=$2 var=$3 values=$4 r v n; shift 4
              for r in 1 2; do
                for v in $values; do
                  n=${v//,/+}
                  step $name${n}_$r timeout -k 5 150 env $var=$v python benchmarks/engine.py "$@" \
                    --out $W/${TAG}_$out${n}_$r
                done
              done; }
common_stage() {
  local serve="--model benchmarks/models/llama-3.1-8b --random-weights --modes lazy,block --rate inf --num-docs 20
               --num-requests 48 --kv-cache-gb 20 --no-progress" c r
  case $1 in
    etests)  step etests timeout -k 5 400 python -m pytest -q -m gpu tests/engine tests/cache tests/model ;;
    htests)  step htests timeout -k 5 300 python -m pytest -q -m gpu tests/kernels/test_prefill_hopper.py \
               tests/kernels/test_decode.py ;;
    ktests)  step ktests timeout -k 5 400 python -m pytest -q -m gpu tests/kernels
             step tbackend timeout -k 5 200 python -m pytest -q tests/kernels/test_triton_backend.py ;;
    engine)  step engine timeout -k 5 300 python benchmarks/engine.py --out $W/${TAG}_engine ;;
    serving) step serving_cold timeout -k 5 200 python -m lazyattn bench $serve --out $W/serving_${TAG}_cold
             step serving_warm timeout -k 5 200 python -m lazyattn bench $serve --warm-cache --out $W/serving_${TAG}_warm
             for c in cold warm; do cp $W/serving_${TAG}_$c/bench.json $W/serving_${TAG}_$c.json; done ;;
    ttft)    for r in 1 2; do
               step ttft_$r timeout -k 5 150 python benchmarks/engine.py --sections decode_rag,ttft_rag \
                 --out $W/${TAG}_ttft_$r
             done ;;
    targets) for r in 1 2; do
               step targets_$r timeout -k 5 300 python benchmarks/kernels.py --sections targets --out $W/${TAG}_targets_$r
             done ;;
    *)       echo "unknown stage $1" | tee -a $L; return 1 ;;
  esac; }
probe() { local name=$1 file=$2 tail=$3 limit=$4; shift 4
          TAIL=$tail step $name timeout -k 5 $limit python benchmarks/results/engine_perf/$TAG/$file.py \
            $W/${TAG}_$file.json "$@"; }
pack_outputs() { (cd $W && tar czf $OUT/${TAG}_$(echo $STAGES | tr ' ' '_').tgz *.json *.md *.log 2>/dev/null); true; }
