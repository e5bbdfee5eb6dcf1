"""Session 22: build FlashInfer's paged decode and prefill modules and its XQA decode (TensorRT-LLM's kernel) for
Hopper (sm_90a), bf16, head dim 128, no positional encoding, and gather what flashinfer_baseline.py loads on the GPU
machine into DEST: DEST/ops/{decode,fa2,fa3,xqa,xqa32}.so and DEST/whl/ (apache-tvm-ffi for the GPU machine's Python
3.12). Run it under flashinfer-python 0.7.2.post1 (its JIT generates the sources and runs nvcc; no GPU needed);
flashinfer_baseline.py's docstring gives the command.

    python benchmarks/results/engine_perf/s22/flashinfer_build.py DEST
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from flashinfer.jit import attention as fi_jit
from flashinfer.jit.xqa import gen_xqa_module

BF16, I32, D = torch.bfloat16, torch.int32, 128
TVM_FFI = "apache-tvm-ffi==0.1.15.post2"


def main() -> None:
    dest = Path(sys.argv[1])
    (dest / "ops").mkdir(parents=True, exist_ok=True)
    specs = {
        "decode": fi_jit.gen_batch_decode_module(BF16, BF16, BF16, I32, D, D, 0, False, False),
        "fa2": fi_jit.gen_batch_prefill_module("fa2", BF16, BF16, BF16, I32, D, D, 0, False, False, False),
        "fa3": fi_jit.gen_batch_prefill_module("fa3", BF16, BF16, BF16, I32, D, D, 0, False, False, False),
        "xqa": gen_xqa_module(BF16, BF16, 64, D, 4, False, BF16, 1),  # pages of 64, 4 q heads per kv head
        "xqa32": gen_xqa_module(BF16, BF16, 64, D, 4, False, BF16, 32),  # its draft-token form, 32 rows
    }
    for name, spec in specs.items():
        t0 = time.time()
        spec.build()
        shutil.copy(spec.get_library_path(), dest / "ops" / f"{name}.so")
        print(f"{name}: {spec.name} built in {time.time() - t0:.0f} s", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
                    "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64", "-d", str(dest / "whl"),
                    TVM_FFI], check=True)


if __name__ == "__main__":
    main()
