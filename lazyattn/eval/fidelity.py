"""`lazyattn eval --fidelity`: how much the engine's arithmetic moves greedy answers (docs/quality.md, "Fidelity").

The same prompts go through every mode and dtype, and are compared, prompt by prompt:

- against the float32 reference of the same mode: the PyTorch reference attention (kernels/reference.py), float32
  weights and KV, the products through torch (no GEMV kernel, no fused decode path), no CUDA graphs. On the CPU that
  is the engine itself, which runs the reference;
- across batch sizes: the same prompts alone (batch 1), in groups of a middle size and all together, same mode and
  dtype, against batch 1;
- mode against mode in one dtype and batch size: lazy vs block and prefix vs full, which compute the same
  semantics (docs/design.md, Modes) and differ only in rounding.

For each comparison: the share of identical greedy answers (token ids; a 95 % bootstrap interval over prompts), the
first generated position where two answers differ (mean and median over the answers that differ), and the KL
divergence KL(P_against || P_run) between the next-token distributions of the first generated token (both runs
see the same prompt there, so it measures the arithmetic alone, before any answer has diverged).

Before every generate call the engine's document cache is emptied: a prompt "alone" computes all of its KV itself,
never reading documents that a neighbouring prompt's batch encoded.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from lazyattn.errors import InvalidRequestError
from lazyattn.eval.harness import one_engine
from lazyattn.eval.metrics import CONFIDENCE, bootstrap_ci

# The pairs of modes that compute the same semantics (docs/design.md, Modes).
MODE_PAIRS = (("lazy", "block"), ("prefix", "full"))


@dataclass
class Answers:
    """One pass over the prompts: each prompt's greedy token ids and its first token's log-softmax row (fp32)."""

    token_ids: list[list[int]]
    first_logprobs: list[torch.Tensor]


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first generated position where two answers differ (0: the first token); None where they are identical.
    Where one answer is a prefix of the other (it stopped earlier), they differ where the shorter one ends."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def kl_divergence(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """KL(P || Q) over the last dimension, from log-probabilities: sum_i p_i (log p_i - log q_i), in float64.
    Each row is renormalised first: an fp32 log-softmax row sums to 1 only within rounding, which would make
    near-equal distributions come out slightly negative (~-1e-8). Terms with p_i = 0 are 0; q_i = 0 under p_i > 0
    gives inf."""
    p_log = torch.log_softmax(p_log.double(), dim=-1)
    q_log = torch.log_softmax(q_log.double(), dim=-1)
    terms = p_log.exp() * (p_log - q_log)
    kl = torch.where(p_log == float("-inf"), torch.zeros_like(terms), terms).sum(-1)
    return kl.clamp_min(0.0)  # float64 rounding of a sum that is >= 0 (Gibbs), at most ~1e-16 below it


@dataclass(frozen=True)
class Comparison:
    """One row of the report: `run` against `against`, prompt by prompt."""

    kind: str  # "dtype" (against the fp32 reference), "batch" (against batch 1), "mode" (mode against mode)
    run: str
    against: str
    identical: list[float]  # 1.0 where the token ids are identical
    divergence: list[int]  # first differing position of each answer that differs
    kl: list[float]  # per prompt, KL(P_against || P_run) at the first generated token

    @staticmethod
    def of(kind: str, run: str, against: str, answers: Answers, reference: Answers) -> Comparison:
        if len(answers.token_ids) != len(reference.token_ids):
            raise ValueError(f"{run} has {len(answers.token_ids)} answers, {against} {len(reference.token_ids)}")
        firsts = [first_divergence(a, b) for a, b in zip(answers.token_ids, reference.token_ids)]
        kl = kl_divergence(torch.stack(reference.first_logprobs), torch.stack(answers.first_logprobs))
        return Comparison(
            kind,
            run,
            against,
            [float(f is None) for f in firsts],
            [f for f in firsts if f is not None],
            kl.tolist(),
        )

    def summary(self) -> dict[str, Any]:
        """Shares in [0, 1] with their 95 % bootstrap interval over prompts; KL in nats."""
        d = self.divergence
        return {
            "kind": self.kind,
            "run": self.run,
            "against": self.against,
            "n": len(self.identical),
            "identical": statistics.fmean(self.identical) if self.identical else None,
            "identical_ci": bootstrap_ci(self.identical),
            "diverging": len(d),
            "divergence_mean": statistics.fmean(d) if d else None,
            "divergence_median": statistics.median(d) if d else None,
            "kl_mean": statistics.fmean(self.kl) if self.kl else None,
            "kl_ci": bootstrap_ci(self.kl),
            "kl_max": max(self.kl) if self.kl else None,
        }


@dataclass(frozen=True)
class Prompt:
    messages: list[dict[str, str]]
    documents: list[Any]


@dataclass(frozen=True)
class Engine:
    """One engine: a mode in a dtype, or the mode's float32 reference."""

    mode: str
    dtype: str
    reference: bool = False

    @property
    def label(self) -> str:
        return f"{self.mode} {'float32 reference' if self.reference else self.dtype}"


def reference_options(device: str) -> dict[str, Any]:
    """The LLM(...) options of the float32 reference on `device`: attention through the PyTorch reference on the
    engine's own page pool (`reference_attention`; the CPU engine runs it already), on CUDA the products through torch
    (no GEMV kernel, no fused decode path) and no CUDA graphs, whose captured kernels would be the Triton backend's."""
    if device == "cpu":
        return {"dtype": "float32", "reference_attention": True}
    from lazyattn.envs import read_env

    env = replace(read_env(), gemv="0", decode_fusion=False, kv_layout="token")  # the reference's page layout
    return {"dtype": "float32", "reference_attention": True, "cuda_graphs": False, "warm_up": False, "env": env}


def answer(llm: Any, prompts: Sequence[Prompt], params: Any, batch_size: int) -> Answers:
    """Every prompt, `batch_size` per generate call, the document cache emptied before each call."""
    token_ids: list[list[int]] = []
    firsts: list[torch.Tensor] = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        llm.engine.reset_cache()
        outs = llm.chat(
            [p.messages for p in batch], params, documents=[list(p.documents) for p in batch], use_tqdm=False
        )
        for out in outs:
            completion = out.outputs[0]
            if completion.first_token_logprobs is None:
                raise RuntimeError(f"request {out.request_id} returned no first-token distribution ({out.error})")
            token_ids.append(list(completion.token_ids))
            firsts.append(completion.first_token_logprobs.float().cpu())
    return Answers(token_ids, firsts)


def batch_sizes(text: str, n: int) -> list[int]:
    """ "1,8,all" -> sorted distinct sizes, each at most n ("all": n)."""
    sizes = set()
    for t in text.split(","):
        t = t.strip()
        if t == "all":
            sizes.add(n)
        elif t.isdigit() and int(t) > 0:
            sizes.add(min(int(t), n))
        else:
            raise InvalidRequestError(f"--batch-sizes: expected positive integers or 'all', got {t!r}", "batch_sizes")
    return sorted(sizes)


@dataclass
class Plan:
    modes: list[str]
    dtypes: list[str]  # compared against the reference, at the largest batch size
    batch_dtypes: list[str]  # also run at every batch size
    sizes: list[int]  # ascending; the first is "alone", the last "all together"

    def engines(self) -> list[tuple[Engine, list[int]]]:
        """Every engine and the batch sizes it answers at, one mode after another."""
        out = []
        for mode in self.modes:
            out.append((Engine(mode, "float32", reference=True), [self.sizes[-1]]))
            for dtype in self.dtypes:
                out.append((Engine(mode, dtype), self.sizes if dtype in self.batch_dtypes else [self.sizes[-1]]))
        return out


def run_plan(
    plan: Plan,
    prompts: Sequence[Prompt],
    make_llm: Callable[[Engine], Any],
    params: Any,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stdout, flush=True),
    on_pass: Callable[[dict[tuple[Engine, int], Answers]], None] | None = None,
) -> dict[tuple[Engine, int], Answers]:
    """Every engine of the plan over every prompt at each of its batch sizes; one engine alive at a time.
    `on_pass(results so far)` after each pass, so that a report can be written as the run goes."""
    results: dict[tuple[Engine, int], Answers] = {}
    start = time.monotonic()
    for engine, sizes in plan.engines():
        with one_engine(make_llm, engine) as llm:
            for size in sorted(sizes, reverse=True):
                results[engine, size] = answer(llm, prompts, params, size)
                log(f"[{time.monotonic() - start:.0f} s] {engine.label}, batch {size}: {len(prompts)} answers")
                if on_pass is not None:
                    on_pass(results)
    return results


def passes(plan: Plan) -> int:
    """How many (engine, batch size) passes the plan makes."""
    return sum(len(sizes) for _, sizes in plan.engines())


def comparisons(
    plan: Plan, results: dict[tuple[Engine, int], Answers], memo: dict[tuple, Comparison] | None = None
) -> list[Comparison]:
    """Every dtype against its mode's reference, every batch size against batch 1, and the mode pairs in every
    dtype and batch size both modes ran at (the reference included). Of a run still going (`results` of the passes
    so far), the comparisons whose two sides are both there; `memo` keeps those computed by an earlier call, so a
    report rewritten after every pass computes each comparison once."""
    out: list[Comparison] = []
    top = plan.sizes[-1]
    memo = {} if memo is None else memo

    def pair(kind: str, run: tuple[Engine, int], against: tuple[Engine, int]) -> None:
        if run in results and against in results:
            if (kind, run, against) not in memo:
                label = lambda key: f"{key[0].label}, batch {key[1]}"  # noqa: E731
                memo[kind, run, against] = Comparison.of(
                    kind, label(run), label(against), results[run], results[against]
                )
            out.append(memo[kind, run, against])

    for mode in plan.modes:
        ref = Engine(mode, "float32", reference=True)
        for dtype in plan.dtypes:
            pair("dtype", (Engine(mode, dtype), top), (ref, top))
    for mode in plan.modes:
        for dtype in plan.batch_dtypes:
            for size in plan.sizes[1:]:
                pair("batch", (Engine(mode, dtype), size), (Engine(mode, dtype), plan.sizes[0]))
    for a, b in MODE_PAIRS:
        if a not in plan.modes or b not in plan.modes:
            continue
        keys = [(Engine(a, "float32", reference=True), top)]
        keys += [(Engine(a, d), s) for d in plan.dtypes for s in (plan.sizes if d in plan.batch_dtypes else [top])]
        for ea, size in keys:
            pair("mode", (ea, size), (replace(ea, mode=b), size))
    return out


# -- report ----------------------------------------------------------------------------------------------------


def rows(comps: Sequence[Comparison]) -> list[dict[str, Any]]:
    """One table row per comparison, shares in percent, KL in nats."""
    out = []
    for c in comps:
        s = c.summary()
        ci, kl_ci = s["identical_ci"], s["kl_ci"]
        out.append(
            {
                "kind": s["kind"],
                "run": s["run"],
                "against": s["against"],
                "n": s["n"],
                "identical": None if s["identical"] is None else 100 * s["identical"],
                "identical_ci": None if ci is None else f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]",
                "diverging": s["diverging"],
                "div_mean": s["divergence_mean"],
                "div_median": s["divergence_median"],
                "kl_mean": s["kl_mean"],
                "kl_ci": None if kl_ci is None else f"[{_g(kl_ci[0])}, {_g(kl_ci[1])}]",
                "kl_max": s["kl_max"],
            }
        )
    return out


def _g(x: float) -> str:
    """A KL value: 0 as 0, else three significant digits (values span 1e-12 to 1)."""
    return "0" if x == 0 else "inf" if math.isinf(x) else f"{x:.3g}"


COLUMNS = [
    ("compared", "kind", "{}"),
    ("run", "run", "{}"),
    ("against", "against", "{}"),
    ("n", "n", "{}"),
    ("identical %", "identical", "{:.1f}"),
    (f"{CONFIDENCE:.0%} CI", "identical_ci", "{}"),
    ("differ", "diverging", "{}"),
    ("first diff mean", "div_mean", "{:.1f}"),
    ("first diff median", "div_median", "{:.1f}"),
    ("KL mean", "kl_mean", "{}"),
    ("KL CI", "kl_ci", "{}"),
    ("KL max", "kl_max", "{}"),
]


def _formatted(table_rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """KL columns as text (the shared table helpers format with one format string per column)."""
    return [{**r, **{k: _g(r[k]) for k in ("kl_mean", "kl_max") if r.get(k) is not None}} for r in table_rows]


def text_table(table_rows: Sequence[dict[str, Any]]) -> str:
    from lazyattn.bench.report import text_table as table

    return table(_formatted(table_rows), COLUMNS)


def markdown_table(table_rows: Sequence[dict[str, Any]]) -> str:
    from lazyattn.bench.report import markdown_table as table

    return table(_formatted(table_rows), COLUMNS)
