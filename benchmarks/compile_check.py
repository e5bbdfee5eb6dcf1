"""Compile every Triton kernel of lazyattn for a GPU that is not there: does the installed Triton build them?

    python -m benchmarks.compile_check                # sm_90 (H100/H200), every configuration below
    python -m benchmarks.compile_check --arch 90 --only prefill
    python -m benchmarks.compile_check --only decode --dump /tmp/ir   # also keep each kernel's TTGIR and PTX

prints one line per kernel launch configuration, `OK` (with the compile time, the shared memory, registers and
stack per thread the kernel takes) or `FAIL` and the error, and exits 1 if any failed. It needs no GPU and no
CUDA driver: it runs on a CPU.

How. The kernels' own launch wrappers (prefill_attention, decode_attention, rope_write_kv[_runs], copy_rotate,
gemv, rms_norm, add_rms_norm, silu_mul) are called with CPU tensors of the shapes the engine uses (Llama-3.1-8B:
32 q heads, 8 kv heads, head_dim 128, bf16, pages of 64 and 16; also the per-rank heads of 8B and 70B under
tensor parallelism of 2; the GEMV configs of gemv_table.json), with q
reporting `is_cuda` and an H100's 132 SMs, so each wrapper picks the tiles, split counts, constexprs and
launch options it picks on the GPU. Where the wrapper would launch, `JITFunction.run` is replaced by what it
does before a launch: bind and specialise the arguments (as Triton does for a GPU: dtypes, 16-byte alignment,
integers equal to 1), then `triton.compile` the kernel for `GPUTarget("cuda", arch, 32)` (what Triton's CUDA
driver reports), through Triton's own pipeline (TTIR, TTGIR, LLVM IR, PTX, then the ptxas shipped in the
triton wheel to a cubin, whose registers and stack per thread cuobjdump reads). Nothing is cached
across runs (a fresh TRITON_CACHE_DIR).

What it proves: the Triton frontend and backend of this Triton version accept each listed configuration and
ptxas assembles it for the target (a kernel that Triton 3.6 would reject on the GPU machine, e.g. the body of
an `if` on a constexpr False that it still type-checks, fails here). What it does not prove: that the kernels
run, give right results, or run fast (nothing executes; the CPU tests check results under TRITON_INTERPRET=1,
benchmarks/kernels.py checks speed on the GPU), nor anything about configurations not listed here (other
models' head counts, fp16/fp32 caches, GEMV shapes of other GPUs' tables). A torch build other than the GPU
machine's is fine: torch only supplies the tensors and dtypes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # the real compiler, not the interpreter
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="lazyattn-compile-check-")  # before triton's import

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402
from triton.runtime import jit  # noqa: E402

from lazyattn.kernels import (  # noqa: E402
    cache_ops,
    decode,
    fused,
    gemv,
    greedy,
    invariant,
    prefill,
    prefill_hopper,
    prefill_plan,
    shared_decode,
)
from lazyattn.kernels.paged import EntryPages, PagedBatch, transposed_copy  # noqa: E402
from lazyattn.kernels.rope import RopeConfig, RopeTables  # noqa: E402

H100_SMS = 132
BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn  # kv_cache_dtype=fp8_e4m3's pages (docs/design.md, "FP8 KV cache")


class _CudaLooking(torch.Tensor):
    """A CPU tensor that the wrappers take for a CUDA one (they check q.is_cuda to pick GPU launch parameters)."""

    @property
    def is_cuda(self) -> bool:
        return True


def _cuda_looking(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(_CudaLooking)


@dataclass
class Result:
    case: str
    kernel: str
    key: str
    error: str | None
    seconds: float
    shared: int | None
    usage: str = ""  # registers and stack per thread, from the cubin (cuobjdump)


class Compiler:
    """Stands in for JITFunction.run: compiles each launch for `target` instead of launching it."""

    def __init__(self, target: GPUTarget, dump: Path | None = None) -> None:
        self.target = target
        self.dump = dump
        self.backend = make_backend(target)
        self.case = ""
        self.results: list[Result] = []
        self._done: dict[str, Result] = {}

    def run(self, fn: jit.JITFunction, *args, grid, warmup, **kwargs):
        # What JITFunction.run adds before binding (knobs that exist in this Triton version only).
        kwargs["debug"] = kwargs.get("debug", fn.debug) or triton.knobs.runtime.debug
        for knob in ("instrumentation_mode", "fpsan_homomorphic_casts"):
            if hasattr(triton.knobs.compilation, knob):
                kwargs[knob] = getattr(triton.knobs.compilation, knob)
        args = tuple(a.as_subclass(torch.Tensor) if isinstance(a, _CudaLooking) else a for a in args)
        binder = jit.create_function_from_signature(fn.signature, fn.params, self.backend)
        bound_args, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = fn._pack_args(self.backend, kwargs, bound_args, specialization, options)
        name = fn.fn.__name__
        shown = {fn.arg_names[path[0]]: _short(v) for path, v in constexprs.items() if fn.params[path[0]].is_constexpr}
        key = (
            f"{name}[{', '.join(f'{k}={v}' for k, v in shown.items())}; warps={options.num_warps} "
            f"stages={options.num_stages}{f' maxnreg={options.maxnreg}' if options.maxnreg else ''}]"
        )
        full_key = key + str(signature) + str(sorted(attrs.items())) + str(sorted(constexprs.items()))
        if full_key in self._done:
            previous = self._done[full_key]
            self.results.append(Result(self.case, name, key, previous.error, 0.0, previous.shared, previous.usage))
            return None
        start = time.perf_counter()
        error, shared, usage = None, None, ""
        try:
            source = GluonASTSource if fn.is_gluon() else ASTSource  # Gluon kernels come in as TTGIR
            compiled = triton.compile(
                source(fn, signature, constexprs, attrs), target=self.target, options=options.__dict__
            )
            shared = compiled.metadata.shared
            if not compiled.asm.get("cubin"):
                raise RuntimeError("no cubin came out of ptxas")
            usage = _resource_usage(compiled.asm["cubin"])
            if self.dump is not None:
                self._write(name, len(self._done), compiled.asm)
        except Exception as exc:  # noqa: BLE001 - every failure is the result being reported
            error = f"{type(exc).__name__}: {exc}".strip() or traceback.format_exc()
            cause = exc.__cause__
            while cause is not None:  # a CompilationError's message points at the call; its cause says what failed
                error += f"\n  caused by {type(cause).__name__}: {cause}"
                cause = cause.__cause__
        result = Result(self.case, name, key, error, time.perf_counter() - start, shared, usage)
        self._done[full_key] = result
        self.results.append(result)
        return None

    def _write(self, name: str, index: int, asm: dict) -> None:
        """Keep the compile's TTGIR and PTX (what layouts Triton chose, what the pipeliner made of the loads)."""
        self.dump.mkdir(parents=True, exist_ok=True)
        for stage in ("ttgir", "ptx"):
            if isinstance(asm.get(stage), str):
                (self.dump / f"{index:03d}_{name}.{stage}").write_text(asm[stage])

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        original = jit.JITFunction.run
        compiler = self

        def run(fn, *args, grid, warmup, **kwargs):
            return compiler.run(fn, *args, grid=grid, warmup=warmup, **kwargs)

        jit.JITFunction.run = run
        # Each module's GPU queries answered as on the target (the tensors are CPU ones): an H100's SM count, and
        # decode's tiles by the copy engine where its launcher takes them on a Hopper GPU.
        stand_ins = {(m, "sm_count"): lambda device: H100_SMS for m in (prefill, decode, gemv)}
        stand_ins[(decode, "copy_engine_tiles")] = lambda device: self.target.arch >= 90
        saved = [(m, n, getattr(m, n)) for m, n in stand_ins]
        for (m, n), stand_in in stand_ins.items():
            setattr(m, n, stand_in)
        try:
            yield
        finally:
            jit.JITFunction.run = original
            for m, n, v in saved:
                setattr(m, n, v)


def _resource_usage(cubin: bytes) -> str:
    """'regs R, stack S B' per thread of a cubin, by the cuobjdump shipped in the triton wheel ('' without it). A
    stack above 0 with a register cap is spilled registers."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return ""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", text)
    return f"regs {found[1]}, stack {found[2]} B" if found else ""


def _short(v) -> str:
    v = getattr(v, "value", v)
    return str(v).removeprefix("torch.").replace("triton.language.", "")


# ---------------------------------------------------------------------------------------------------
# the engine's shapes


@dataclass(frozen=True)
class Heads:
    label: str
    q: int
    kv: int
    dim: int = 128


LLAMA_8B = Heads("8B", 32, 8)
LLAMA_8B_TP2 = Heads("8B/TP2", 16, 4)  # one rank's heads under tensor parallelism of 2
LLAMA_70B_TP2 = Heads("70B/TP2", 32, 4)  # 64 q, 8 kv heads over 2 ranks: a group of 8


def _tables(heads: Heads, interleaved: bool = False) -> RopeTables:
    cfg = RopeConfig(
        head_dim=heads.dim,
        base=500000.0,
        rope_type="llama3",
        factor=8.0,
        original_max_position=8192,
        interleaved=interleaved,
    )
    return RopeTables.build(cfg, 16384)


def _pool(heads: Heads, page_size: int, pages: int = 8, dtype: torch.dtype = BF16) -> torch.Tensor:
    """The page pool [layers, 2, pages, page_size, Hkv, D]: the wrappers get its layer views, as in the engine."""
    return torch.zeros(2, 2, pages, page_size, heads.kv, heads.dim, dtype=dtype)


def _qkv(heads: Heads, tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as views of one fused projection's output (the model's layout, so their strides)."""
    qkv = torch.zeros(tokens, (heads.q + 2 * heads.kv) * heads.dim, dtype=BF16)
    q, k, v = qkv.split([heads.q * heads.dim, heads.kv * heads.dim, heads.kv * heads.dim], dim=1)
    return (
        _cuda_looking(q.view(tokens, heads.q, heads.dim)),
        k.view(tokens, heads.kv, heads.dim),
        v.view(tokens, heads.kv, heads.dim),
    )


def _rag_entry(
    page_size: int, question: int, docs: int = 5, doc_tokens: int = 2048, system: int = 64, relinked: bool = False
) -> EntryPages:
    """A RAG request's pages: a system segment, `docs` cached documents (each its own delta) and the question's
    own pages: docs + 2 runs. Page ids repeat over a small pool (ids do not change the compile)."""
    pages, deltas, valid = [], [], []
    for tokens, delta in [(system, 0)] + [(doc_tokens, system + i * doc_tokens) for i in range(docs)] + [(question, 0)]:
        n = -(-tokens // page_size)
        pages += [len(pages) % 8 for _ in range(n)]
        deltas += [delta] * n
        valid += [min(page_size, tokens - i * page_size) for i in range(n)]
    firsts = [0] * len(pages)
    if relinked:
        firsts[1] = 3  # a relinked document listed from a row inside its first page
    return EntryPages(pages, deltas, valid, firsts if relinked else None)


def _rag_batch(page_size: int, question: int, entries: int, relinked: bool = False, docs: int = 5) -> PagedBatch:
    es = [_rag_entry(page_size, question, docs=docs, relinked=relinked) for _ in range(entries)]
    kv_len = sum(es[0].valid)
    return PagedBatch.build(es, [question] * entries, [kv_len - question] * entries)


def _document_batch(page_size: int, tokens: int) -> PagedBatch:
    """A document being encoded: its own pages only, delta 0, positions from 0."""
    n = -(-tokens // page_size)
    entry = EntryPages([i % 8 for i in range(n)], [0] * n, [min(page_size, tokens - i * page_size) for i in range(n)])
    return PagedBatch.build([entry], [tokens], [0])


def _decode_batch(page_size: int, entries: int, context: int, relinked: bool = False) -> PagedBatch:
    es = [_rag_entry(page_size, 1, docs=max(1, context // 2048), relinked=relinked) for _ in range(entries)]
    kv_len = sum(es[0].valid)
    return PagedBatch.build(es, [1] * entries, [kv_len - 1] * entries)


# ---------------------------------------------------------------------------------------------------
# cases: each calls a wrapper the way the engine (kernels/triton_backend.py, engine/prefill_graphs.py,
# model/layers.py) or the benchmarks call it


def _prefill(
    heads: Heads,
    page_size: int,
    batch: PagedBatch,
    tokens: int,
    *,
    graph: bool = False,
    rotated_in_rope: bool = True,
    kv_dtype: torch.dtype = BF16,
    v_transposed: bool = False,
    **options,
) -> None:
    """TritonBackend.attend's prefill path: rope_write_kv_runs' copies for short calls, then prefill_attention;
    graph=True fixes the split count and passes the host's split plan as a captured bucket does
    (engine/prefill_graphs.py); v_transposed: V's pages stored transposed, as the pool stores FP8 pages' V."""
    kv = _pool(heads, page_size, dtype=kv_dtype)
    k_cache, v_cache = kv[0, 0], transposed_copy(kv[0, 1]) if v_transposed else kv[0, 1]
    tables = _tables(heads)
    q, k, v = _qkv(heads, tokens)
    positions = torch.zeros(tokens, dtype=torch.int32)
    slots = torch.zeros(tokens, dtype=torch.int32)
    if graph:
        batch.num_splits = prefill.graph_num_splits(
            tokens, batch.batch_size, heads.q, heads.kv, heads.dim, BF16, page_size, torch.device("cuda")
        )
        if batch.num_splits > 1:
            batch.plan = torch.zeros(batch.batch_size, batch.num_splits, prefill_plan.PLAN_WIDTH, dtype=torch.int32)
    runs = prefill.rotated_runs_for(tokens)
    if runs and rotated_in_rope and options.get("apply_delta", True):
        q, q_rot = cache_ops.rope_write_kv_runs(q, k, v, positions, slots, k_cache, v_cache, tables, batch, runs)
        options["rotated_q"] = q_rot
    else:
        q = cache_ops.rope_write_kv(q, k, v, positions, slots, k_cache, v_cache, tables)
    prefill.prefill_attention(_cuda_looking(q), k_cache, v_cache, batch, tables, heads.dim**-0.5, **options)


def _short_prefill(
    heads: Heads,
    tokens: int,
    entries: int,
    splits: int,
    engine: bool = False,
    kv_dtype: torch.dtype = BF16,
    v_transposed: bool = False,
) -> None:
    """The warp-specialised Gluon kernel (kernels/prefill_hopper.py) over the RAG case. engine: as the engine's CUDA
    graphs launch it on a Hopper GPU, with the first-slot offsets (some relinked) and programmatic dependent launch;
    v_transposed: V's pages stored transposed, as the pool stores FP8 pages' V."""
    kv = _pool(heads, 64, dtype=kv_dtype)
    v = transposed_copy(kv[0, 1]) if v_transposed else kv[0, 1]
    q = torch.zeros(tokens, heads.q, heads.dim, dtype=BF16)
    batch = _rag_batch(64, tokens // entries, entries, relinked=engine)
    with _pdl(prefill_hopper, engine):
        prefill_hopper.short_prefill_attention(
            _cuda_looking(q), kv[0, 0], v, batch, _tables(heads), heads.dim**-0.5, splits
        )


@contextlib.contextmanager
def _pdl(module, on: bool) -> Iterator[None]:
    """With `on`: `module`'s launcher takes programmatic dependent launch as on a Hopper GPU (its pdl_options
    looks at the device, a CPU here)."""
    launch = module.pdl_options
    if on:
        module.pdl_options = lambda device, family: {"USE_PDL": True, "launch_pdl": True}
    try:
        yield
    finally:
        module.pdl_options = launch


def _decode(
    heads: Heads,
    page_size: int,
    batch: PagedBatch,
    pdl: bool = False,
    kv_dtype: torch.dtype = BF16,
    tma: int | None = None,
    v_transposed: bool = False,
) -> None:
    """pdl: launched as the engine launches it on a Hopper GPU (the page tables read before the wait); tma: the
    copy-engine tiles of decode_config's choice on Hopper below two programs per SM (the CPU here never chooses
    them); v_transposed: V's pages stored transposed, as the pool stores FP8 pages' V (the launcher's config)."""
    kv = _pool(heads, page_size, dtype=kv_dtype)
    tables = _tables(heads)
    q, k, v = _qkv(heads, batch.batch_size)
    positions = torch.zeros(batch.batch_size, dtype=torch.int32)
    v_cache = transposed_copy(kv[0, 1]) if v_transposed else kv[0, 1]
    q = cache_ops.rope_write_kv(q, k, v, positions, positions, kv[0, 0], v_cache, tables)
    config = None
    if tma is not None:
        config = dataclasses.replace(decode.decode_config(heads.dim, kv_dtype, page_size), tma=tma)
    with _pdl(decode, pdl):
        decode.decode_attention(
            _cuda_looking(q),
            kv[0, 0],
            v_cache,
            batch,
            tables,
            heads.dim**-0.5,
            counters=decode.ArrivalCounters(),
            config=config,
        )


def _shared_decode(
    heads: Heads,
    page_size: int,
    entries: int,
    group_rows: int,
    relinked: bool = False,
    ape: bool = False,
    kv_dtype: torch.dtype = BF16,
    v_transposed: bool = False,
) -> None:
    """Shared-document decode (kernels/shared_decode.py): its job and merge kernels, over entries that list the same
    documents (at one delta here: the compile does not see deltas); ape: with a temperature on every page;
    v_transposed: V's pages stored transposed, as the pool stores FP8 pages' V."""
    es = [_rag_entry(page_size, 1, relinked=relinked) for _ in range(entries)]
    for e in es if ape else ():
        e.inv_temps, e.log_scales = [0.5] * len(e.pages), [0.1] * len(e.pages)
    batch = PagedBatch.build(es, [1] * entries, [sum(es[0].valid) - 1] * entries)
    plan = shared_decode.shared_plan(es, heads.q // heads.kv, group_rows).to("cpu")
    kv = _pool(heads, page_size, dtype=kv_dtype)
    q, _, _ = _qkv(heads, entries)
    v_cache = transposed_copy(kv[0, 1]) if v_transposed else kv[0, 1]
    shared_decode.shared_decode_attention(q, kv[0, 0], v_cache, batch, plan, _tables(heads), heads.dim**-0.5)


def _invariant_attention(
    heads: Heads,
    page_size: int,
    batch: PagedBatch,
    tokens: int,
    kv_dtype: torch.dtype = BF16,
    v_transposed: bool = False,
) -> None:
    """The deterministic mode's attention (kernels/invariant.py), prefill and decode alike; v_transposed: V's pages
    stored transposed, as the pool stores FP8 pages' V."""
    kv = _pool(heads, page_size, dtype=kv_dtype)
    q, _, _ = _qkv(heads, tokens)
    v_cache = transposed_copy(kv[0, 1]) if v_transposed else kv[0, 1]
    invariant.paged_attention(q, kv[0, 0], v_cache, batch, _tables(heads), heads.dim**-0.5)


def _invariant_matmul(n: int, k: int, m: int) -> None:
    x = _cuda_looking(torch.zeros(m, k, dtype=BF16))
    invariant.matmul(x, torch.zeros(n, k, dtype=BF16))


def _copy_rotate(heads: Heads, page_size: int, kv_dtype: torch.dtype = BF16) -> None:
    kv = _pool(heads, page_size, dtype=kv_dtype)
    idx = torch.arange(4, dtype=torch.int32)
    cache_ops.copy_rotate(kv, idx, idx + 4, idx * 100, _tables(heads))


def _gemv_configs() -> list[tuple[int, int, gemv.GemvConfig]]:
    """The (N, K, config) rows of gemv_table.json for bf16 (the configs the engine's dispatch can launch)."""
    table = gemv._load_table(str(gemv.TABLE_PATH))
    seen = []
    for (_device, dtype, n, k), rows in sorted(table.items()):
        for _m, measured in rows:
            config = measured.config
            if dtype == "bfloat16" and config is not None and (n, k, config) not in seen:
                seen.append((n, k, config))
    return seen


def _gemv(n: int, k: int, config: gemv.GemvConfig, m: int = 1) -> None:
    """The plain product and the decode fusion's forms of it (docs/design.md, "Decode fusion")."""
    x = torch.zeros(m, k, dtype=BF16)
    w = torch.zeros(n, k, dtype=BF16)
    gemv.gemv(x, w, None, config)
    squares = torch.ones(m, 1, dtype=torch.float32)
    gemv.gemv_normed(x, squares, 1e-5, w, None, config)
    if n % 2 == 0:
        gemv.gemv_normed(x, squares, 1e-5, w, None, config, gated=True)
    gemv.gemv_into_residual(x, w, torch.zeros(m, n, dtype=BF16), None, config)


def _fused(hidden: int, intermediate: int, rows: int) -> None:
    x = torch.zeros(rows, hidden, dtype=BF16)
    w = torch.ones(hidden, dtype=BF16)
    fused.rms_norm(x, w, 1e-5)
    fused.add_rms_norm(x, x.clone(), w, 1e-5)
    fused.silu_mul(torch.zeros(rows, 2 * intermediate, dtype=BF16))
    fused.silu_mul(torch.zeros(rows, 2 * intermediate, dtype=BF16), interleaved=True)
    greedy.greedy_pick(torch.zeros(rows, 128256, dtype=torch.float32))


def cases() -> list[tuple[str, Callable[[], None]]]:
    out: list[tuple[str, Callable[[], None]]] = []
    for heads in (LLAMA_8B, LLAMA_8B_TP2, LLAMA_70B_TP2):
        h = heads.label
        for ps in (64, 16):
            # Short RAG questions over cached documents: Q copies from the RoPE launch (program per copy up to
            # 64 tokens, per token beyond), the split counts of the CUDA-graph buckets and of eager launches.
            for tokens, entries in ((32, 1), (16, 1), (64, 2), (128, 4), (256, 8)):
                q_len = tokens // entries
                out.append(
                    (
                        f"prefill {h} page{ps} rag T={tokens} B={entries} eager",
                        lambda heads=heads, ps=ps, q=q_len, e=entries, t=tokens: _prefill(
                            heads, ps, _rag_batch(ps, q, e), t
                        ),
                    )
                )
                if tokens <= 128:
                    out.append(
                        (
                            f"prefill {h} page{ps} rag T={tokens} B={entries} graph",
                            lambda heads=heads, ps=ps, q=q_len, e=entries, t=tokens: _prefill(
                                heads, ps, _rag_batch(ps, q, e), t, graph=True
                            ),
                        )
                    )
            out.append(
                (
                    f"prefill {h} page{ps} rag T=32 B=1 relinked (firsts)",
                    lambda heads=heads, ps=ps: _prefill(heads, ps, _rag_batch(ps, 32, 1, relinked=True), 32),
                )
            )
            out.append(
                (
                    f"prefill {h} page{ps} rag T=32 B=1 rotated by prefill (_rotate_runs_kernel)",
                    lambda heads=heads, ps=ps: _prefill(heads, ps, _rag_batch(ps, 32, 1), 32, rotated_in_rope=False),
                )
            )
            out.append(
                (
                    f"prefill {h} page{ps} rag T=32 B=1 rotated_runs=0 (in-kernel rotation)",
                    lambda heads=heads, ps=ps: _prefill(
                        heads, ps, _rag_batch(ps, 32, 1), 32, rotated_in_rope=False, rotated_runs=0
                    ),
                )
            )
            out.append(
                (
                    f"prefill {h} page{ps} rag T=32 B=1 apply_delta=False",
                    lambda heads=heads, ps=ps: _prefill(heads, ps, _rag_batch(ps, 32, 1), 32, apply_delta=False),
                )
            )
            # Longer calls: a question past _ROTATE_MAX_ROWS (in-kernel rotation), a document being encoded.
            out.append(
                (
                    f"prefill {h} page{ps} rag T=512 B=1",
                    lambda heads=heads, ps=ps: _prefill(heads, ps, _rag_batch(ps, 512, 1), 512),
                )
            )
            out.append(
                (
                    f"prefill {h} page{ps} document T=2048",
                    lambda heads=heads, ps=ps: _prefill(heads, ps, _document_batch(ps, 2048), 2048),
                )
            )
            out.append(
                (
                    f"prefill {h} page{ps} document T=64",
                    lambda heads=heads, ps=ps: _prefill(heads, ps, _document_batch(ps, 64), 64),
                )
            )
            for entries, context in ((1, 10240), (2, 10240), (8, 4096), (32, 4096), (64, 8192)):
                out.append(
                    (
                        f"decode {h} page{ps} B={entries} ctx~{context}",
                        lambda heads=heads, ps=ps, e=entries, c=context: _decode(heads, ps, _decode_batch(ps, e, c)),
                    )
                )
            out.append(
                (
                    f"decode {h} page{ps} B=1 relinked (firsts)",
                    lambda heads=heads, ps=ps: _decode(heads, ps, _decode_batch(ps, 1, 10240, relinked=True)),
                )
            )
            out.append(
                (
                    f"decode {h} page{ps} B=1 ctx~10240, PDL",
                    lambda heads=heads, ps=ps: _decode(heads, ps, _decode_batch(ps, 1, 10240), pdl=True),
                )
            )
            for rows in (16, 32, 64):
                out.append(
                    (
                        f"shared decode {h} page{ps} B=8 rows{rows}",
                        lambda heads=heads, ps=ps, r=rows: _shared_decode(heads, ps, 8, r),
                    )
                )
            out.append(
                (
                    f"shared decode {h} page{ps} B=8 rows16 relinked (firsts)",
                    lambda heads=heads, ps=ps: _shared_decode(heads, ps, 8, 16, relinked=True),
                )
            )
            out.append(
                (
                    f"shared decode {h} page{ps} B=8 rows16 APE",
                    lambda heads=heads, ps=ps: _shared_decode(heads, ps, 8, 16, ape=True),
                )
            )
            out.append((f"copy_rotate {h} page{ps}", lambda heads=heads, ps=ps: _copy_rotate(heads, ps)))
    # FP8 pages (kv_cache_dtype=fp8_e4m3): the RoPE launch's FP8 stores, every attention kernel's widening loads
    for ps in (64, 16):
        h = LLAMA_8B.label
        for tokens, entries, graph in ((32, 1, False), (32, 1, True), (256, 8, False)):
            out.append(
                (
                    f"fp8 prefill {h} page{ps} rag T={tokens} B={entries} {'graph' if graph else 'eager'}",
                    lambda ps=ps, q=tokens // entries, e=entries, t=tokens, g=graph: _prefill(
                        LLAMA_8B, ps, _rag_batch(ps, q, e), t, graph=g, kv_dtype=FP8
                    ),
                )
            )
        out.append(
            (
                f"fp8 prefill {h} page{ps} rag T=256 B=8 graph, V transposed",
                lambda ps=ps: _prefill(
                    LLAMA_8B, ps, _rag_batch(ps, 32, 8), 256, graph=True, kv_dtype=FP8, v_transposed=True
                ),
            )
        )
        out.append(
            (
                f"fp8 prefill {h} page{ps} rag T=32 B=1 rotated_runs=0 (in-kernel rotation)",
                lambda ps=ps: _prefill(
                    LLAMA_8B, ps, _rag_batch(ps, 32, 1), 32, rotated_in_rope=False, rotated_runs=0, kv_dtype=FP8
                ),
            )
        )
        out.append(
            (
                f"fp8 prefill {h} page{ps} document T=2048",
                lambda ps=ps: _prefill(LLAMA_8B, ps, _document_batch(ps, 2048), 2048, kv_dtype=FP8),
            )
        )
        out.append(
            (
                f"fp8 prefill {h} page{ps} document T=2048, V transposed",
                lambda ps=ps: _prefill(LLAMA_8B, ps, _document_batch(ps, 2048), 2048, kv_dtype=FP8, v_transposed=True),
            )
        )
        for entries, context in ((1, 10240), (32, 4096)):
            out.append(
                (
                    f"fp8 decode {h} page{ps} B={entries} ctx~{context}",
                    lambda ps=ps, e=entries, c=context: _decode(LLAMA_8B, ps, _decode_batch(ps, e, c), kv_dtype=FP8),
                )
            )
        for tma in (1, 2):
            out.append(
                (
                    f"fp8 decode {h} page{ps} B=1 ctx~10240 tma={tma}, PDL",
                    lambda ps=ps, t=tma: _decode(
                        LLAMA_8B, ps, _decode_batch(ps, 1, 10240), pdl=True, tma=t, kv_dtype=FP8
                    ),
                )
            )
        out.append(
            (
                f"fp8 decode {h} page{ps} B=32 ctx~4096 V transposed, PDL",
                lambda ps=ps: _decode(
                    LLAMA_8B, ps, _decode_batch(ps, 32, 4096), pdl=True, kv_dtype=FP8, v_transposed=True
                ),
            )
        )
        out.append(
            (
                f"fp8 shared decode {h} page{ps} B=8 rows16",
                lambda ps=ps: _shared_decode(LLAMA_8B, ps, 8, 16, kv_dtype=FP8),
            )
        )
        out.append(
            (
                f"fp8 shared decode {h} page{ps} B=8 rows16, V transposed",
                lambda ps=ps: _shared_decode(LLAMA_8B, ps, 8, 16, kv_dtype=FP8, v_transposed=True),
            )
        )
        out.append((f"fp8 copy_rotate {h} page{ps}", lambda ps=ps: _copy_rotate(LLAMA_8B, ps, kv_dtype=FP8)))
        out.append(
            (
                f"fp8 invariant attention {h} page{ps} rag T=64 B=2",
                lambda ps=ps: _invariant_attention(LLAMA_8B, ps, _rag_batch(ps, 32, 2), 64, kv_dtype=FP8),
            )
        )
        out.append(
            (
                f"fp8 invariant attention {h} page{ps} rag T=64 B=2, V transposed",
                lambda ps=ps: _invariant_attention(
                    LLAMA_8B, ps, _rag_batch(ps, 32, 2), 64, kv_dtype=FP8, v_transposed=True
                ),
            )
        )
    for tokens, entries, splits in ((32, 1, 16), (256, 8, 1)):
        out.append(
            (
                f"short prefill (Gluon) 8B page64 rag T={tokens} B={entries} splits={splits}",
                lambda t=tokens, e=entries, n=splits: _short_prefill(LLAMA_8B, t, e, n),
            )
        )
    out.append(
        (
            "short prefill (Gluon) 8B page64 rag T=32 B=1 splits=16, relinked (firsts), PDL",
            lambda: _short_prefill(LLAMA_8B, 32, 1, 16, engine=True),
        )
    )
    # FP8 pages: the load warpgroup widens the tiles to float16 (a kernel variant of its own)
    for tokens, entries, splits, engine in ((32, 1, 16, False), (256, 8, 1, False), (32, 1, 16, True)):
        out.append(
            (
                f"fp8 short prefill (Gluon) 8B page64 rag T={tokens} B={entries} splits={splits}"
                + (", relinked (firsts), PDL" if engine else ""),
                lambda t=tokens, e=entries, n=splits, g=engine: _short_prefill(LLAMA_8B, t, e, n, g, kv_dtype=FP8),
            )
        )
        out.append(
            (
                f"fp8 short prefill (Gluon) 8B page64 rag T={tokens} B={entries} splits={splits}, V transposed"
                + (", relinked (firsts), PDL" if engine else ""),
                lambda t=tokens, e=entries, n=splits, g=engine: _short_prefill(
                    LLAMA_8B, t, e, n, g, kv_dtype=FP8, v_transposed=True
                ),
            )
        )
    for n, k, config in _gemv_configs():
        for m in (1, 8):
            out.append((f"gemv N={n} K={k} M={m} {config}", lambda n=n, k=k, c=config, m=m: _gemv(n, k, c, m)))
    for heads in (LLAMA_8B, LLAMA_70B_TP2):
        for ps in (64, 16):
            out.append(
                (
                    f"invariant attention {heads.label} page{ps} rag T=64 B=2",
                    lambda heads=heads, ps=ps: _invariant_attention(heads, ps, _rag_batch(ps, 32, 2), 64),
                )
            )
            out.append(
                (
                    f"invariant attention {heads.label} page{ps} decode B=4",
                    lambda heads=heads, ps=ps: _invariant_attention(heads, ps, _decode_batch(ps, 4, 4096), 4),
                )
            )
    for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)):
        for m in (1, 64, 300):
            out.append((f"invariant matmul N={n} K={k} M={m}", lambda n=n, k=k, m=m: _invariant_matmul(n, k, m)))
    out.append(("fused 8B (hidden 4096, intermediate 14336)", lambda: _fused(4096, 14336, 4)))
    out.append(("fused 8B/TP2 (hidden 4096, intermediate 7168)", lambda: _fused(4096, 7168, 4)))
    out.append(("fused 70B/TP2 (hidden 8192, intermediate 14336)", lambda: _fused(8192, 14336, 4)))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability, e.g. 90 (H100/H200)")
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument("--dump", type=Path, default=None, help="write each compiled kernel's TTGIR and PTX here")
    args = parser.parse_args()
    # what the CUDA driver reports: warps of 32 threads
    compiler = Compiler(GPUTarget("cuda", args.arch, 32), args.dump)
    print(f"# triton {triton.__version__}, torch {torch.__version__}, target sm_{args.arch}", flush=True)
    failed = 0
    with compiler.installed():
        for name, case in cases():
            if args.only not in name:
                continue
            compiler.case = name
            first = len(compiler.results)
            try:
                case()
            except Exception as exc:  # noqa: BLE001 - a wrapper that fails before its launch is a result too
                compiler.results.append(Result(name, "(wrapper)", "", f"{type(exc).__name__}: {exc}", 0.0, None))
            for r in compiler.results[first:]:
                if r.error is None:
                    where = f"{r.seconds:.1f} s" if r.seconds else "same compile as above"
                    usage = f", {r.usage}" if r.usage else ""
                    print(f"OK    {r.case}: {r.key} ({where}, shared {r.shared} B{usage})", flush=True)
                else:
                    failed += 1
                    print(f"FAIL  {r.case}: {r.key}: {r.error}", flush=True)
    print(f"# {len(compiler.results) - failed} OK, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
