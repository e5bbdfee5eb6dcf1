# Sourced by the benchmark scripts that run SmolLM2 (`. benchmarks/smollm2_gguf.sh CACHE_PARENT`), from the repository
# root: on a machine without the package index, the SmolLM2-135M-Instruct GGUF given as SMOLLM2_GGUF is linked into a
# model cache of its own, CACHE_PARENT/cache, which LAZYATTN_CACHE then names. Without SMOLLM2_GGUF nothing changes.
if [ -n "${SMOLLM2_GGUF:-}" ]; then
    export LAZYATTN_CACHE="$1/cache"
    mkdir -p "$LAZYATTN_CACHE/models/smollm2"
    ln -sf "$(realpath "$SMOLLM2_GGUF")" "$LAZYATTN_CACHE/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
fi
