"""What `LLMEngine.step_observer` is given: one step as plain data, once its tokens are read (bench/trace.py
draws them on a timeline). Built only while an observer is set (engine/step_pipeline.py): with none, a step pays a
`None` check."""

from __future__ import annotations

from dataclasses import dataclass

from lazyattn.engine.batch import StepPlan


@dataclass(frozen=True)
class StepReport:
    """One launched step; times are time.monotonic() seconds."""

    index: int  # launch order among the reported steps of this engine
    # "prefill", "decode", "mixed" (both in one pass), "split" (a mixed step run as two passes) or "empty" (no rows:
    # waiting on copies from the host tier)
    kind: str
    decode_rows: int  # rows decoding a generated token
    prefill_tokens: int  # prefill rows: documents, prompts, recomputation (the scheduler's prefilled_tokens)
    documents: int  # documents encoded alone (segment jobs) with rows in this step
    sequences: int  # sequences with rows in this step
    overlapped: bool  # launched from the previous step's sampled ids, before that step was read (StepPlan.continues)
    graph_passes: int  # forward passes that replayed a CUDA graph (0: eager; a split step has two passes)
    scheduled_at: float  # the host starts scheduling it (after the step call began or the previous read ended)
    launched_at: float  # its forward pass and sampling queued: scheduled_at..launched_at is host time
    read_at: float | None = None  # its tokens read on the host; None: drained unread (every request had ended)


def step_report(
    index: int, plan: StepPlan, split: bool, graph_passes: int, scheduled_at: float, launched_at: float
) -> StepReport:
    """The report of a step just launched (`plan`, as launched)."""
    prefill_tokens = plan.prefill_rows
    decode_rows = plan.num_tokens - prefill_tokens
    kind = "mixed" if prefill_tokens and decode_rows else "decode" if decode_rows else "prefill"
    kind = "empty" if not plan.works else "split" if split else kind
    return StepReport(
        index=index,
        kind=kind,
        decode_rows=decode_rows,
        prefill_tokens=prefill_tokens,
        documents=len(plan.encodes),
        sequences=len({w.seq.seq_id for w in plan.works if w.seq is not None}),
        overlapped=plan.fed_back is not None,
        graph_passes=graph_passes,
        scheduled_at=scheduled_at,
        launched_at=launched_at,
    )
