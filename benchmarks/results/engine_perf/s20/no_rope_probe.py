"""Session 20: what the decode step's RoPE launch costs, as an upper bound on fusing it into decode attention.

Runs `benchmarks/engine.py` with its arguments; with NO_DECODE_ROPE=1 the GPU backend's decode layers skip the RoPE /
KV-write launch (q goes to decode attention unrotated and the step's k and v are not stored: wrong tokens, the same
work otherwise). Prefill keeps it. The difference in time per decode step is what one launch a layer costs there.

    NO_DECODE_ROPE=1 python benchmarks/results/engine_perf/s20/no_rope_probe.py --sections decode_short,decode_rag
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
sys.path.insert(0, str(HERE.parents[2]))

if os.environ.get("NO_DECODE_ROPE") == "1":
    from lazyattn.kernels import triton_backend

    attend = triton_backend.TritonBackend.attend

    def without_rope(self, layer, q, k, v, fb):
        if not fb.is_decode:
            return attend(self, layer, q, k, v, fb)
        k_cache, v_cache = self.kv[layer, 0], self.kv[layer, 1]
        return triton_backend.decode_attention(q, k_cache, v_cache, fb.attn, self.tables, self.scale,
                                               counters=self.counters)

    triton_backend.TritonBackend.attend = without_rope

import engine  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(engine.main())
