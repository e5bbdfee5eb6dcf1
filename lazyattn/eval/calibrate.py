"""`lazyattn eval --calibrate`: the APE setting (and, if asked, the relinked last rows) that brings lazy mode closest to
full attention on your own documents (docs/quality.md, "Calibrating APE").

No labels are needed. Prompts are made from the documents (finetune/prompts.py: k documents in a random order, a
question about one of them, gold first, in the middle or last in equal shares), or taken from a questions file.
Each prompt is answered once under full attention and once per candidate setting in lazy mode (`ape_prefix` on or
off, each `ape_temperature` T, `ape_scale` S, `ape_tilt` and `relink_last_tokens` of the grid: per-request options of
one engine; a few-shot set's prompts as plain text, the way it is scored), and
compared at the first generated token, where both read the same prompt: KL(P_full || P_lazy) of the next-token
distributions, and whether the greedy answers are identical.

The setting chosen is the one whose *worst* gold position has the lowest mean KL, so that no position is given up
for another; ties go to the lower mean over all prompts, then to the setting listed first. Its options are what
`LLM(...)` and `lazyattn serve` take (`options`, `serve_flags`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import Any

from lazyattn.engine.config import cli_flags
from lazyattn.errors import InvalidRequestError
from lazyattn.eval.metrics import bootstrap_ci

POSITIONS = ("first", "middle", "last")


@dataclass(frozen=True)
class Setting:
    """One candidate: lazy mode's APE options."""

    ape_prefix: bool
    ape_temperature: float = 1.0
    ape_scale: float = 1.0
    ape_tilt: float = 0.0
    relink_last_tokens: int = 0

    @property
    def label(self) -> str:
        tilt = f", tilt {self.ape_tilt:g}" if self.ape_tilt else ""
        last = f", last {self.relink_last_tokens}" if self.relink_last_tokens else ""
        return (
            f"prefix {'on' if self.ape_prefix else 'off'}, T {self.ape_temperature:g}, S {self.ape_scale:g}{tilt}{last}"
        )

    @property
    def options(self) -> dict[str, Any]:
        """The engine options (LLM(...), EngineConfig) of this setting."""
        return {
            "ape_prefix": self.ape_prefix,
            "ape_temperature": self.ape_temperature,
            "ape_scale": self.ape_scale,
            "ape_tilt": self.ape_tilt,
            "relink_last_tokens": self.relink_last_tokens,
        }

    @property
    def serve_flags(self) -> str:
        """The same as `lazyattn serve` flags (the defaults left out)."""
        return cli_flags(self.options)


def grid(
    prefix: str,
    temperatures: Sequence[float],
    scales: Sequence[float],
    tilts: Sequence[float] = (0.0,),
    relink_last: Sequence[int] = (0,),
) -> list[Setting]:
    """Every combination; `prefix` is "on", "off" or "both"."""
    if prefix not in ("on", "off", "both"):
        raise InvalidRequestError(f"prefix must be on, off or both, got {prefix!r}", param="calibrate_prefix")
    if not temperatures or not scales or not tilts or not relink_last:
        raise InvalidRequestError(
            "the grid needs at least one temperature, scale, tilt and relink count", param="calibrate"
        )
    if min(temperatures) <= 0 or min(scales) <= 0:
        raise InvalidRequestError("temperatures and scales must be positive", param="calibrate")
    if min(relink_last) < 0:
        raise InvalidRequestError("relink counts must be 0 or more", param="calibrate")
    prefixes = {"on": (True,), "off": (False,), "both": (True, False)}[prefix]
    return [
        Setting(p, float(t), float(s), float(tilt), int(m))
        for p, t, s, tilt, m in product(prefixes, temperatures, scales, tilts, relink_last)
    ]


@dataclass(frozen=True)
class CalibrationPrompt:
    messages: list[dict[str, str]]
    documents: list[Any]
    position: str  # the gold document's place: first, middle or last ("original": a file's own order)
    plain: str | None = None  # a plain-text prompt (`LLM.generate`) in place of the chat `messages`


def position_of(gold: int, k: int) -> str:
    """The place of document `gold` among k, as `lazyattn eval` names its cells (middle: any inner slot)."""
    return "first" if gold == 0 else "last" if gold == k - 1 else "middle"


@dataclass
class SettingResult:
    setting: Setting
    kl: list[float]  # per prompt, KL(P_full || P_lazy) at the first generated token
    identical: list[bool]  # per prompt, the greedy answers equal token for token
    positions: list[str]

    @property
    def mean_kl(self) -> float:
        return statistics.fmean(self.kl)

    def kl_by_position(self) -> dict[str, float]:
        out = {}
        for pos in dict.fromkeys(self.positions):
            values = [k for k, p in zip(self.kl, self.positions) if p == pos]
            out[pos] = statistics.fmean(values)
        return out

    @property
    def worst_kl(self) -> float:
        return max(self.kl_by_position().values())

    def row(self) -> dict[str, Any]:
        ci = bootstrap_ci(self.kl)
        return {
            "setting": self.setting.label,
            **self.setting.options,
            "mean_kl": self.mean_kl,
            "mean_kl_ci": None if ci is None else list(ci),
            "kl_by_position": self.kl_by_position(),
            "worst_position_kl": self.worst_kl,
            "identical_answers": sum(self.identical) / len(self.identical),
        }


@dataclass
class Calibration:
    results: list[SettingResult]
    prompts: int
    chosen: Setting = field(init=False)

    def __post_init__(self) -> None:
        if not self.results:
            raise InvalidRequestError("no setting was measured", param="calibrate")
        best = min(range(len(self.results)), key=lambda i: (self.results[i].worst_kl, self.results[i].mean_kl, i))
        self.chosen = self.results[best].setting


def calibrate(
    full: Any,
    lazy: Any,
    prompts: Sequence[CalibrationPrompt],
    settings: Sequence[Setting],
    params: Any,
    batch_size: int = 1,
    progress: Callable[[str], None] | None = None,
) -> Calibration:
    """`full`, `lazy`: LLM-like engines (their `chat`), or zero-argument callables that make one (each is shut down
    before the next is made, so that one GPU holds one engine). `params` must ask for `first_token_logprobs`."""
    from lazyattn.engine.request_options import RequestOptions
    from lazyattn.eval.fidelity import kl_divergence
    from lazyattn.eval.harness import one_engine

    if not prompts:
        raise InvalidRequestError("no prompt to calibrate on", param="calibrate")
    say = progress or (lambda _: None)

    if len({p.plain is None for p in prompts}) > 1:
        raise InvalidRequestError("calibration prompts are all chat or all plain text", param="calibrate")

    def ask(llm: Any, batch: Sequence[CalibrationPrompt], options: RequestOptions | None) -> list[Any]:
        documents = [p.documents for p in batch]
        if batch[0].plain is not None:
            return llm.generate([p.plain for p in batch], params, documents=documents, options=options)
        return llm.chat([p.messages for p in batch], params, documents=documents, options=options)

    def run(llm: Any, options: RequestOptions | None) -> list[Any]:
        outs = []
        for start in range(0, len(prompts), batch_size):
            outs += ask(llm, prompts[start : start + batch_size], options)
        completions = [o.outputs[0] for o in outs]
        for o, c in zip(outs, completions):
            if c.first_token_logprobs is None:
                raise RuntimeError(f"request {o.request_id} returned no first-token distribution ({o.error})")
        return completions

    with one_engine(lambda _: full() if callable(full) else full, None) as llm:
        reference = run(llm, None)
    say(f"full attention: {len(prompts)} prompts")
    results = []
    positions = [p.position for p in prompts]
    with one_engine(lambda _: lazy() if callable(lazy) else lazy, None) as llm:
        for setting in settings:
            got = run(llm, RequestOptions(**setting.options))
            kl = [
                float(kl_divergence(r.first_token_logprobs.float().cpu(), g.first_token_logprobs.float().cpu()))
                for r, g in zip(reference, got)
            ]
            same = [list(r.token_ids) == list(g.token_ids) for r, g in zip(reference, got)]
            results.append(SettingResult(setting, kl, same, positions))
            say(f"{setting.label}: mean KL {results[-1].mean_kl:.4f}, worst position {results[-1].worst_kl:.4f}")
    return Calibration(results, len(prompts))


def overlapping(cal: Calibration) -> list[Setting]:
    """The other settings whose mean-KL interval overlaps the chosen one's: the prompts do not tell them apart."""
    chosen = next(r for r in cal.results if r.setting == cal.chosen)
    lo, hi = bootstrap_ci(chosen.kl) or (chosen.mean_kl, chosen.mean_kl)
    out = []
    for r in cal.results:
        ci = bootstrap_ci(r.kl)
        if r is not chosen and ci is not None and ci[0] <= hi and lo <= ci[1]:
            out.append(r.setting)
    return out


def markdown(cal: Calibration) -> str:
    """The table of every setting (KL per gold position, identical answers), the chosen one in bold."""
    positions = [p for p in (*POSITIONS, "original") if p in cal.results[0].kl_by_position()]
    head = ["setting", "mean KL [95 % CI]", *(f"KL, gold {p}" for p in positions), "identical answers"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in cal.results:
        row = r.row()
        ci = row["mean_kl_ci"]
        mean = f"{row['mean_kl']:.4f}" + ("" if ci is None else f" [{ci[0]:.4f}, {ci[1]:.4f}]")
        by = row["kl_by_position"]
        label = f"**{r.setting.label}**" if r.setting == cal.chosen else r.setting.label
        cells = [label, mean, *(f"{by[p]:.4f}" for p in positions), f"{100 * row['identical_answers']:.1f} %"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
