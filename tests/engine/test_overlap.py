"""Overlapped scheduling (engine/step_pipeline.py) changes nothing a client sees: the same streams of outputs (tokens,
logprobs, text, finish reasons) as the synchronous engine, under every mode, sampling kind, stop rule, arrival,
abort, preemption and failure; and the pools end as they would."""

from __future__ import annotations

import argparse

import pytest
import torch

from lazyattn import SamplingParams
from lazyattn.cli import build_parser, engine_options
from lazyattn.engine.config import EngineConfig
from lazyattn.engine.graph_inputs import FedBack
from lazyattn.engine.llm_engine import LLMEngine
from lazyattn.engine.prompt import from_token_ids
from lazyattn.errors import InvalidRequestError

DOCS = {"x": [5] * 20 + [6] * 7, "y": [(3 * i) % 200 + 9 for i in range(33)], "z": [11] * 18 + [12] * 9}
PROMPTS = {
    "a": (["x", "y"], [1, 2, 3]),
    "b": (["y", "z"], [1, 2, 4]),
    "c": (["z"], [7, 8]),
    "d": (["x"], [13, 14, 15, 16]),
    "e": (["y", "x", "z"], [20]),
}


def greedy(max_tokens: int = 8, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw)


def engine(overlap: bool, mode: str = "lazy", **kw) -> LLMEngine:
    config = EngineConfig(
        model="tiny", mode=mode, device="cpu", page_size=16, progress=False, async_scheduling=overlap, **kw
    )
    return LLMEngine(config)


def snapshot(out) -> tuple:
    return (
        out.finished,
        out.error,
        tuple(
            (
                c.index,
                c.text,
                tuple(c.token_ids),
                c.finish_reason,
                c.stop_reason,
                None if c.logprobs is None else tuple(map(_rounded, c.logprobs)),
            )
            for c in out.outputs
        ),
    )


def _rounded(entry: dict) -> tuple:
    # Rows batched with a different number of others may differ in the last bits (CPU GEMM blocking).
    return tuple(sorted((t, round(lp, 4)) for t, lp in entry.items()))


def drive(e: LLMEngine, script: dict[int, list[tuple]], calls: int = 300) -> dict[str, list[tuple]]:
    """Run the engine call by call; before call i, do script[i]: ("add", name, params) or ("abort", name).
    Returns each request's stream of output snapshots (what the server streams)."""
    streams: dict[str, list[tuple]] = {}
    last = max(script, default=0)
    for i in range(calls):
        for action, name, *rest in script.get(i, []):
            if action == "add":
                docs, prompt = PROMPTS[name[0]]
                e.add_request(name, from_token_ids(prompt, [DOCS[d] for d in docs]), rest[0])
            else:
                out = e.abort(name)
                if out is not None:
                    streams.setdefault(name, []).append(("aborted", snapshot(out)[2][0][3]))
        if i > last and not e.has_unfinished():
            return streams
        for out in e.step():
            streams.setdefault(out.request_id, []).append(snapshot(out))
    raise AssertionError("the engine did not finish")


def assert_clean(e: LLMEngine) -> None:
    """Idle: only cached documents hold pages, and none once the cache is cleared."""
    s = e.stats()
    assert s.running == 0 and s.waiting == 0 and not e.scheduler.ended and e.pipeline.in_flight is None
    assert s.pages_used == s.cache.pages_in_use
    e.cache.clear()
    assert e.pool.num_used == 0


def both(script, mode="lazy", **kw):
    sync, over = engine(False, mode, **kw), engine(True, mode, **kw)
    expected, got = drive(sync, script), drive(over, script)
    assert sync.pipeline.overlapped_steps == 0 and over.pipeline.overlapped_steps > 0
    return expected, got, sync, over


SAMPLING = {
    "a1": greedy(9, logprobs=3),
    "b1": SamplingParams(max_tokens=7, temperature=0.9, top_p=0.9, seed=11, logprobs=1, ignore_eos=True),
    "c1": SamplingParams(max_tokens=6, temperature=1.2, top_k=20, seed=5, n=2, ignore_eos=True),
    "d1": greedy(12, min_tokens=4),
    "e1": greedy(3),
}


@pytest.mark.parametrize("mode", ["lazy", "block", "prefix", "full"])
def test_streams_match_the_synchronous_engine(mode):
    """Greedy with logprobs, seeded top-p and top-k (n = 2), min_tokens, max_tokens; requests arriving while
    others decode."""
    script = {
        0: [("add", "a1", SAMPLING["a1"]), ("add", "b1", SAMPLING["b1"])],
        3: [("add", "c1", SAMPLING["c1"])],
        6: [("add", "d1", SAMPLING["d1"]), ("add", "e1", SAMPLING["e1"])],
    }
    expected, got, sync, over = both(script, mode)
    assert got == expected
    assert all(s[-1][0] for s in got.values())  # every request finished
    assert over.stats().decoded_tokens >= sync.stats().decoded_tokens
    assert_clean(sync)
    assert_clean(over)


def test_stop_tokens_and_strings_end_where_the_synchronous_engine_does():
    """A sequence ended by a stop token or a stop string (known only once its token is read) is in the step
    already launched: its extra token is dropped."""
    free = drive(engine(False), {0: [("add", "a1", greedy(12))]})["a1"][-1][2][0]
    text, tokens = free[1], free[2]
    stop_id = tokens[3]
    script = {
        0: [
            ("add", "a1", greedy(12, stop_token_ids=[stop_id])),
            ("add", "b1", greedy(12)),
            ("add", "c1", greedy(12, stop=[text[4:6]] if len(text) >= 6 else [])),
        ]
    }
    expected, got, _, over = both(script)
    assert got == expected
    assert got["a1"][-1][2][0][2] == tokens[: tokens.index(stop_id) + 1]
    assert got["a1"][-1][2][0][3] == "stop"
    assert_clean(over)


def test_pages_of_a_sequence_ended_in_flight_wait_for_the_step_after_it():
    stop_id = drive(engine(False), {0: [("add", "a1", greedy(12))]})["a1"][-1][2][0][2][2]
    e = engine(True)
    e.add_request("a1", from_token_ids([1, 2, 3], [DOCS["x"], DOCS["y"]]), greedy(12, stop_token_ids=[stop_id]))
    e.add_request("b1", from_token_ids([1, 2, 4], [DOCS["y"], DOCS["z"]]), greedy(12))
    for _ in range(10):
        outs = {o.request_id: o for o in e.step()}
        if "a1" in outs and outs["a1"].finished:
            break
    ended = e.scheduler.ended
    assert [s.request_id for s in ended] == ["a1"]  # the step launched before a1's stop token was read has it
    assert e.pipeline.in_flight is not None and any(w.seq is ended[0] for w in e.pipeline.in_flight.plan.works)
    pages = list(ended[0].run.pages)
    assert pages and all(e.pool._in_use[p] for p in pages)
    e.step()
    assert not e.scheduler.ended and not any(e.pool._in_use[p] for p in pages)
    drive(e, {})
    assert_clean(e)


def test_the_last_request_ended_by_a_stop_token_leaves_an_idle_engine_clean():
    """The step launched before the last request's stop token was read is retired once that request ends: an idle
    engine has nothing in flight and its ended sequences' pages are back, so reset_cache (`lazyattn eval
    --fidelity` between passes) starts from an empty pool, and a pass after it answers as the first did."""
    free = drive(engine(False), {0: [("add", "a1", greedy(12)), ("add", "b1", greedy(12))]})
    stops = {name: free[name][-1][2][0][2][3] for name in ("a1", "b1")}
    e = engine(True)
    passes = []
    for _ in range(3):
        script = {0: [("add", name, greedy(12, stop_token_ids=[stops[name]])) for name in ("a1", "b1")]}
        passes.append(drive(e, script))
        assert e.pipeline.in_flight is None and not e.scheduler.ended
        assert e.pool.num_used == e.cache.stats().pages_in_use
        e.reset_cache()
        assert e.pool.num_used == 0 and len(e.cache) == 0
    assert passes[0] == passes[1] == passes[2]
    assert all(passes[0][name][-1][2][0][3] == "stop" for name in ("a1", "b1"))


def test_aborts_mid_stream_leave_the_others_unchanged():
    seeded = SamplingParams(max_tokens=20, temperature=1.0, seed=3, n=2, ignore_eos=True)
    script = {
        0: [("add", "a1", greedy(20)), ("add", "b1", greedy(20)), ("add", "c1", seeded)],
        5: [("abort", "b1")],
        7: [("abort", "c1")],
        9: [("add", "d1", greedy(6))],
    }
    expected, got, _, over = both(script)
    for name in ("a1", "d1"):
        assert got[name] == expected[name]
    for name in ("b1", "c1"):  # a client sees at most one step fewer before the abort, never other tokens
        assert got[name][-1] == expected[name][-1] == ("aborted", "abort")
        assert expected[name][: len(got[name]) - 1] == got[name][:-1]
    assert_clean(over)


def test_aborting_everything_retires_the_step_in_flight():
    e = engine(True)
    e.add_request("a1", from_token_ids([1, 2, 3], [DOCS["x"]]), greedy(20))
    for _ in range(4):
        e.step()
    assert e.pipeline.in_flight is not None
    e.abort("a1")
    assert e.pipeline.in_flight is None and not e.has_unfinished()
    assert_clean(e)


@pytest.mark.parametrize("mode", ["lazy", "prefix"])
def test_a_tight_pool_preempts_and_keeps_the_tokens(mode):
    page_bytes = engine(False, mode).stats().page_bytes
    tight = dict(kv_cache_gb=16 * page_bytes / 2**30, max_num_batched_tokens=40)
    script = {
        0: [("add", name + "1", greedy(32)) for name in "abc"],
        2: [("add", "d1", greedy(32))],
        4: [("add", "e1", greedy(32))],
    }
    expected, got, sync, over = both(script, mode, **tight)
    assert got == expected
    assert sync.stats().preemptions > 0 and over.stats().preemptions > 0
    assert_clean(over)


def test_a_failing_request_ends_alone_and_the_others_go_on():
    """A forward pass that fails on one request, in an overlapped step too: that request ends with its error,
    the others are unchanged."""

    def poison(e):
        real = e.executor.run

        def run(batch):
            # from the step that feeds b1's third token on: a row of the run, the same in both engines
            if any(
                w.seq is not None and w.seq.request_id == "b1" and w.lo >= w.run.prefill_len + 2 for w in batch.works
            ):
                raise RuntimeError("poisoned part")
            return real(batch)

        e.executor.run = run

    script = {0: [("add", "a1", greedy(10)), ("add", "b1", greedy(10)), ("add", "c1", greedy(10))]}
    sync, over = engine(False), engine(True)
    poison(sync)
    poison(over)
    expected, got = drive(sync, script), drive(over, script)
    assert got == expected
    assert got["b1"][-1][1] is not None and "poisoned part" in got["b1"][-1][1]
    assert got["a1"][-1][2][0][3] == "length" and len(got["a1"][-1][2][0][2]) == 10
    assert over.pipeline.overlapped_steps > 0
    assert_clean(over)


def test_chunked_prefill_reorders_the_fed_back_rows():
    """A sequence still prefilling in chunks is scheduled after the decoding ones, so once it decodes too the
    next step's rows come in another order than the previous step's samples."""
    script = {0: [("add", "e1", greedy(10))], 1: [("add", "a1", greedy(10))]}
    expected, got, _, over = both(script, max_num_batched_tokens=24)
    assert got == expected
    assert_clean(over)


def test_fed_back_tokens_land_in_their_rows():
    source = torch.tensor([70, 71, 72, 73])
    ids = torch.full((5,), -1)
    FedBack(source, [2, 0, 3]).write(ids)
    assert ids.tolist() == [72, 70, 73, -1, -1]
    FedBack(source, [0, 1]).write(ids)
    assert ids.tolist() == [70, 71, 73, -1, -1]


def test_the_option_defaults_to_where_it_helps():
    assert not EngineConfig(device="cpu").async_scheduling_on
    assert EngineConfig(device="cuda").async_scheduling_on
    assert EngineConfig(device="cpu", async_scheduling=True).async_scheduling_on
    assert not EngineConfig(device="cuda", async_scheduling=False).async_scheduling_on
    assert EngineConfig(device="cuda", tensor_parallel_size=2).async_scheduling_on
    assert not EngineConfig(device="cpu", tensor_parallel_size=2).async_scheduling_on
    with pytest.raises(InvalidRequestError, match="async_scheduling"):
        EngineConfig(async_scheduling="yes")


@pytest.mark.parametrize(
    "flag, value", [([], None), (["--async-scheduling"], True), (["--no-async-scheduling"], False)]
)
def test_the_cli_flag_reaches_the_engine(flag, value):
    args = build_parser().parse_args(["generate", "hello", "--device", "cpu"] + flag)
    assert isinstance(args, argparse.Namespace) and engine_options(args)["async_scheduling"] is value
