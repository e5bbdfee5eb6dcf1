#!/usr/bin/env bash
# The RAG serving benchmark on one GPU (~8 minutes on an H100 or H200): see benchmarks/serving.py.
#   bash benchmarks/serving.sh OUT_DIR            # writes serving.{json,md,log} and three PNGs into OUT_DIR
#   bash benchmarks/serving.sh OUT_DIR --smoke    # tiny model on the CPU: the script's structure, ~1 minute
set -uo pipefail
out="${1:?usage: bash benchmarks/serving.sh OUT_DIR [--smoke] [--budget-s S] [--modes lazy,block,...]}"
shift
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.."
# The device image has torch, triton, numpy, matplotlib and tqdm but not lazyattn installed: run from the tree.
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 -m benchmarks.serving "$out" "$@" 2>&1 | tee "$out/serving.log"
exit "${PIPESTATUS[0]}"
