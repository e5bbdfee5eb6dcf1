"""TensorParallelExecutor: the engine's executor when `tensor_parallel_size` > 1 (docs/design.md, "Tensor
parallelism").

The driver is rank 0, in the user's process: the engine's scheduler, document cache and sampler run there once.
Each step is decided there, turned into StepInputs (packed ids, positions, slots, page tables, copies) and sent to
every other rank's worker process (executor/worker.py), which runs the same forward pass on its shard with its own
KV pool; the collectives inside the model sum the partial results, and the driver samples from the gathered
logits. Control messages go through one pipe per worker; tensors never do (executor/channel.py: a step's message
is pickled once, as plain lists, and the workers spin on their pipes between steps). With overlapped scheduling a
decode step's input tokens are still on the driver's GPU when it is sent: they follow by broadcast
(executor/fed_back.py).

A worker that dies is noticed by a watcher thread, which aborts the process group so that a rank blocked in a
collective returns; the next (or current) step then raises TensorParallelError with the worker's traceback.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import multiprocessing as mp
import os
import sys
import threading
import time
import traceback
import weakref
from multiprocessing.connection import Connection, wait

import torch

from lazyattn.engine.batch import StepPlan
from lazyattn.engine.config import EngineConfig
from lazyattn.engine.executor import worker
from lazyattn.engine.executor.base import Executor, load_engine_model
from lazyattn.engine.executor.channel import DispatchTrace, encode, pack_step
from lazyattn.engine.executor.fed_back import FedBackRelay
from lazyattn.errors import InvalidRequestError, TensorParallelError
from lazyattn.model.loader import model_config
from lazyattn.model.sharding import check_divisible
from lazyattn.parallel.all_reduce import SETTING_ENV
from lazyattn.parallel.group import NCCL_ENV, join, leave, serve_store

logger = logging.getLogger("lazyattn.parallel")
START_TIMEOUT_S = 600.0  # a worker's start: importing torch, then loading its shard (70B: a minute or so)
STOP_TIMEOUT_S = 10.0


class TensorParallelExecutor(Executor):
    """Loads the driver's shard and starts the workers (construction); `build` has every rank build its runner."""

    def __init__(self, config: EngineConfig, device: torch.device) -> None:
        size = config.tensor_parallel_size
        self.size = size
        self.config = config
        check_divisible(model_config(config.model), size)
        # Bad settings raised when the config read them (lazyattn/envs.py), before any process starts.
        if config.env.tp_allreduce == "symm_mem" and device.type != "cuda":
            raise InvalidRequestError(f"{SETTING_ENV}=symm_mem needs CUDA GPUs", SETTING_ENV)
        if device.type == "cuda":
            visible = torch.cuda.device_count()
            if size > visible:
                raise InvalidRequestError(
                    f"tensor_parallel_size {size} needs {size} GPUs; {visible} visible", "tensor_parallel_size"
                )
            if device.index not in (None, 0):
                raise InvalidRequestError(
                    "with tensor parallelism ranks run on GPUs 0 … N-1: pass device 'cuda' "
                    "(CUDA_VISIBLE_DEVICES picks the GPUs)",
                    "device",
                )
        if torch.distributed.is_initialized():
            gc.collect()  # an engine dropped without shutdown leaves the group when it is collected
        if torch.distributed.is_initialized():
            raise InvalidRequestError(
                "another tensor-parallel engine is running in this process: shut it down "
                "first (LLM.shutdown, or a `with LLM(...)` block)",
                "tensor_parallel_size",
            )
        self.device = worker.rank_device(config, 0)
        self._failure: str | None = None
        self._stopping = False
        self._store = serve_store(size)
        for key, value in NCCL_ENV.items():
            os.environ.setdefault(key, value)  # the workers inherit it
        ctx = mp.get_context("spawn")  # CUDA cannot be used in a forked child
        self.conns: list[Connection] = []
        self.procs: list[mp.process.BaseProcess] = []
        self._group: list = []  # the process group this engine made, once made (the finalizer leaves only it)
        self._stopper = weakref.finalize(self, _stop, self.procs, self.conns, self._group)
        try:
            for rank in range(1, size):
                parent, child = ctx.Pipe()
                proc = ctx.Process(
                    target=worker.main,
                    args=(rank, size, config, self._store.port, child),
                    daemon=True,
                    name=f"lazyattn-tp-{rank}",
                )
                proc.start()
                child.close()
                self.conns.append(parent)
                self.procs.append(proc)
            self._expect("hello")
            self.tp = join(self._store, 0, size, self.device, config.env)
            self._group.append(torch.distributed.group.WORLD)
            threading.Thread(
                target=_watch, args=(weakref.ref(self), list(self.procs)), daemon=True, name="lazyattn-tp-watch"
            ).start()
            self.model, self.model_config = load_engine_model(config, self.device, self.tp)
        except BaseException:
            self.shutdown()
            raise
        self.local = None
        self._trace = DispatchTrace(0, config.env.tp_trace)

    def build(self, max_model_len: int) -> None:
        """Every rank builds its KV pool (the same page count) and its runner."""
        try:
            self._send(("build", max_model_len))
            self.local = worker.build_runner(self.model, self.config, max_model_len, self.device, self.tp)
            self.relay = FedBackRelay(self.config.max_num_seqs, self.device)
            counts = self._expect("ready")
        except BaseException:
            self.shutdown()
            raise
        assert all(n == self.local.num_pages for n in counts), "ranks disagree on the pool size"

    # -- the executor's interface ----------------------------------------------------------------------------

    @property
    def runner(self):
        return self.local  # the driver's

    @property
    def page_bytes(self) -> int:
        return self.local.page_bytes * self.size

    @property
    def local_kv(self) -> None:
        return None  # each rank holds its share of every page

    def run(self, batch: StepPlan) -> torch.Tensor:
        """Forward the batch on every rank; the gathered fp32 logits [n, vocab] of the works that sample."""
        step = self.local.describe(batch)
        fed, step.fed_back = step.fed_back, None  # a device tensor: it travels by broadcast (executor/fed_back.py)
        rows = 0 if fed is None else len(fed.index)
        sent = time.perf_counter()
        self._send(("step", pack_step(step), sent, rows))
        try:
            if fed is not None:
                step.fed_back = self.relay.share(rows, fed)
            logits = self.local.execute(step)  # after the send: the workers start while the driver stages
        except Exception as error:
            self._step_failed(error)
        if self._trace.on:
            self._trace.add(sent, sent, time.perf_counter())
        self._raise_if_failed()
        return logits

    def warm_up(self) -> None:
        self._send(("warm_up", None))
        try:
            self.local.warm_up()
        except Exception as error:
            self._step_failed(error)
        self._expect("done")

    def _step_failed(self, error: Exception) -> None:
        """A step that failed on the driver leaves the ranks out of step (a worker may wait in a collective the
        driver never reached): the engine cannot go on, whether or not a worker failed too."""
        self._raise_if_failed(error)  # a worker's failure, with its traceback, explains it
        self._fail(f"the driver (rank 0) failed in a step: {type(error).__name__}: {error}")
        self._raise_if_failed(error)

    def shutdown(self) -> None:
        """Stop the workers and leave the group (idempotent; also at interpreter exit)."""
        self._stopping = True
        if getattr(self, "_trace", None) is not None:
            self._trace.write()
        self.local = self.model = None
        self._stopper()

    # -- workers ---------------------------------------------------------------------------------------------

    def _send(self, message: tuple) -> None:
        self._raise_if_failed()
        data = encode(message)  # once for every worker
        for rank, conn in enumerate(self.conns, start=1):
            try:
                conn.send_bytes(data)
            except (OSError, EOFError) as error:  # its end of the pipe is closed: it is gone, or going
                self._raise_if_failed(error, rank)
                self._fail(f"tensor-parallel worker {rank} cannot be reached: {error}")
                self._raise_if_failed(error)

    def _expect(self, what: str) -> list:
        """Each worker's reply `what`, in rank order; a worker's error or exit raises TensorParallelError."""
        replies = []
        for rank, (conn, proc) in enumerate(zip(self.conns, self.procs), start=1):
            ready = wait([conn, proc.sentinel], timeout=START_TIMEOUT_S)
            if conn not in ready:
                reason = "exited" if proc.sentinel in ready else f"did not answer in {START_TIMEOUT_S:.0f} s"
                self._fail(f"tensor-parallel worker {rank} {reason} (exit code {proc.exitcode})")
                self._raise_if_failed()
            try:
                kind, payload = conn.recv()
            except (EOFError, OSError):
                self._fail(f"tensor-parallel worker {rank} exited (exit code {proc.exitcode})")
                self._raise_if_failed()
            if kind == "error":
                self._fail(f"tensor-parallel worker failed: {payload}")
                self._raise_if_failed()
            if kind != what:
                raise TensorParallelError(f"tensor-parallel worker {rank} answered {kind!r}, expected {what!r}")
            replies.append(payload)
        return replies

    def _fail(self, message: str) -> None:
        if self._failure is None:
            self._failure = message
            logger.error("%s", message)

    def _raise_if_failed(self, cause: BaseException | None = None, rank: int | None = None) -> None:
        """Raise TensorParallelError if a worker failed (waiting a moment for it to report, after `cause`)."""
        if cause is not None:
            procs = self.procs if rank is None else [self.procs[rank - 1]]
            for proc in procs:
                proc.join(timeout=2.0)  # a peer of a failed collective is on its way out: let it say why
            for r, (conn, proc) in enumerate(zip(self.conns, self.procs), start=1):
                if proc.exitcode is not None:
                    self._fail(_last_words(conn) or f"tensor-parallel worker {r} exited (exit code {proc.exitcode})")
        if self._failure is not None:
            detail = next((w for w in map(_last_words, self.conns) if w), None)
            message = self._failure if detail is None or detail in self._failure else f"{self._failure}\n{detail}"
            raise TensorParallelError(message + "\nthe engine cannot continue; start a new one") from cause


def _watch(ref: weakref.ref, procs: list) -> None:
    """Notice a worker exiting on its own, and unblock a driver waiting for it in a collective. Holds the runner
    only weakly, so that dropping an engine stops its workers (the finalizer)."""
    sentinels = {p.sentinel: rank for rank, p in enumerate(procs, start=1)}
    while sentinels:
        ready = wait(list(sentinels), timeout=1.0)
        runner = ref()
        if runner is None or runner._stopping:
            return
        for sentinel in ready:
            rank = sentinels.pop(sentinel)
            procs[rank - 1].join(timeout=1.0)  # reaps it: its exit code
            runner._fail(f"tensor-parallel worker {rank} exited (exit code {procs[rank - 1].exitcode})")
            if runner.device.type == "cuda":  # NCCL would wait for the dead rank for ever; gloo sees the socket
                try:
                    torch.distributed.distributed_c10d._abort_process_group()
                except Exception:  # noqa: BLE001 (best effort: the error is raised on the engine's thread)
                    logger.exception("could not abort the process group")
        del runner


def _last_words(conn: Connection) -> str | None:
    """The error a dead worker sent before exiting, if any."""
    try:
        while conn.poll():
            kind, payload = conn.recv()
            if kind == "error":
                return f"tensor-parallel worker failed: {payload}"
    except (EOFError, OSError):
        pass
    return None


def _stop(procs: list, conns: list[Connection], group: list) -> None:
    for conn in conns:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, EOFError, OSError):
            conn.send(("stop", None))
    if group and torch.distributed.is_initialized() and torch.distributed.group.WORLD is group[0]:
        _leave_with_workers()
    for proc in procs:
        proc.join(timeout=STOP_TIMEOUT_S)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=STOP_TIMEOUT_S)
    for conn in conns:
        conn.close()


def _leave_with_workers() -> None:
    """Leave the group while the workers leave it (they do on "stop"): NCCL's teardown waits for every rank, so
    the driver leaving only after joining its workers would leave each of them waiting for it, and itself waiting
    for a rank that is gone. Bounded: a rank that died cannot take part (the watcher aborted the group then)."""
    leaving = threading.Thread(target=leave, daemon=True, name="lazyattn-tp-leave")
    leaving.start()
    leaving.join(STOP_TIMEOUT_S)
    if leaving.is_alive():
        frame = sys._current_frames().get(leaving.ident)
        where = "".join(traceback.format_stack(frame)) if frame is not None else "(no stack)"
        logger.warning(
            "the driver could not leave the tensor-parallel group in %.0f s; it waits in:\n%s", STOP_TIMEOUT_S, where
        )
