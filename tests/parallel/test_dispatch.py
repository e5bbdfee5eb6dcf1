"""The all-reduce route rule (parallel/all_reduce.py) and the step messages (engine/executor/channel.py), on the CPU."""

from __future__ import annotations

import multiprocessing as mp
import socket

import pytest
import torch

from lazyattn import LLM
from lazyattn.engine.executor.channel import encode, pack_step, receive, unpack_step
from lazyattn.engine.graph_inputs import StepInputs
from lazyattn.envs import read_env
from lazyattn.errors import InvalidRequestError
from lazyattn.kernels.paged import EntryPages
from lazyattn.parallel.all_reduce import BUFFER_BYTES, ONE_SHOT_MAX_BYTES, route
from lazyattn.parallel.group import connect_store, serve_store

BF16 = 2


@pytest.mark.parametrize(
    ("rows", "hidden", "expected"),
    [
        (1, 4096, "one_shot"),  # an 8B decode row: 8 KiB
        (16, 8192, "one_shot"),  # a 70B batch-16 decode step
        (128, 4096, "one_shot"),  # 1 MiB, the one-shot limit: the largest 8B prefill bucket
        (129, 4096, "two_shot"),  # just past it
        (128, 8192, "two_shot"),  # the largest prefill bucket at 70B: 2 MiB
        (512, 8192, "two_shot"),  # 8 MiB: the buffer, exactly
        (513, 8192, "nccl"),  # a long prefill chunk: past the buffer
        (8192, 4096, "nccl"),
    ],
)
def test_small_messages_take_symmetric_memory_large_ones_nccl(rows, hidden, expected):
    assert ONE_SHOT_MAX_BYTES == 2**20 and BUFFER_BYTES == 8 * 2**20  # the sizes the table above assumes
    assert route(rows * hidden * BF16, torch.bfloat16, symmetric=True) == expected
    assert route(rows * hidden * BF16, torch.bfloat16, symmetric=False) == "nccl"  # gloo, or none here


def test_messages_the_kernels_cannot_take_go_to_nccl():
    assert route(0, torch.bfloat16, symmetric=True) == "nccl"
    assert route(4094 * BF16, torch.bfloat16, symmetric=True) == "nccl"  # not a multiple of 16 bytes
    assert route(4096 * BF16, torch.bfloat16, symmetric=True) == "one_shot"
    assert route(4096 * 4, torch.float32, symmetric=True) == "one_shot"
    assert route(4096 * 2, torch.float16, symmetric=True) == "nccl"  # built for fp32 and bf16 only


def test_the_setting_is_read_and_checked():
    assert read_env({}).tp_allreduce == "auto"
    assert read_env({"LAZYATTN_TP_ALLREDUCE": " NCCL "}).tp_allreduce == "nccl"
    with pytest.raises(InvalidRequestError, match="LAZYATTN_TP_ALLREDUCE='ring': expected one of auto, nccl"):
        read_env({"LAZYATTN_TP_ALLREDUCE": "ring"})


def test_the_probe_timeout_is_read_and_checked(monkeypatch):
    assert read_env({}).tp_probe_timeout_s == 60
    assert read_env({"LAZYATTN_TP_PROBE_TIMEOUT_S": " 2.5 "}).tp_probe_timeout_s == 2.5
    for bad in ("soon", "0", "-3", "nan"):
        with pytest.raises(InvalidRequestError, match="LAZYATTN_TP_PROBE_TIMEOUT_S=.*seconds > 0"):
            read_env({"LAZYATTN_TP_PROBE_TIMEOUT_S": bad})
    monkeypatch.setenv("LAZYATTN_TP_PROBE_TIMEOUT_S", "soon")
    with pytest.raises(InvalidRequestError, match="LAZYATTN_TP_PROBE_TIMEOUT_S"):  # before any process starts
        LLM(model="tiny", device="cpu", progress=False, tensor_parallel_size=2)
    assert not [p for p in mp.active_children() if p.name.startswith("lazyattn-tp")]


@pytest.mark.parametrize("value", ["symm_mem", "ring"])
def test_a_setting_the_cpu_cannot_honour_is_refused_before_start(monkeypatch, value):
    monkeypatch.setenv("LAZYATTN_TP_ALLREDUCE", value)
    with pytest.raises(InvalidRequestError, match="LAZYATTN_TP_ALLREDUCE"):
        LLM(model="tiny", device="cpu", progress=False, tensor_parallel_size=2)
    assert not [p for p in mp.active_children() if p.name.startswith("lazyattn-tp")]


def test_a_step_survives_its_message():
    step = StepInputs(
        [5, 6, 7],
        [10, 11, 3],
        [170, 171, 51],
        [
            EntryPages([10, 2], [0, -7], [16, 2]),
            EntryPages([3, 4, 9], [5, 5, 0], [16, 16, 1], firsts=[0, 4, 0]),
        ],
        [2, 1],
        [10, 3],
        [1, 2],
        False,
        copy_src=[1, 2],
        copy_dst=[8, 9],
        copy_deltas=[-3, -3],
    )
    a, b = mp.Pipe()
    a.send_bytes(encode(("step", pack_step(step), 1.5)))
    command, packed, sent = receive(b, spin_s=0.01)
    assert (command, sent) == ("step", 1.5)
    got = unpack_step(packed)
    assert got == step
    assert got.entries[1].firsts == [0, 4, 0] and got.entries[0].firsts is None


def test_receive_blocks_after_spinning_and_sees_the_driver_go():
    a, b = mp.Pipe()
    a.send(("stop", None))  # what the driver's finalizer sends: a plain Connection.send
    assert receive(b, spin_s=0.0) == ("stop", None)
    a.close()
    with pytest.raises(EOFError):
        receive(b, spin_s=0.01)


def test_the_rendezvous_store_listens_on_loopback_only():
    """The driver's TCP store takes connections on 127.0.0.1 and refuses them on another loopback address, which
    a store listening on every interface would accept (Linux routes all of 127/8 to the loopback device)."""
    store = serve_store(2)
    with socket.create_connection(("127.0.0.1", store.port), timeout=5):
        pass
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", store.port), timeout=5)
    client = connect_store(store.port, 2)
    client.set("from a worker", "seen")
    assert store.get("from a worker") == b"seen"
