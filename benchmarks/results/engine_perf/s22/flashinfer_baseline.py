"""Session 22: FlashInfer's paged attention kernels at issue 10's two batch-1 attention targets, beside ours, in one
run. FlashInfer (0.7.2.post1, the kernels vLLM and SGLang serve with) is the strongest available baseline for a
paged, GQA, bf16 decode and short-query prefill on Hopper; its kernels read the same pages of the same pool here.

Cases (kernels.py's, the targets section's inputs and timing):
- decode: BATCHES x 10 304 cached keys (segments of 2048 at random deltas, `decode_case`), one query row each;
- short prefill: the RAG case, BATCHES x (5 x 2048 cached document keys + a 32-token question, `rag_case`), causal
  over the question.
Each kernel is timed as the targets are (graph_us: 32 launches a CUDA graph, input copies past L2), ROUNDS rounds
alternated. Ours run as the engine runs them (decode.py's kernel; for the prefill the engine's launch,
kernels.py `engine_attention`: on Hopper the Gluon kernel and its merge), with the per-document deltas. FlashInfer's
run with no positional correction at all (a plain prefix cache: strictly less work), each as its Python wrapper
would call it (plan once, CUDA-graph mode; run inside the graph), with PDL off and on:
- "fi decode": the CUDA-core decode kernel (BatchDecodeWithPagedKVCacheWrapper's default);
- "fi decode tc": the tensor-core path (use_tensor_cores=True: the fa2 prefill kernel with one query row);
- "fi fa2" / "fi fa3": BatchPrefillWithPagedKVCacheWrapper's fa2 and fa3 (Hopper) backends, for the prefill;
- "... eager-plan": the two decode paths planned as outside CUDA graphs (the wrappers' default; the split count may
  differ), still timed in the graphs, with PDL;
- "fi xqa": TensorRT-LLM's XQA decode kernel as FlashInfer ships it (its trtllm_batch_decode_with_kv_cache's "xqa"
  backend; the generic kernel, which bf16 caches take on Hopper), with PDL; for the prefill, its speculative-decoding
  form over the question's 32 tokens as draft tokens with a causal mask.
Each FlashInfer output is checked against the PyTorch reference over the same pages with the deltas zeroed
(kernels/reference.py): the bytes timed are the right ones.

FlashInfer's Python layer needs packages the GPU machine lacks, so the compiled modules are loaded directly through
tvm_ffi, as that layer loads them. They are built on a machine with nvcc 13.0 (this repo's CPU machine has it):

    python3.11 -m venv /tmp/fiv && /tmp/fiv/bin/pip install torch==2.13.0 flashinfer-python==0.7.2.post1
    pip download --no-deps -d /tmp/curand nvidia-curand && (cd /tmp/curand && unzip -q *.whl)  # fa3's curand headers
    mkdir /tmp/stub && echo 'void f(void){}' | gcc -x c -shared -fPIC -Wl,-soname,libcuda.so.1 -o /tmp/stub/libcuda.so -
    CPATH=/tmp/curand/nvidia/cu13/include:/usr/local/cuda-13.0/include \\
      LIBRARY_PATH=/tmp/stub:/usr/local/cuda-13.0/lib64 \\
      FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=/tmp/fiws \\
      /tmp/fiv/bin/python benchmarks/results/engine_perf/s22/flashinfer_build.py .fi

which leaves .fi/ops/{decode,fa2,fa3,xqa,xqa32}.so and .fi/whl/ (apache-tvm-ffi for Python 3.12). The modules
take minutes each on two cores. The stub only satisfies the link: the modules need libcudart.so.13, which torch has
loaded by then. Carry .fi.

    python benchmarks/results/engine_perf/s22/flashinfer_baseline.py OUT.json [BATCHES, default 1,8]
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
sys.path.insert(0, str(HERE.parents[2]))

from kernels import (  # noqa: E402
    attention,
    decode_inputs,
    engine_attention,
    engine_split,
    graph_rounds,
    probe_rows,
    rag_case,
    rag_sweep_bench,
    read_ceiling,
)

from lazyattn.kernels.reference import paged_attention  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", 3))
CONTEXT = 10304
OPS = Path(os.environ.get("FI_OPS", ".fi/ops"))
FLOAT_WS, INT_WS = 128 << 20, 8 << 20  # FlashInfer's wrappers' default workspace sizes
NHD, NON_CAUSAL, CAUSAL = 0, 0, 1


def load(name: str):
    import tvm_ffi

    return tvm_ffi.load_module(str(OPS / f"{name}.so"))


@dataclasses.dataclass
class Layout:
    """FlashInfer's page tables for a PagedBatch whose pages are all full but each entry's last (CSR form)."""

    indptr_host: torch.Tensor
    indptr: torch.Tensor
    indices: torch.Tensor
    last_len: torch.Tensor
    kv_lens_host: torch.Tensor

    @staticmethod
    def of(pb, page_size: int) -> Layout:
        counts = pb.num_pages.cpu().tolist()
        pages, valid = pb.pages.cpu(), pb.valid.cpu()
        for b, n in enumerate(counts):
            if not bool((valid[b, : n - 1] == page_size).all()):
                raise SystemExit("FlashInfer's layout needs full pages before each entry's last")
        indptr = torch.tensor([0] + list(torch.tensor(counts).cumsum(0).tolist()), dtype=torch.int32)
        indices = torch.cat([pages[b, :n] for b, n in enumerate(counts)]).to(torch.int32)
        last = torch.tensor([int(valid[b, n - 1]) for b, n in enumerate(counts)], dtype=torch.int32)
        kv_lens = valid.sum(1).to(torch.int32)
        dev = pb.pages.device
        return Layout(indptr, indptr.to(dev), indices.to(dev), last.to(dev), kv_lens)


class Workspace:
    def __init__(self, device: torch.device) -> None:
        self.float = torch.empty(FLOAT_WS, dtype=torch.uint8, device=device)
        self.int = torch.empty(INT_WS, dtype=torch.uint8, device=device)
        self.pinned = torch.empty(INT_WS, dtype=torch.uint8, pin_memory=True)


def fi_decode(mod, s, scale: float, q, k, v, pb, graph_plan: bool = True):
    """FlashInfer's CUDA-core decode over pb's pages, planned for CUDA graphs or not: call(pdl) -> output
    [batch, Hq, D]."""
    import tvm_ffi

    lay, ws = Layout.of(pb, s.page_size), Workspace(q.device)
    empty_q, empty_kv = torch.empty(0, dtype=q.dtype), torch.empty(0, dtype=k.dtype)
    plan = mod.plan(ws.float, ws.int, ws.pinned, lay.indptr_host, q.shape[0], s.q_heads, s.kv_heads, s.page_size,
                    graph_plan, -1, 0.0, s.head_dim, s.head_dim, empty_q, empty_kv)
    out = torch.empty_like(q)

    def call(pdl: bool):
        with tvm_ffi.use_torch_stream():
            mod.run(ws.float, ws.int, plan, q, k, v, lay.indptr, lay.indices, lay.last_len, out, None, NHD, -1, pdl,
                    None, 0.0, scale, 1.0, 1e-4)
        return out

    return call


def fi_prefill(mod, backend: str, s, scale: float, q, k, v, pb, q_lens: list[int], causal: bool,
               graph_plan: bool = True):
    """FlashInfer's paged prefill (fa2 or fa3 backend) over pb's pages, q packed by q_lens, planned for CUDA graphs
    or not: call(pdl) -> output."""
    import tvm_ffi

    lay, ws = Layout.of(pb, s.page_size), Workspace(q.device)
    qo_host = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0).tolist()), dtype=torch.int32)
    qo = qo_host.to(q.device)
    batch = len(q_lens)
    args = [ws.float, ws.int, ws.pinned, qo_host, lay.indptr_host, lay.kv_lens_host, q.shape[0], batch, s.q_heads,
            s.kv_heads, s.page_size, graph_plan, s.head_dim, s.head_dim, causal]
    if backend == "fa2":
        args += [-1, -1, False, 0, 0]  # window_left, fixed_split_size, disable_split_kv, colocated CTAs, uniform q
    else:
        args += [-1]  # window_left
    plan = mod.plan(*args)
    out = torch.empty_like(q)
    mask = CAUSAL if causal else NON_CAUSAL

    def call(pdl: bool):
        with tvm_ffi.use_torch_stream():
            if backend == "fa2":
                mod.paged_run(ws.float, ws.int, plan, q, k, v, qo, lay.indptr, lay.indices, lay.last_len, out, None,
                              mask, NHD, -1, pdl, None, None, None, None, None, None, None, None, 0.0, scale, 1.0,
                              1e-4, 0)
            else:
                mod.paged_run(ws.float, ws.int, plan, q, k, v, qo, lay.indptr, lay.indices, lay.last_len, out, None,
                              mask, NHD, -1, pdl, None, None, None, None, 0.0, scale, 1.0, 0)
        return out

    return call


def fi_xqa(mod, s, q, k, v, pb, q_len: int = 1):
    """XQA over pb's pages, as flashinfer.decode's xqa path calls it: q and the output [batch, 1, Hq, D] (q_len 1, a
    decode) or [batch, 1, q_len, Hq, D] (the last q_len keys of each entry as draft tokens, a causal mask over them),
    a page table [batch, pages] (int32), lengths [batch, 1] (uint32), the softmax scale 1/sqrt(D) (q_scale 1), 8 MiB
    of zeroed semaphores ahead of the scratch: call(pdl) -> output shaped as q."""
    import tvm_ffi

    lay = Layout.of(pb, s.page_size)
    batch = pb.batch_size
    table = pb.pages.to(torch.int32).contiguous()  # [batch, pages], 0 past each entry's pages
    lens = lay.kv_lens_host.to(torch.int64).view(batch, 1).to(torch.uint32).to(q.device)
    ws = torch.zeros(FLOAT_WS, dtype=torch.uint8, device=q.device)
    semaphores, scratch = ws[: 8 << 20], ws[8 << 20 :]
    out = torch.empty_like(q)
    shape = (batch, 1, s.q_heads, s.head_dim) if q_len == 1 else (batch, 1, q_len, s.q_heads, s.head_dim)
    mask = None
    if q_len > 1:  # row i sees draft tokens 0..i: bit j of one 32-bit word a row, stored as two uint16 (low first)
        if q_len > 32:
            raise SystemExit("the probe builds XQA's mask for at most 32 draft tokens")
        words = (1 << (torch.arange(q_len, dtype=torch.int64) + 1)) - 1
        halves = torch.stack([words & 0xFFFF, words >> 16], dim=1)
        mask = halves.to(torch.int32).to(torch.uint16).repeat(batch, 1, 1).to(q.device)
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count

    def call(pdl: bool):
        with tvm_ffi.use_torch_stream():
            mod.xqa_wrapper(False, sms, s.kv_heads, 0, 1.0, None, out.view(shape), 1.0, q.view(shape), None, k, v,
                            None, None, table, table.shape[1] * s.page_size, lens, batch, 1.0, None, q_len, None, mask,
                            semaphores, scratch, pdl)
        return out

    return call


def undelta(pb):
    """pb with every delta 0: the reference for a kernel with no positional correction."""
    return dataclasses.replace(pb, deltas=torch.zeros_like(pb.deltas))


def main() -> None:
    out_path = sys.argv[1]
    batches = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1,8").split(",")]
    b, copy_gbps, rag_bytes, _ = rag_sweep_bench()
    s = b.s
    mods = {}
    for name in ("decode", "fa2", "fa3", "xqa", "xqa32"):
        try:
            mods[name] = load(name)
        except Exception as e:  # noqa: BLE001 - recorded, the others go on
            print(f"{name}: {type(e).__name__}: {e}", flush=True)

    def check(result: dict, name: str, out: torch.Tensor, expected: torch.Tensor) -> None:
        result[f"max |{name} - reference|"] = (out.float() - expected).abs().max().item()

    def decode_row(batch: int) -> dict:
        inputs, nbytes = decode_inputs(b, batch, CONTEXT, 22 + batch)
        result = {"case": "decode", "batch": batch, "bytes": nbytes, "copy_gbps": copy_gbps,
                  "read_us": read_ceiling(b, nbytes)}
        ours = attention(True)
        calls = {"ours": [functools.partial(ours, *i, b.tables, b.scale) for i in inputs]}
        check(result, "ours", calls["ours"][0]().float(), paged_attention(*inputs[0], b.tables, b.scale).float())
        expected = paged_attention(*inputs[0][:3], undelta(inputs[0][3]), None, b.scale).float()
        fis = {}
        if "decode" in mods:
            fis["fi decode"] = [fi_decode(mods["decode"], s, b.scale, *i) for i in inputs]
        if "fa2" in mods:
            fis["fi decode tc"] = [fi_prefill(mods["fa2"], "fa2", s, b.scale, *i, [1] * batch, False) for i in inputs]
        eager = {}  # planned as outside CUDA graphs (the split may differ), and XQA: timed with PDL only
        if "xqa" in mods:
            eager["fi xqa"] = [fi_xqa(mods["xqa"], s, *i) for i in inputs]
        if "decode" in mods:
            eager["fi decode eager-plan"] = [fi_decode(mods["decode"], s, b.scale, *i, False) for i in inputs]
        if "fa2" in mods:
            eager["fi decode tc eager-plan"] = [fi_prefill(mods["fa2"], "fa2", s, b.scale, *i, [1] * batch, False,
                                                           False) for i in inputs]
        for name, fns in [*fis.items(), *eager.items()]:
            check(result, name, fns[0](False), expected)
            for pdl in (False, True) if name in fis else (True,):
                calls[f"{name}{' pdl' if pdl else ''}"] = [functools.partial(f, pdl) for f in fns]
        result.update(graph_rounds(b, calls, ROUNDS, nbytes, copy_gbps))
        return result

    def prefill_row(batch: int) -> dict:
        kv_bytes = batch * rag_bytes
        inputs, _ = rag_case(b, batch, False, copies=4)
        result = {"case": "short prefill", "batch": batch, "bytes": kv_bytes, "copy_gbps": copy_gbps,
                  "read_us": read_ceiling(b, kv_bytes)}
        split = [engine_split(b, *i) for i in inputs]
        calls = {"ours": [functools.partial(engine_attention, b, *i) for i in split]}
        check(result, "ours", calls["ours"][0]().float(), paged_attention(*inputs[0], b.tables, b.scale).float())
        expected = paged_attention(*inputs[0][:3], undelta(inputs[0][3]), None, b.scale).float()
        for backend in ("fa2", "fa3"):
            if backend not in mods:
                continue
            name = f"fi {backend}"
            try:
                fns = [fi_prefill(mods[backend], backend, s, b.scale, *i, [s.question] * batch, True) for i in inputs]
                check(result, name, fns[0](False), expected)
            except Exception as e:  # noqa: BLE001 - recorded, the others go on
                result[f"{name} error"] = f"{type(e).__name__}: {str(e)[:300]}"
                continue
            for pdl in (False, True):
                calls[f"{name}{' pdl' if pdl else ''}"] = [functools.partial(f, pdl) for f in fns]
        if "xqa32" in mods and s.question == 32:
            try:
                fns = [fi_xqa(mods["xqa32"], s, *i, q_len=s.question) for i in inputs]
                check(result, "fi xqa", fns[0](False), expected)
                calls["fi xqa pdl"] = [functools.partial(f, True) for f in fns]
            except Exception as e:  # noqa: BLE001 - recorded, the others go on
                result["fi xqa error"] = f"{type(e).__name__}: {str(e)[:300]}"
        result.update(graph_rounds(b, calls, ROUNDS, kv_bytes, copy_gbps))
        return result

    cases = [functools.partial(decode_row, n) for n in batches] + [functools.partial(prefill_row, n) for n in batches]
    probe_rows(out_path, {"rounds": ROUNDS, "context": CONTEXT, "flashinfer": "0.7.2.post1"}, cases, lambda c: c())


if __name__ == "__main__":
    main()
