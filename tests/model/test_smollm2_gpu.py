"""SmolLM2-135M-Instruct through the Triton kernels (fp32 and bf16) against the CPU reference path. Run on the
device (`pytest -m gpu -s tests/model/test_smollm2_gpu.py`); docs/models.md says how the file gets there."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lazyattn import LLM, SamplingParams
from tests.engine.test_engine_gpu import capture_logits
from tests.model.smollm2 import GEN, REQUESTS

pytestmark = pytest.mark.gpu


def engine_run(path: Path, mode: str, device: str, dtype: str) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy tokens and the logits each was drawn from, per request of REQUESTS, one request at a time."""
    llm = LLM(
        model=str(path),
        mode=mode,
        device=device,
        dtype=dtype,
        page_size=16,
        kv_cache_gb=1,
        warm_up=False,
        progress=False,
    )
    seen = capture_logits(llm)
    tokens, logits = [], []
    for messages, docs in REQUESTS:
        first = len(seen)
        out = llm.chat(
            messages, SamplingParams(max_tokens=GEN, temperature=0.0, ignore_eos=True), documents=[docs], use_tqdm=False
        )[0]
        tokens.append(out.token_ids)
        logits.append(torch.cat([rows.cpu() for rows in seen[first:] if rows.shape[0]]))
    return tokens, logits


@pytest.mark.parametrize("mode", ["lazy", "block", "prefix", "full"])
def test_triton_path_matches_the_cpu_reference(mode, smollm2_gguf):
    """The Triton kernels (fp32 and bf16) against the CPU reference path (fp32), same model and requests.

    fp32: the same tokens, logits within 1e-3. bf16 (8-bit mantissa, 30 layers): logits within 5 % (relative
    norm) for every step up to the first differing token, and the first token of each request the same.
    """
    want_tokens, want_logits = engine_run(smollm2_gguf, mode, "cpu", "float32")
    for dtype in ("float32", "bfloat16"):
        tokens, logits = engine_run(smollm2_gguf, mode, "cuda", dtype)
        for got_t, want_t, got, want in zip(tokens, want_tokens, logits, want_logits):
            same = next((i for i, (a, b) in enumerate(zip(got_t, want_t)) if a != b), GEN)
            rows = slice(0, min(same + 1, GEN))  # a step's logits are comparable while the tokens before agree
            abs_err = (got[rows] - want[rows]).abs().max().item()
            rel_err = ((got[rows] - want[rows]).norm() / want[rows].norm()).item()
            print(
                f"\nsmollm2 {mode} {dtype}: max |Δlogit| {abs_err:.2e}, relative {rel_err:.2e}, "
                f"tokens equal for {same}/{GEN} steps"
            )
            if dtype == "float32":
                assert got_t == want_t and abs_err < 1e-3
            else:
                assert got_t[0] == want_t[0] and rel_err < 5e-2
