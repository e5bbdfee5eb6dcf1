# Sourced by the benchmark scripts that run lazyattn from this tree where it is not installed (the device image has
# torch, transformers and peft, not lazyattn), after they cd to the repository root: `. benchmarks/from_tree.sh WORK`
# puts the tree on PYTHONPATH, links SmolLM2's GGUF into WORK's model cache when SMOLLM2_GGUF names it
# (smollm2_gguf.sh), and defines `py` (PYTHON, default python3) and `stamp MESSAGE` (seconds since sourced).
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
. benchmarks/smollm2_gguf.sh "$1"
py="${PYTHON:-python3}"
start=$(date +%s)
stamp() { echo "[$(($(date +%s) - start)) s] $*"; }
