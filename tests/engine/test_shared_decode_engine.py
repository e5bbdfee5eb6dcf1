"""Shared-document decode in the engine (kernels/shared_decode.py): which steps get a plan, the CUDA graphs' plan
buffer (engine/graph_inputs.py), the Triton backend taking the plan, and lazy-mode greedy outputs with it on and off.

On a CPU the Triton kernels run under TRITON_INTERPRET (tests/conftest.py); the engine test there swaps the CPU
engine's reference backend for the Triton one. The gpu-marked test runs the engine with CUDA graphs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lazyattn import LLM, SamplingParams
from lazyattn.engine import model_runner
from lazyattn.engine.graph_inputs import SharedDecode, StepInputs, fill_plan, plan_buffer_size, plan_views
from lazyattn.kernels.backend import ForwardBatch, ReferenceBackend
from lazyattn.kernels.paged import EntryPages, PagedBatch, page_fill
from lazyattn.kernels.rope import RopeConfig, RopeTables
from lazyattn.kernels.shared_decode import job_width, shared_plan
from lazyattn.kernels.triton_backend import TritonBackend

PAGE = 16


def lazy_entries() -> tuple[list[EntryPages], list[int]]:
    """Four decode entries over documents A (pages 1-3, 40 tokens) and B (pages 4-5, 20 tokens) at their deltas,
    each with one own page; entry 3 lists only its own document C (page 6)."""
    docs = {"A": ([1, 2, 3], 40), "B": ([4, 5], 20), "C": ([6], 9)}
    orders = [["A", "B"], ["B", "A"], ["A"], ["C"]]
    entries, q_starts = [], []
    for i, order in enumerate(orders):
        pages, deltas, valid, start = [], [], [], 0
        for name in order:
            p, n = docs[name]
            pages += p
            deltas += [start] * len(p)
            valid += page_fill(n, PAGE)
            start += n
        own = 3 + i
        entries.append(EntryPages(pages, deltas, valid).then([10 + i], [own]))
        q_starts.append(start + own - 1)
    return entries, q_starts


def decode_step(entries, q_starts) -> StepInputs:
    n = len(entries)
    slots = [(10 + i) * PAGE + int(e.valid[-1]) - 1 for i, e in enumerate(entries)]
    return StepInputs(list(range(n)), q_starts, slots, entries, [1] * n, q_starts, list(range(n)), is_decode=True)


def test_steps_that_get_a_plan():
    entries, q_starts = lazy_entries()
    shared = SharedDecode(group=2)
    plan = shared.plan(decode_step(entries, q_starts))
    assert plan is not None and plan.shared_jobs == 2  # A by entries 0-2, B by entries 0-1
    assert shared.plan(decode_step(entries[2:], q_starts[2:])) is None  # nothing listed twice
    assert shared.plan(decode_step(entries[:1], q_starts[:1])) is None
    prefill = decode_step(entries, q_starts)
    prefill.is_decode = False
    assert shared.plan(prefill) is None


def test_plan_buffer_round_trip():
    """fill_plan's buffer, read through plan_views as a graph of 6 entries with room for 30 jobs: the plan's jobs,
    its slot_start padded with the total (padding entries get no slots), its job count."""
    entries, q_starts = lazy_entries()
    plan = SharedDecode(group=2, group_rows=4).plan(decode_step(entries, q_starts))
    assert plan.members == 2
    max_entries, max_jobs = 8, 40
    buffer = np.full(plan_buffer_size(max_entries, max_jobs, job_width(2)), -7, dtype=np.int32)
    end = fill_plan(buffer, plan, max_entries)
    assert end == 2 + max_entries + plan.jobs.size and (buffer[end:] == -7).all()
    views = plan_views(torch.from_numpy(buffer), max_entries, 6, 30, 2, programs=5)
    assert int(views.num_jobs) == plan.num_jobs
    assert views.jobs.shape == (30, job_width(2))
    assert views.jobs[: plan.num_jobs].tolist() == plan.jobs.tolist()
    total = int(plan.slot_start[-1])
    assert views.slot_start.tolist() == plan.slot_start.tolist() + [total] * 2
    assert views.num_slots == 30 and views.programs == 5


def attend(backend, q, k, v, step, shared=None):
    fb = ForwardBatch(
        torch.tensor(step.positions),
        torch.tensor(step.slots),
        PagedBatch.build(step.entries, step.q_lens, step.q_starts),
        True,
        torch.arange(len(step.tokens)),
        shared,
    )
    return backend.attend(0, q, k, v, fb)


def test_triton_backend_attends_by_the_plan():
    """A decode step through TritonBackend.attend with the plan (as the eager path passes it, and through a graph's
    padded buffer) gives the plain decode kernel's rows; the page pool gets the same writes."""
    hq, hkv, dim = 4, 2, 32
    tables = RopeTables.build(RopeConfig(head_dim=dim, base=10000.0), 512)
    entries, q_starts = lazy_entries()
    step = decode_step(entries, q_starts)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(len(entries), h, dim, generator=g) for h in (hq, hkv, hkv))
    kv0 = torch.randn(1, 2, 16, PAGE, hkv, dim, generator=g)
    host = SharedDecode(group=hq // hkv).plan(step)
    buffer = np.zeros(plan_buffer_size(8, 64, job_width(host.members)), dtype=np.int32)
    fill_plan(buffer, host, 8)
    graph_like = plan_views(torch.from_numpy(buffer), 8, len(entries), 64, host.members, programs=3)
    outs, pools = [], []
    for plan in (None, host.to("cpu"), graph_like):
        kv = kv0.clone()
        outs.append(attend(TritonBackend(kv, tables, dim**-0.5), q, k, v, step, plan))
        pools.append(kv)
    for out, pool in zip(outs[1:], pools[1:]):
        torch.testing.assert_close(out, outs[0], rtol=1e-5, atol=1e-5)
        assert torch.equal(pool, pools[0])


def test_plan_matches_kernels_planner():
    """SharedDecode.plan is shared_plan with its settings (the engine adds only the decode / sharing checks)."""
    entries, q_starts = lazy_entries()
    plan = SharedDecode(group=2, group_rows=8, chunk_pages=2).plan(decode_step(entries, q_starts))
    want = shared_plan(entries, 2, 8, 2)
    assert np.array_equal(plan.jobs, want.jobs) and np.array_equal(plan.slot_start, want.slot_start)


DOCS = [[(k * i + k) % 250 + 10 for i in range(n)] for k, n in ((7, 21), (11, 18), (13, 5))]
REQUESTS = [([0, 1], [40, 41]), ([1, 0], [50]), ([0, 2], [60, 61, 62])]


def lazy_outputs(shared_decode: bool, **kw) -> tuple[list[list[int]], list[list[float]], object]:
    """Greedy tokens and their logprobs of REQUESTS, and the engine's model runner."""
    llm = LLM(model="tiny", mode="lazy", page_size=PAGE, progress=False, shared_decode=shared_decode, **kw)
    outs = llm.generate(
        prompt_token_ids=[p for _, p in REQUESTS],
        document_token_ids=[[DOCS[d] for d in docs] for docs, _ in REQUESTS],
        sampling_params=SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, logprobs=1),
    )
    tokens = [o.outputs[0].token_ids for o in outs]
    logprobs = [[lp[t] for t, lp in zip(o.outputs[0].token_ids, o.logprobs)] for o in outs]
    return tokens, logprobs, llm.engine.executor.runner


class DecodeByTriton(TritonBackend):
    """Prefill steps by the reference (the interpreted prefill kernels would take a minute), decode by Triton."""

    def attend(self, layer, q, k, v, fb):
        if fb.is_decode:
            return super().attend(layer, q, k, v, fb)
        return ReferenceBackend.attend(self, layer, q, k, v, fb)


def test_engine_greedy_outputs_equal_with_and_without(monkeypatch):
    """The tiny model on the CPU, decode steps by the Triton kernels (interpreted): lazy-mode requests sharing
    documents decode the same tokens with shared_decode on and off, and decode steps did carry plans."""
    carried = []
    monkeypatch.setattr(
        model_runner, "make_backend", lambda kv, tables, scale, det=False: DecodeByTriton(kv, tables, scale)
    )
    to_device = model_runner.ModelRunner.to_device

    def recording(self, step):
        ids, fb = to_device(self, step)
        carried.append(fb.shared is not None)
        return ids, fb

    monkeypatch.setattr(model_runner.ModelRunner, "to_device", recording)
    on, on_lp, runner_on = lazy_outputs(True)
    plans = sum(carried)
    carried.clear()
    off, off_lp, runner_off = lazy_outputs(False)
    assert runner_on.shared is not None and runner_off.shared is None
    assert plans == 2 and not any(carried)  # both decode steps (3 tokens: 1 from the prefill)
    assert on == off
    np.testing.assert_allclose(on_lp, off_lp, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_gpu_engine_greedy_outputs_equal_with_and_without(cuda_graphs):
    """The tiny model on the GPU (fp32): the same greedy tokens with shared_decode on and off; with graphs, decode
    steps replayed the plan graphs."""
    kw = dict(device="cuda", dtype="float32", kv_cache_gb=0.25, cuda_graphs=cuda_graphs, max_num_seqs=16)
    on, on_lp, runner = lazy_outputs(True, **kw)
    off, off_lp, _ = lazy_outputs(False, **kw)
    assert on == off
    np.testing.assert_allclose(on_lp, off_lp, rtol=1e-4, atol=1e-5)
    if cuda_graphs:
        assert runner.graphs.shared_replays >= 1
