"""The process of one rank other than the driver: it loads its shard, builds its own KV pool and runner (same page
count as every rank), then runs whatever the driver sends, in the driver's order, until told to stop.

Messages from the driver: ("build", max_model_len), ("warm_up", None), ("step", packed StepInputs, send time,
fed-back rows), ("stop", None) (executor/channel.py: how a step travels fast; executor/fed_back.py: the fed-back
rows' ids). Replies: ("hello", None) once started, ("ready", num_pages), ("done", None) after a warm-up, ("error",
traceback) before exiting on any failure. Steps get no reply: the collectives of the forward pass keep the ranks
in step.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection

import torch

from lazyattn import envs
from lazyattn.engine.config import EngineConfig
from lazyattn.engine.executor.base import load_engine_model
from lazyattn.engine.executor.channel import SPIN_S, DispatchTrace, receive, unpack_step
from lazyattn.engine.executor.fed_back import FedBackRelay
from lazyattn.engine.model_runner import ModelRunner
from lazyattn.parallel.group import TensorParallelGroup, connect_store, join, leave


def rank_device(config: EngineConfig, rank: int) -> torch.device:
    return torch.device("cuda", rank) if config.device.startswith("cuda") else torch.device("cpu")


def build_runner(
    model, config: EngineConfig, max_model_len: int, device: torch.device, tp: TensorParallelGroup
) -> ModelRunner:
    """This rank's runner. Page ids are decided by the driver for every rank, so every pool holds the same count:
    the fewest any rank can hold (kv_cache_gb is the budget of all ranks together)."""
    import dataclasses

    from lazyattn.cache.page_pool import bytes_per_page
    from lazyattn.engine.model_runner import pool_pages

    mc = model.config  # this rank's shard: its kv heads
    page_bytes = bytes_per_page(mc.num_layers, mc.num_kv_heads, mc.head_dim, config.page_size, config.kv_torch_dtype)
    share = (
        config if config.kv_cache_gb is None else dataclasses.replace(config, kv_cache_gb=config.kv_cache_gb / tp.size)
    )
    num_pages = tp.min(pool_pages(share, device, page_bytes), device)
    return ModelRunner(model, mc, config, max_model_len, device, num_pages=num_pages)


def main(rank: int, size: int, config: EngineConfig, store_port: int, conn: Connection) -> None:
    """Entry point of a spawned worker process."""
    _exit_with_parent()
    envs.activate(config.env)  # the driver's settings: this process's kernels launch as the driver's do
    # LAZYATTN_TP_STACKS_AFTER_S: seconds after which a starting worker prints every thread's stack to stderr, and
    # again every as many seconds, until its runner is built (0: never). For a start that hangs.
    stacks_after = config.env.tp_stacks_after_s
    if stacks_after > 0:  # a start that hangs says where, on stderr (the driver has pytest's faulthandler_timeout)
        faulthandler.dump_traceback_later(stacks_after, repeat=True)
    try:
        device = rank_device(config, rank)
        if device.type == "cpu":
            torch.set_num_threads(1)  # the driver's process has the others
        conn.send(("hello", None))
        tp = join(connect_store(store_port, size), rank, size, device, config.env)
        model, _ = load_engine_model(config, device, tp)
        runner = relay = None
        trace = DispatchTrace(rank, config.env.tp_trace)
        spin_s = SPIN_S if device.type == "cuda" else 0.0  # a CPU worker's core runs the model
        while True:
            command, arg, *extra = receive(conn, spin_s)
            if command == "step":
                arrived = time.perf_counter()
                step = unpack_step(arg)
                sent, fed_rows = extra
                if fed_rows:  # overlapped scheduling: the input tokens come from the driver's GPU
                    step.fed_back = relay.share(fed_rows)
                runner.execute(step)
                if trace.on:
                    trace.add(sent, arrived, time.perf_counter())
            elif command == "build":
                runner = build_runner(model, config, arg, device, tp)
                relay = FedBackRelay(config.max_num_seqs, device)
                faulthandler.cancel_dump_traceback_later()
                conn.send(("ready", runner.num_pages))
            elif command == "warm_up":
                runner.warm_up()
                conn.send(("done", None))
            elif command == "stop":
                trace.write()
                break
    except EOFError:  # the driver is gone
        os._exit(1)
    except BaseException:
        try:
            conn.send(("error", f"rank {rank}: {traceback.format_exc()}"))
        finally:
            os._exit(1)  # no clean-up: a peer may be blocked in a collective with us
    if device.type == "cuda":
        # Exit without NCCL's teardown: aborting the communicators here waited >10 s for the driver, which aborts
        # its own at the same time (two H200s, graphs with captured collectives). Nothing is in flight, and the
        # driver's abort does not need this rank.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    leave()


def _exit_with_parent() -> None:
    """A worker must not outlive its driver (killed, say, while this rank waits in a collective)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="lazyattn-parent-watch").start()
