"""Run question-answering items through the engine and score the answers.

A *run* is one engine configuration (a mode, plus any engine options: `lazy:relink_tokens=16` will compare a
variant of lazy later without new code here). A *cell* is one way of showing the items: how many documents,
where the gold ones sit. Every run answers every cell's items with the same prompt layout and greedy
decoding, so the runs differ only in attention semantics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from lazyattn.engine.best_document import ANSWER_STRATEGIES, CHOOSING, check_answer, confidence
from lazyattn.engine.choice import chosen_logprobs
from lazyattn.engine.config import MODES, cli_flags
from lazyattn.errors import InvalidRequestError
from lazyattn.eval.metrics import Scores, bootstrap_ci
from lazyattn.qa.dataset import QAItem, arrange


def parse_option(text: str) -> tuple[str, Any]:
    """ "key=value" -> (key, value); the value is read as JSON when it parses (16, 0.5, true), else a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise InvalidRequestError(f"engine option {text!r} is not key=value", param="engine_option")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.strip().replace("-", "_"), value


# How a run answers (RunSpec.answer) is the engine's `answer` (engine/best_document.py): "joint", one request with
# every document (the prompt as given); "best-document", one request per document with that document alone, and the
# answer with the highest mean log-probability per token (docs/quality.md, "Answering from the best single document").


@dataclass(frozen=True)
class RunSpec:
    """One engine configuration: `mode` and extra `LLM(...)` options; `label` names it in tables and JSON; `answer`,
    how its questions are asked (ANSWER_STRATEGIES), and `confidence_tokens`, the cap on the one-document answers of
    the confidence-order strategies, the first tokens the other strategies rank their candidates by
    (engine/best_document.py; None: the whole answer)."""

    label: str
    mode: str
    options: dict[str, Any] = field(default_factory=dict)
    answer: str = "joint"
    confidence_tokens: int | None = None

    @staticmethod
    def parse(text: str) -> RunSpec:
        """ "lazy" or "lazy:relink_tokens=16" (options separated by ':'); `answer=best-document` is the run's
        answering strategy and `confidence_tokens=4` its candidates' first tokens, not engine options."""
        mode, *opts = text.strip().split(":")
        if mode not in MODES:
            raise InvalidRequestError(
                f"unknown mode {mode!r} in {text!r}; choose from {', '.join(MODES)}", param="modes"
            )
        options = dict(parse_option(o) for o in opts)
        answer = options.pop("answer", "joint")
        if answer not in ANSWER_STRATEGIES:
            raise InvalidRequestError(
                f"unknown answer={answer!r} in {text!r}; choose from {', '.join(ANSWER_STRATEGIES)}", param="modes"
            )
        confidence_tokens = options.pop("confidence_tokens", None)
        try:
            check_answer(answer, confidence_tokens=confidence_tokens)
        except InvalidRequestError as e:
            raise InvalidRequestError(f"{e} (in {text!r})", param="modes") from None
        return RunSpec(text.strip(), mode, options, answer, confidence_tokens)

    @property
    def serve_flags(self) -> str:
        """The `lazyattn serve` flags that serve requests as this run asks them: its mode, its engine options (the
        defaults left out) and its answering strategy."""
        flags = [f"--mode {self.mode}", cli_flags(self.options)]
        if self.answer != "joint":
            flags.append(f"--answer {self.answer}")
        if self.confidence_tokens is not None:
            flags.append(f"--confidence-tokens {self.confidence_tokens}")
        return " ".join(f for f in flags if f)


@dataclass(frozen=True)
class Cell:
    num_docs: int | None  # None: every document of each item
    position: str  # gold position: first, middle, last, original

    @property
    def label(self) -> str:
        return f"{'all' if self.num_docs is None else self.num_docs} docs, gold {self.position}"


def plan_cells(
    items: Sequence[QAItem],
    num_docs: Sequence[int | None],
    positions: Sequence[str],
) -> tuple[list[tuple[Cell, list[QAItem]]], dict[Cell, Cell]]:
    """Each cell's arranged items, and the cells left out because they show exactly the items of an earlier
    one (with two documents and one gold, "middle" is "first"): {left out: the cell it equals}."""
    planned: list[tuple[Cell, list[QAItem]]] = []
    aliases: dict[Cell, Cell] = {}
    for n in num_docs:
        for position in positions:
            cell = Cell(n, position)
            shown = [arrange(item, n, position) for item in items]
            same = next((c for c, s in planned if c.num_docs == n and s == shown), None)
            if same is not None:
                aliases[cell] = same
            else:
                planned.append((cell, shown))
    return planned, aliases


@dataclass(frozen=True)
class ItemResult:
    id: str
    type: str
    output: str
    scores: Scores
    ttft_s: float | None
    prompt_tokens: int  # documents + system + question
    cached_tokens: int
    finish_reason: str | None
    # A run that chooses among candidates (RunSpec.answer): the document the answer was read from (None: all of them),
    # and whether it holds the answer (one of the item's gold documents); a confidence-order run: the order the
    # documents were read in, and whether the last one holds the answer; None for a joint run. A both-placements run:
    # whether the answer kept read the documents in parallel.
    answered_from: int | None = None
    read_gold: bool | None = None
    document_order: list[int] | None = None
    read_in_parallel: bool = False
    # With `lazyattn eval --confidence`: the mean log-probability of the answer's tokens (best_document.confidence,
    # what the choosing strategies rank candidates by); None without it, and for an answer without tokens. With it
    # too, each answer token's log-probability in order (what a choice after its first k tokens ranks by).
    confidence: float | None = None
    token_logprobs: list[float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.type,
            "output": self.output,
            "accuracy": self.scores.accuracy,
            "exact_match": self.scores.exact_match,
            "f1": self.scores.f1,
            "ttft_s": self.ttft_s,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "finish_reason": self.finish_reason,
            "answered_from": self.answered_from,
            "read_gold": self.read_gold,
            "document_order": self.document_order,
            "read_in_parallel": self.read_in_parallel,
            "confidence": self.confidence,
            "token_logprobs": self.token_logprobs,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ItemResult:
        return ItemResult(
            d["id"],
            d["type"],
            d["output"],
            Scores(d["accuracy"], d["exact_match"], d["f1"]),
            d["ttft_s"],
            d["prompt_tokens"],
            d["cached_tokens"],
            d["finish_reason"],
            d.get("answered_from"),
            d.get("read_gold"),
            d.get("document_order"),
            d.get("read_in_parallel", False),
            d.get("confidence"),
            d.get("token_logprobs"),
        )


@dataclass
class CellResult:
    run: RunSpec
    cell: Cell
    items: list[ItemResult]

    def summary(self) -> dict[str, Any]:
        """Means over items: scores in [0, 1] (accuracy with its 95 % bootstrap interval), TTFT in ms; per
        question type when there are several."""

        def mean(xs: list[float]) -> float | None:
            return statistics.fmean(xs) if xs else None

        ttfts = [r.ttft_s * 1e3 for r in self.items if r.ttft_s is not None]
        out: dict[str, Any] = {
            "run": self.run.label,
            "mode": self.run.mode,
            "num_docs": self.cell.num_docs,
            "position": self.cell.position,
            "n": len(self.items),
            "accuracy": mean([r.scores.accuracy for r in self.items]),
            # 95 % percentile bootstrap over the questions (metrics.bootstrap_ci); None without items
            "accuracy_ci": bootstrap_ci([r.scores.accuracy for r in self.items]),
            "exact_match": mean([r.scores.exact_match for r in self.items]),
            "f1": mean([r.scores.f1 for r in self.items]),
            "ttft_ms_mean": mean(ttfts),
            "ttft_ms_median": statistics.median(ttfts) if ttfts else None,
            "prompt_tokens_mean": mean([r.prompt_tokens for r in self.items]),
            "cached_tokens_mean": mean([r.cached_tokens for r in self.items]),
            # a run choosing among candidates: the share of answers read from a gold document; a confidence-order one:
            # of reordered answers that read a gold document last (None: joint)
            "read_gold": mean([float(r.read_gold) for r in self.items if r.read_gold is not None]),
        }
        types = sorted({r.type for r in self.items})
        if len(types) > 1:
            out["accuracy_by_type"] = {t: mean([r.scores.accuracy for r in self.items if r.type == t]) for t in types}
            out["accuracy_ci_by_type"] = {
                t: bootstrap_ci([r.scores.accuracy for r in self.items if r.type == t]) for t in types
            }
            out["n_by_type"] = {t: sum(r.type == t for r in self.items) for t in types}
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "options": self.run.options,
            "answer": self.run.answer,
            "confidence_tokens": self.run.confidence_tokens,
            "items": [r.to_dict() for r in self.items],
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> CellResult:
        """From `to_dict` (an eval.json cell): tables and plots can be redrawn without re-running."""
        return CellResult(
            RunSpec(d["run"], d["mode"], d.get("options", {}), d.get("answer", "joint"), d.get("confidence_tokens")),
            Cell(d["num_docs"], d["position"]),
            [ItemResult.from_dict(i) for i in d["items"]],
        )


def messages_for(item: QAItem) -> list[dict[str, str]]:
    return [{"role": "user", "content": item.question}]


def answer_cell(
    llm: Any,
    run: RunSpec,
    cell: Cell,
    items: Sequence[QAItem],
    params: Any,
    batch_size: int = 1,
    on_done: Callable[[int], None] = lambda n: None,
    plain: bool = False,
) -> CellResult:
    """Each item through `llm.chat` with its documents, or with `plain` through `llm.generate` (the question as a
    plain-text prompt after the documents, no chat template). batch_size 1 keeps each TTFT the request's own (no
    queueing behind the others); larger batches are faster (answers may differ only
    where batched arithmetic rounds differently)."""
    results: list[ItemResult] = []
    for start in range(0, len(items), batch_size):
        batch = items[start : start + batch_size]
        outs = _ask(llm, batch, params, plain, run)
        for item, out in zip(batch, outs):
            text = out.text.strip()
            results.append(
                ItemResult(
                    id=item.id,
                    type=item.type,
                    output=text,
                    scores=Scores.of(text, item.answers, item.labels),
                    ttft_s=out.metrics.ttft if out.metrics else None,
                    prompt_tokens=out.num_document_tokens + len(out.prompt_token_ids),
                    cached_tokens=out.metrics.cached_tokens if out.metrics else 0,
                    finish_reason=out.finish_reason,
                    answered_from=out.answered_from,
                    read_gold=_read_gold(run.answer, out, item.gold),
                    document_order=out.document_order,
                    read_in_parallel=out.read_in_parallel,
                    confidence=_confidence(out),
                    token_logprobs=_token_logprobs(out),
                )
            )
        on_done(len(batch))
    return CellResult(run, cell, results)


def _confidence(out: Any) -> float | None:
    """ItemResult.confidence: the answer's mean token log-probability where its tokens' log-probabilities were
    asked for (`--confidence`), else None; None too for an answer without tokens (no finite mean)."""
    completion = out.outputs[0] if out.outputs else None
    if completion is None or completion.logprobs is None:
        return None
    value = confidence(out)
    return value if math.isfinite(value) else None


def _token_logprobs(out: Any) -> list[float] | None:
    """ItemResult.token_logprobs: the log-probability of each answer token in order where they were asked for
    (`--confidence`), else None."""
    completion = out.outputs[0] if out.outputs else None
    if completion is None or completion.logprobs is None:
        return None
    return chosen_logprobs(out)


def _read_gold(answer: str, out: Any, gold: Sequence[int]) -> bool | None:
    """ItemResult.read_gold: whether the document the answer was read from, or (confidence order) the one read
    last, is a gold one; None for a joint run, and for an answer that read its documents as given."""
    if answer == "joint":
        return None
    if answer in CHOOSING:
        return out.answered_from in gold
    return out.document_order[-1] in gold if out.document_order else None


@dataclass(frozen=True)
class GuidedLabels:
    """`lazyattn eval --guided-choice`: `params` for every question, with a labelled one's labels as its guided
    choice. In a plain-text prompt that does not end in whitespace each label takes a leading space, as a
    demonstration shows it (`Language: french`); in a chat turn the answer starts the turn, the labels as they are."""

    params: Any
    plain: bool

    def __call__(self, item: QAItem) -> Any:
        if not item.labels:
            return self.params
        space = " " if self.plain and item.question[-1:] and not item.question[-1].isspace() else ""
        return dataclasses.replace(self.params, guided_choice=tuple(space + label for label in item.labels))


def _ask(llm: Any, items: Sequence[QAItem], params: Any, plain: bool, run: RunSpec) -> list[Any]:
    """One request per item with its documents, answered as the run's `answer` and `confidence_tokens` say
    (engine/best_document.py): a chat turn, or with `plain` a plain-text prompt. `params`: one SamplingParams for
    all, or a function of the item (`GuidedLabels`)."""
    if callable(params):
        params = [params(it) for it in items]
    documents = [list(it.documents) for it in items]
    kw = dict(documents=documents, use_tqdm=False, answer=run.answer, confidence_tokens=run.confidence_tokens)
    if plain:
        return llm.generate([it.question for it in items], params, **kw)
    return llm.chat([messages_for(it) for it in items], params, **kw)


def evaluate(
    runs: Sequence[RunSpec],
    cells: Sequence[tuple[Cell, list[QAItem]]],
    make_llm: Callable[[RunSpec], Any],
    params: Any,
    batch_size: int = 1,
    progress: bool = True,
    plain: bool = False,
) -> list[CellResult]:
    """Every run over every cell; one engine per run, built by `make_llm` and dropped before the next; `plain`:
    plain-text prompts (`answer_cell`)."""
    from tqdm import tqdm

    total = len(runs) * sum(len(items) for _, items in cells)
    results: list[CellResult] = []
    start = time.monotonic()
    with tqdm(total=total, desc="eval", disable=not progress, dynamic_ncols=True) as bar:
        for run in runs:
            with one_engine(make_llm, run) as llm:
                _answer_run(llm, run, cells, params, batch_size, bar, results, total, start, len(runs), plain)
    return results


@contextlib.contextmanager
def one_engine(make_llm: Callable[[Any], Any], what: Any) -> Iterator[Any]:
    """`make_llm(what)`, shut down when the block ends: the next engine sizes its KV pool from free GPU memory, so
    this one's must be given back then, not whenever the garbage collector gets to it."""
    llm = make_llm(what)
    try:
        yield llm
    finally:
        shutdown = getattr(llm, "shutdown", None)
        if shutdown is not None:
            shutdown()
        del llm
        gc.collect()


def _answer_run(
    llm,
    run,
    cells,
    params,
    batch_size,
    bar,
    results: list[CellResult],
    total: int,
    start: float,
    n_runs: int,
    plain: bool = False,
) -> None:
    """One run over every cell, a line printed per finished cell."""
    from tqdm import tqdm

    for cell, items in cells:
        bar.set_description(f"{run.label}, {cell.label}")
        result = answer_cell(llm, run, cell, items, params, batch_size, bar.update, plain)
        results.append(result)
        s = result.summary()
        bar.set_postfix_str(f"acc {100 * s['accuracy']:.0f}%" if s["accuracy"] is not None else "")
        # one line per finished cell, also where the bar is off or lost in a log file
        done = len(results)
        acc = "-" if s["accuracy"] is None else f"{100 * s['accuracy']:.1f}%"
        ci = s["accuracy_ci"]
        acc += "" if ci is None else f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"
        tqdm.write(
            f"[{done}/{n_runs * len(cells)} cells, {sum(len(r.items) for r in results)}/{total} answers, "
            f"{time.monotonic() - start:.0f} s] "
            f"{run.label}, {cell.label}: accuracy {acc} over {s['n']} questions",
            file=sys.stdout,
        )
