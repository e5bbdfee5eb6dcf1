"""`python -m benchmarks.compile_check` on Llama-3.1-8B's launch configurations with pages of 64: the installed Triton
compiles them for sm_90 (H100/H200) on a machine without a GPU. The CPU tests run the kernels in the interpreter,
which executes them as Python and so never sees what only the compiler rejects (an `if` on a local Python False
whose body uses names it does not define: benchmarks/results/compile_check_sm90.md). A separate process: the
check must run the real compiler, not the interpreter these tests run under."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# Short questions (every variant: graph/eager, plan, relinked, rotation in prefill or in the kernel, no deltas), a
# call past the up-front rotation without splits, decode with and without splits, shared-document decode, block
# mode's copy, fused ops, the greedy pick, gate_up's skinny product in its plain, normed, gated (SiLU·mul epilogue)
# and residual forms, the deterministic mode's attention (prefill and decode) and matmul (one compile for every M), and
# every kernel that writes or reads FP8 pages (kv_cache_dtype=fp8_e4m3).
CASES = [
    "prefill 8B page64 rag T=32 B=1",
    "prefill 8B page64 rag T=512",
    "decode 8B page64",
    "shared decode 8B page64",
    "copy_rotate 8B page64",
    "fused 8B (",
    "gemv N=28672 K=4096 M=1 ",
    "short prefill (Gluon)",
    "invariant attention 8B page64",
    "invariant matmul N=6144 K=4096",
    "fp8 ",
]


@pytest.mark.parametrize("only", CASES)
def test_kernels_compile_for_sm90(only: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "compile_check.py"), "--only", only],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    lines = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    assert done.returncode == 0, done.stdout + done.stderr
    # Every launch of the cases compiled to a cubin (one line each, OK or FAIL).
    assert lines and all(line.startswith("OK") for line in lines), done.stdout


def test_transposed_v_tiles_are_not_read_byte_by_byte(tmp_path: Path) -> None:
    """FP8 pools store V's pages transposed (kernels/paged.py, docs/design.md "FP8 KV cache") so that a V tile's slots,
    which P·V reduces over, are contiguous. Loaded by per-thread addresses with a mask along those slots, such a tile
    compiles to one single-byte load per element; every Triton kernel that reads these pages by per-thread loads
    (prefill, its widening launch, decode without the copy engine, shared-document decode, the deterministic mode's
    attention) must read them with vector loads instead. The sm_90 code of each, as the installed Triton compiles it,
    holds no single-byte global load."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "compile_check.py"), "--only", "V transposed", "--dump", tmp_path],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    kernels = (
        "_prefill_kernel",
        "_widen_pages_kernel",
        "_decode_split_kernel",
        "_shared_job_kernel",
        "_attention_kernel",
    )
    ptx = {f.name: f.read_text() for f in tmp_path.glob("*.ptx") if f.stem.split("_", 1)[1] in kernels}
    assert {name.split("_", 1)[1] for name in ptx} == {k + ".ptx" for k in kernels}, sorted(ptx)
    byte_loads = re.compile(r"ld\.global(\.nc)?\.[bu]8\b")
    assert not {name: len(byte_loads.findall(text)) for name, text in ptx.items() if byte_loads.search(text)}
