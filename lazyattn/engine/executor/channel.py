"""The driver's messages to the workers, made cheap on the path of every step (docs/design.md, "Tensor
parallelism"): a step must reach every worker, and its replay start there, as soon after the driver's as possible,
since each collective of the step waits for the last rank to reach it.

- A step travels as plain tuples of int lists: pickling dataclasses (StepInputs, one EntryPages per entry) costs
  a reduce call per object, several times the ints' own cost for a batch of decode rows.
- It is pickled once, and the same bytes go to every worker.
- On GPUs a worker spins on its pipe for a while after each message (SPIN_S) instead of sleeping in `recv`: a
  process woken from a blocking read starts tens of µs later. It falls back to a blocking read when idle, so an
  idle engine costs no CPU beyond that. CPU (gloo) workers never spin: the CPU runs the model there.

With LAZYATTN_TP_TRACE=DIR set, every rank writes DIR/dispatch_rank{r}.json when it stops: the time from the
driver's send to the step's arrival and to its launch (graph replay issued) on that rank, median and p90.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import statistics
import time
from multiprocessing.connection import Connection
from pathlib import Path

from lazyattn.engine.graph_inputs import StepInputs
from lazyattn.kernels.paged import EntryPages

SPIN_S = 0.05  # long enough to span the driver's host work between two decode steps

_STEP_FIELDS = tuple(f.name for f in dataclasses.fields(StepInputs))
_ENTRY_FIELDS = tuple(f.name for f in dataclasses.fields(EntryPages))


def pack_step(step: StepInputs) -> tuple:
    """StepInputs as a tuple of plain lists (entries as tuples), for pickling."""
    values = []
    for name in _STEP_FIELDS:
        value = getattr(step, name)
        if name == "entries":
            value = [tuple(getattr(e, f) for f in _ENTRY_FIELDS) for e in value]
        values.append(value)
    return tuple(values)


def unpack_step(values: tuple) -> StepInputs:
    fields = dict(zip(_STEP_FIELDS, values))
    fields["entries"] = [EntryPages(*e) for e in fields["entries"]]
    return StepInputs(**fields)


def encode(message: tuple) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def receive(conn: Connection, spin_s: float) -> tuple:
    """The next message on `conn` (what Connection.send or send_bytes(encode(...)) sent): spinning for up to
    `spin_s` first, then blocking. Raises EOFError once the driver's end is closed."""
    if spin_s > 0 and not conn.poll():
        deadline = time.perf_counter() + spin_s
        while not conn.poll() and time.perf_counter() < deadline:
            pass
    return conn.recv()


class DispatchTrace:
    """Per step: driver send -> arrival, and -> launch, on one rank, written to `directory` (LAZYATTN_TP_TRACE, the
    engine's config.env) when it stops; None: off."""

    def __init__(self, rank: int, directory: str | None) -> None:
        self.path = None if not directory else Path(directory) / f"dispatch_rank{rank}.json"
        self.arrived: list[float] = []
        self.launched: list[float] = []

    @property
    def on(self) -> bool:
        return self.path is not None

    def add(self, sent: float, arrived: float, launched: float) -> None:
        self.arrived.append(arrived - sent)
        self.launched.append(launched - sent)

    def write(self) -> None:
        if self.path is None or not self.launched:
            return

        def summary(values: list[float]) -> dict:
            ordered = sorted(values)
            return {"median_us": 1e6 * statistics.median(ordered), "p90_us": 1e6 * ordered[int(0.9 * len(ordered))]}

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(
            json.dumps(
                {
                    "steps": len(self.launched),
                    "send_to_arrival": summary(self.arrived),
                    "send_to_launch": summary(self.launched),
                },
                indent=1,
            )
        )
