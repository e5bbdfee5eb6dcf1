"""Tensor parallelism on the CPU (gloo, a driver and one worker process): two ranks give the one-rank engine's
greedy tokens and logits in every mode and for every supported architecture; bad sizes, a dead worker and
shutdown behave."""

from __future__ import annotations

import gc
import json

import pytest
import torch

from lazyattn import LLM, SamplingParams
from lazyattn.engine.prompt import RenderedPrompt
from lazyattn.errors import CheckpointError, InvalidRequestError, TensorParallelError
from tests.engine.test_engine import DOCS, REQUESTS, greedy, make_llm
from tests.engine.test_engine_gpu import capture_logits
from tests.model.checkpoints import SMALL

TIGHT = 1e-5  # fp32: only the order of the sums differs between one and two ranks


def run(llm: LLM) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy tokens of REQUESTS and every logits row the engine sampled from."""
    seen = capture_logits(llm)
    try:
        outs = llm.generate(
            prompt_token_ids=[p for _, p in REQUESTS],
            document_token_ids=[[DOCS[d] for d in docs] for docs, _ in REQUESTS],
            sampling_params=greedy(),
        )
    finally:
        llm.shutdown()
    return [o.token_ids for o in outs], seen


def assert_same(one: tuple, two: tuple) -> None:
    assert two[0] == one[0]
    assert len(two[1]) == len(one[1])
    for a, b in zip(one[1], two[1]):
        assert a.shape == b.shape
        assert torch.allclose(a, b, rtol=0, atol=TIGHT)


@pytest.mark.parametrize("mode", ["lazy", "block", "prefix", "full"])
def test_two_ranks_match_one_every_mode(checkpoint, mode):
    """Llama 3.1 (llama3 RoPE, a checkpoint in several safetensors shards: each rank reads its slices)."""
    one = run(make_llm(checkpoint, "llama31", mode))
    two = run(make_llm(checkpoint, "llama31", mode, tensor_parallel_size=2))
    assert_same(one, two)


@pytest.mark.parametrize(
    ("name", "mode"),
    [("qwen2", "block"), ("qwen3", "lazy"), ("mistral", "prefix"), ("llama_bias", "lazy"), ("tied", "full")],
)
def test_two_ranks_match_one_every_architecture(checkpoint, name, mode):
    """Qwen2 (q/k/v biases), Qwen3 (per-head q/k norms, head_dim != hidden / heads), Mistral, Llama with o/MLP
    biases (added once after the all-reduce), tied embeddings (the vocabulary-parallel embedding is the LM head)."""
    one = run(make_llm(checkpoint, name, mode))
    two = run(make_llm(checkpoint, name, mode, tensor_parallel_size=2))
    assert_same(one, two)


@pytest.fixture(scope="module")
def odd_vocab(tmp_path_factory):
    """A config.json only (random weights) whose vocabulary does not split in two: the last rank's block is padded."""
    d = tmp_path_factory.mktemp("odd-vocab")
    cfg = {
        **SMALL,
        "vocab_size": 301,
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 2,
        "torch_dtype": "float32",
    }
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_random_weights_shard_the_one_rank_model(odd_vocab):
    """Random weights drawn per rank are the one-rank model's, cut (and the padded vocabulary rows never win)."""
    prompt = RenderedPrompt(segments=[[1, 5, 6, 7], list(range(250, 301))], final=[300, 299, 12, 13])
    results = []
    for size in (1, 2):
        llm = LLM(
            model=str(odd_vocab),
            device="cpu",
            page_size=16,
            progress=False,
            random_weights=True,
            tensor_parallel_size=size,
        )
        try:
            logits = capture_logits(llm)
            llm.engine.add_request("r", prompt, greedy())
            tokens = []
            while llm.engine.has_unfinished():
                for out in llm.engine.step():
                    tokens = out.token_ids
            results.append((tokens, logits))
        finally:
            llm.shutdown()
    (tokens1, logits1), (tokens2, logits2) = results
    assert tokens2 == tokens1
    assert all(b.shape == (1, 301) for b in logits2)
    assert all(torch.allclose(a, b, rtol=0, atol=TIGHT) for a, b in zip(logits1, logits2))


def test_sizes_that_do_not_divide_are_refused(checkpoint):
    with pytest.raises(InvalidRequestError, match="num_attention_heads"):
        make_llm(checkpoint, "llama", "lazy", tensor_parallel_size=3)  # 4 query heads
    with pytest.raises(InvalidRequestError, match="num_key_value_heads"):
        make_llm(checkpoint, "llama", "lazy", tensor_parallel_size=4)  # 4 query heads, 2 kv heads
    with pytest.raises(InvalidRequestError, match="tensor_parallel_size"):
        make_llm(checkpoint, "llama", "lazy", tensor_parallel_size=0)
    with pytest.raises(InvalidRequestError, match="host_cache_gb"):  # the host tier copies one rank's pool only
        make_llm(checkpoint, "llama", "lazy", tensor_parallel_size=2, host_cache_gb=1.0)


def test_more_ranks_than_gpus_are_refused(monkeypatch):
    """Checked before any process starts (the CPU machine pretends to have one GPU)."""
    from lazyattn.engine.config import EngineConfig
    from lazyattn.engine.executor.tensor_parallel import TensorParallelExecutor

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(InvalidRequestError, match="needs 2 GPUs; 1 visible"):
        TensorParallelExecutor(EngineConfig(model="tiny", device="cuda", tensor_parallel_size=2), torch.device("cuda"))


def test_a_dead_worker_is_an_error_not_a_hang():
    llm = LLM(model="tiny", device="cpu", progress=False, tensor_parallel_size=2)
    try:
        params = greedy()
        first = llm.generate(prompt_token_ids=[[256, 10, 11, 12]], sampling_params=params)[0].token_ids
        assert len(first) == params.max_tokens
        worker = llm.engine.executor.procs[0]
        worker.kill()
        worker.join()
        with pytest.raises(TensorParallelError, match="worker 1"):
            llm.generate(prompt_token_ids=[[256, 10, 11, 12]], sampling_params=params)
        with pytest.raises(TensorParallelError):  # and stays failed
            llm.generate(prompt_token_ids=[[256, 10, 11, 12]], sampling_params=params)
    finally:
        llm.shutdown()


def test_a_failed_step_on_the_driver_ends_the_engine():
    """No per-request isolation across ranks: after a failed step they may be out of step."""
    llm = LLM(model="tiny", device="cpu", progress=False, tensor_parallel_size=2)
    try:
        local = llm.engine.executor.runner
        execute = local.execute

        def failing(step):
            execute(step)  # every rank ran the step; only the driver's side fails after it
            raise RuntimeError("boom")

        local.execute = failing
        with pytest.raises(TensorParallelError, match="driver .rank 0. failed in a step: RuntimeError: boom"):
            llm.generate(prompt_token_ids=[[256, 10, 11]], sampling_params=greedy())
    finally:
        llm.shutdown()
    assert [p.exitcode for p in llm.engine.executor.procs] == [0]


def test_shutdown_stops_the_workers_and_frees_the_group():
    with LLM(model="tiny", device="cpu", progress=False, tensor_parallel_size=2) as llm:
        procs = list(llm.engine.executor.procs)
        assert all(p.is_alive() for p in procs)
    assert [p.exitcode for p in procs] == [0]
    # A dropped engine (no shutdown) stops its workers when collected, so a new one can start.
    llm = LLM(model="tiny", device="cpu", progress=False, tensor_parallel_size=2)
    procs = list(llm.engine.executor.procs)
    del llm
    gc.collect()
    assert all(not p.is_alive() for p in procs)
    with LLM(model="tiny", device="cpu", progress=False, tensor_parallel_size=2) as llm:
        assert llm.generate(prompt_token_ids=[[256, 10]], sampling_params=greedy())[0].token_ids


def test_a_load_failure_leaves_no_worker(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**SMALL, "architectures": ["LlamaForCausalLM"]}))
    (tmp_path / "model.safetensors").write_bytes(b"not safetensors")
    import multiprocessing

    with pytest.raises(CheckpointError):
        LLM(model=str(tmp_path), device="cpu", progress=False, tensor_parallel_size=2)
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("lazyattn-tp")]


@pytest.mark.parametrize("command", [["generate", "hi"], ["serve"], ["bench"], ["eval"], ["demo"]])
def test_every_engine_command_takes_the_size(command):
    from lazyattn.cli import build_parser, engine_options

    args = build_parser().parse_args([*command, "--tensor-parallel-size", "2"])
    assert args.tensor_parallel_size == 2
    if command[0] != "demo":
        assert engine_options(args)["tensor_parallel_size"] == 2


def test_generate_command_on_two_ranks(capsys):
    from lazyattn.cli import main

    outputs = []
    for size in ("1", "2"):
        assert (
            main(
                [
                    "generate",
                    "Who wrote it?",
                    "-d",
                    "a document",
                    "--model",
                    "tiny",
                    "--device",
                    "cpu",
                    "--max-tokens",
                    "6",
                    "--json",
                    "--tensor-parallel-size",
                    size,
                ]
            )
            == 0
        )
        outputs.append(json.loads(capsys.readouterr().out)["token_ids"])
    assert outputs[1] == outputs[0]
    assert len(outputs[0]) == 6


@pytest.mark.parametrize("mode", ["lazy", "block"])
def test_two_ranks_overlapped_match_one_synchronous(mode):
    """Overlapped scheduling on two ranks (the fed-back ids broadcast from the driver, engine/executor/fed_back.py)
    streams what one synchronous rank does: greedy with logprobs, seeded sampling, n = 2, arrivals while others
    decode, and a stop token that ends one sequence while the next step is in flight (later steps feed back a subset
    of rows)."""
    from tests.engine.test_overlap import SAMPLING, drive, engine

    script = {
        0: [("add", "a1", SAMPLING["a1"]), ("add", "b1", SAMPLING["b1"])],
        3: [("add", "c1", SAMPLING["c1"])],
        6: [("add", "d1", SAMPLING["d1"]), ("add", "e1", SAMPLING["e1"])],
    }
    one = engine(False, mode)
    expected = drive(one, script)
    stop_at = expected["a1"][-1][2][0][2][4]  # a1's fifth token ends it early
    script[0][0] = (
        "add",
        "a1",
        SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True, logprobs=3, stop_token_ids=[stop_at]),
    )
    expected = drive(engine(False, mode), script)
    two = engine(True, mode, tensor_parallel_size=2)
    try:
        got = drive(two, script)
        overlapped = two.pipeline.overlapped_steps
    finally:
        two.shutdown()
    assert got == expected
    assert overlapped > 0
    assert expected["a1"][-1][2][0][3] == "stop"
