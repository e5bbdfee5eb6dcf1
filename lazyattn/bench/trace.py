"""`lazyattn bench --trace FILE`: the measured windows of a run as a Chrome / Perfetto trace (the Trace Event Format:
`{"traceEvents": [...]}` of "X" complete events, microseconds), and the few lines that say what the p99 requests
waited through.

One process per measured window (a steady-state point, or a plain run's load point), from the window's start until
its requests have finished.
Thread 1 holds the engine's steps, each an event over its host time (scheduling and launch: the engine's
`StepReport`), named by its kind, its batch and how long until its tokens were read in the args. The other threads
are request slots: each request takes the lowest slot free at its arrival (so the file grows with the concurrency,
not the request count) and shows as queue (arrival -> first scheduled), prefill (-> first token) and decode
(-> finish). Requests that arrived in the warm-up and were still running are drawn too, `in_window` false: they
took part in the window's steps.
Thread 2 holds Python's garbage collections over the window (`gc.callbacks`, whichever code triggered them: the
engine's own between steps, engine/gc_control.py, or automatic ones inside a step), each an event named by the
generation collected; a step's args give the collection time inside its host time (`gc_ms`), so a trace tells a
stall that is a collection from one that is not.

Recording is the engine's step observer and a gc callback, set only over a window: with no trace, a step pays one
`None` check.
"""

from __future__ import annotations

import bisect
import gc
import heapq
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from lazyattn.bench.metrics import RequestRecord, percentile
from lazyattn.engine.step_report import StepReport

STEPS_TID = 1
GC_TID = 2
FIRST_SLOT_TID = 100
SLOWEST = 3  # p99 requests listed per window


@dataclass(frozen=True)
class Collection:
    """One garbage collection; times are time.monotonic() seconds."""

    generation: int  # the oldest generation collected (2: a full collection)
    start: float
    end: float
    collected: int  # unreachable objects found


class TraceRecorder:
    """Collects the traced windows' events: `start` at a window's start, `stop` when its point ends (both with the
    engine), `add_window` with the point's request records; `write` at the end of the run."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.windows: list[dict] = []  # per traced window: label, pid, the engine's prefilled tokens over it
        self._steps: list[StepReport] | None = None
        self._collections: list[Collection] = []
        self._gc_start = 0.0
        self._t0 = 0.0
        self._prefilled = 0

    def start(self, engine, t0: float) -> None:
        """Record the engine's steps from now on; `t0` (time.monotonic()) is the point's zero."""
        self._steps, self._t0 = [], t0
        self._prefilled = engine.stats().prefilled_tokens
        engine.step_observer = self._steps.append
        self._collections = []
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def stop(self, engine) -> None:
        """Stop recording (the point's requests have ended or been aborted)."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if engine.step_observer is not None and self._steps is not None:
            engine.step_observer = None
            self._prefilled = engine.stats().prefilled_tokens - self._prefilled

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.monotonic()
        else:
            end = time.monotonic()
            self._collections.append(Collection(info["generation"], self._gc_start, end, info["collected"]))

    def add_window(self, label: str, records: dict[int, RequestRecord], start_s: float, end_s: float) -> None:
        """The stopped window's events: its steps, and the requests in flight during it (records: seconds since t0;
        in the window: arrived in [start_s, end_s))."""
        steps, self._steps = self._steps, None
        collections, self._collections = self._collections, []
        if steps is None:
            return
        pid = len(self.windows) + 1
        last = max([s.read_at or s.launched_at for s in steps] + [self._t0 + start_s]) - self._t0
        self.events.append(_meta("process_name", pid, 0, label))
        self.events.append(_meta("thread_name", pid, STEPS_TID, "engine steps (host)"))
        self.events.append(_meta("thread_name", pid, GC_TID, "garbage collections"))
        ends = [c.end for c in collections]  # in order: collections do not overlap
        self.events += [_step_event(s, self._t0, pid, _gc_inside(collections, ends, s)) for s in steps]
        self.events += [_collection_event(c, self._t0, pid) for c in collections]
        active = [r for r in records.values() if (_finish(r) if _finish(r) is not None else last) >= start_s]
        self.events += _request_events(sorted(active, key=lambda r: r.arrival), pid, start_s, end_s, last)
        self.windows.append(
            {
                "label": label,
                "pid": pid,
                "window_start_s": start_s,
                "window_end_s": end_s,
                "steps": len(steps),
                "collections": [sum(c.generation == g for c in collections) for g in range(3)],  # per generation
                "prefilled_tokens": self._prefilled,  # the engine's counter over the recording
            }
        )

    def document(self) -> dict:
        return {"traceEvents": self.events, "displayTimeUnit": "ms", "lazyattn_windows": self.windows}

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.document(), allow_nan=False))


def _meta(name: str, pid: int, tid: int, value: str) -> dict:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "ts": 0, "args": {"name": value}}


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 1)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3)


def _gc_inside(collections: list[Collection], ends: list[float], s: StepReport) -> float:
    """Seconds of the collections (in order, `ends` their ends) inside the step's host time."""
    seconds = 0.0
    for c in collections[bisect.bisect_right(ends, s.scheduled_at) :]:
        if c.start >= s.launched_at:
            break
        seconds += max(min(c.end, s.launched_at) - max(c.start, s.scheduled_at), 0.0)
    return seconds


def _step_event(s: StepReport, t0: float, pid: int, gc_s: float) -> dict:
    return {
        "ph": "X",
        "cat": "step",
        "name": s.kind,
        "pid": pid,
        "tid": STEPS_TID,
        "ts": _us(s.scheduled_at - t0),
        "dur": _us(max(s.launched_at - s.scheduled_at, 0.0)),
        "args": {
            "step": s.index,
            "decode_rows": s.decode_rows,
            "prefill_tokens": s.prefill_tokens,
            "documents": s.documents,
            "sequences": s.sequences,
            "host_ms": _ms(s.launched_at - s.scheduled_at),
            "read_ms": _ms(None if s.read_at is None else s.read_at - s.launched_at),  # launch -> tokens read
            "graph": "replayed" if s.graph_passes else "eager",
            "overlapped": s.overlapped,
            "gc_ms": _ms(gc_s),  # garbage collections inside its host time
        },
    }


def _collection_event(c: Collection, t0: float, pid: int) -> dict:
    return {
        "ph": "X",
        "cat": "gc",
        "name": f"gc gen {c.generation}",
        "pid": pid,
        "tid": GC_TID,
        "ts": _us(c.start - t0),
        "dur": _us(c.end - c.start),
        "args": {"generation": c.generation, "ms": _ms(c.end - c.start), "collected": c.collected},
    }


def _finish(r: RequestRecord) -> float | None:
    return r.token_times[-1] if r.finished and r.token_times else None


def _request_events(records: list[RequestRecord], pid: int, start_s: float, end_s: float, last: float) -> list[dict]:
    """Queue, prefill and decode spans per request (arrival order), each on the lowest slot free at its arrival."""
    events: list[dict] = []
    free: list[int] = []  # slots free again, lowest first
    busy: list[tuple[float, int]] = []  # (end, slot)
    slots = 0
    for r in records:
        while busy and busy[0][0] <= r.arrival:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            slot = heapq.heappop(free)
        else:
            slot, slots = slots, slots + 1
            events.append(_meta("thread_name", pid, FIRST_SLOT_TID + slot, f"request slot {slot}"))
        first = r.token_times[0] if r.token_times else None
        end = _finish(r)
        end = max(end if end is not None else last, r.arrival)
        scheduled = None if r.queue_time is None else r.arrival + r.queue_time
        if scheduled is not None and first is not None:
            scheduled = min(scheduled, first)
        args = {
            "request": r.index,
            "ttft_ms": None if r.ttft is None else r.ttft * 1e3,
            "queue_ms": _ms(r.queue_time),
            "in_window": start_s <= r.arrival < end_s,
            "context_tokens": r.context_tokens,
            "doc_hits": r.doc_hits,
            "finished": r.finished,
        }
        spans = [("queue", r.arrival, scheduled if scheduled is not None else first if first is not None else end)]
        if scheduled is not None:
            spans.append(("prefill", scheduled, first if first is not None else end))
        if first is not None:
            spans.append(("decode", first, end))
        for name, a, b in spans:
            event = {"ph": "X", "cat": "request", "name": name, "pid": pid, "tid": FIRST_SLOT_TID + slot}
            events.append({**event, "ts": _us(a), "dur": _us(max(b - a, 0.0)), "args": args})
        heapq.heappush(busy, (end, slot))
    return events


def _step_end(e: dict) -> float:
    """When the step's tokens were read (its host time's end if it was drained unread), µs."""
    return e["ts"] + e["dur"] + (e["args"]["read_ms"] or 0.0) * 1e3


def summary(document: dict) -> list[str]:
    """Per traced window: its p99 TTFT, and for its slowest requests (at or above the p99, at most SLOWEST) what
    the steps between their arrival and their first token looked like."""
    lines = []
    events = document["traceEvents"]
    for window in document.get("lazyattn_windows", []):
        pid = window["pid"]
        steps = [e for e in events if e["ph"] == "X" and e["pid"] == pid and e["cat"] == "step"]
        collections = [e for e in events if e["ph"] == "X" and e["pid"] == pid and e["cat"] == "gc"]
        queued = [e for e in events if e["ph"] == "X" and e["pid"] == pid and e["name"] == "queue"]
        requests = [e for e in queued if e["args"]["in_window"]]
        ttft = {id(e): math.inf if e["args"]["ttft_ms"] is None else e["args"]["ttft_ms"] for e in requests}
        p99 = percentile(list(ttft.values()), 99)
        host = percentile([e["dur"] / 1e3 for e in steps], 50)
        lines.append(
            f"trace {window['label']}: p99 TTFT {p99:.1f} ms over {len(requests)} window requests, "
            f"{len(steps)} steps (host median {host:.2f} ms)" + _collections_said(collections)
        )
        slow = sorted((e for e in requests if ttft[id(e)] >= p99), key=lambda e: -ttft[id(e)])[:SLOWEST]
        for e in slow:
            arrival, wait = e["ts"], ttft[id(e)]
            until = arrival + wait * 1e3 if math.isfinite(wait) else math.inf
            through = [s for s in steps if s["ts"] < until and _step_end(s) > arrival]  # running at arrival too
            prefill = [s for s in through if s["args"]["prefill_tokens"]]
            largest = max(through, key=lambda s: s["args"]["prefill_tokens"], default=None)
            worst = (
                f", largest {largest['args']['prefill_tokens']} tokens ({largest['dur'] / 1e3:.1f} ms host, "
                f"{largest['args']['documents']} documents)"
                if largest is not None and largest["args"]["prefill_tokens"]
                else ""
            )
            queued = e["args"]["queue_ms"]
            lines.append(
                f"  request {e['args']['request']}: TTFT {wait:.1f} ms, "
                + (f"queued {queued:.1f} ms" if queued is not None else "never scheduled")
                + f"; waited "
                f"through {len(through)} steps, {len(prefill)} with prefill "
                f"({sum(s['args']['prefill_tokens'] for s in through)} tokens{worst})"
                + _collections_said([c for c in collections if c["ts"] < until and c["ts"] + c["dur"] > arrival])
            )
    return lines


def _collections_said(collections: list[dict]) -> str:
    """The garbage collections among these events, in a few words ('' for none)."""
    if not collections:
        return ""
    full = sum(c["args"]["generation"] == 2 for c in collections)
    longest = max(c["dur"] for c in collections) / 1e3
    plural = "s" if len(collections) > 1 else ""
    return f"; {len(collections)} garbage collection{plural} ({full} full, longest {longest:.1f} ms)"
