"""A request's own values of the engine options it may set: relink rows (first and last) and APE's temperature,
scale, tilt, shared prefix and parallel placement (docs/design.md, "Relink" and "APE").

One frozen dataclass from the API to the kernels: `LLM.generate`/`LLM.chat` and the server (from the JSON body) build
it, `LLMEngine.add_request` takes it, the engine fills what it leaves None with its own settings (`EngineConfig`'s
fields of the same names) and checks the values against its mode (`resolve`), and each sequence carries the resolved
options to where admission, the modes and the kernels' page tables read them (engine/admission.py,
engine/modes/documents.py). Every check of these values is here: `EngineConfig` checks its defaults with the same
functions, and the server's schema takes its bound from `APE_MIN_TEMPERATURE`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lazyattn.errors import InvalidRequestError

# The smallest attention temperature on documents. The kernels multiply scores by 1/T in float32: far below it they
# overflow to infinity and the logits come out NaN (T = 1e-40 does on the CPU), while at 1/T = 1000 the documents'
# weights are an argmax already.
APE_MIN_TEMPERATURE = 1e-3
# The largest tilt: e^(tilt / 2) = e^10 between the first document's weight and the others' is far past any use, and
# keeps the scores finite in float32.
APE_MAX_TILT = 20.0


def check_relink(mode: str, rows: int, name: str = "relink_tokens") -> None:
    """Relink (`relink_tokens`, the first rows of each placed document; `relink_last_tokens`, its last rows) is a
    lazy-mode option: prefix and full read every document in context already, and block mode's private copies are
    not relinked (docs/design.md, "Relink")."""
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
        raise InvalidRequestError(f"{name} must be an integer >= 0, got {rows!r}", name)
    if rows and mode != "lazy":
        why = (
            "block mode reads private re-rotated copies; relink is implemented for lazy mode only"
            if mode == "block"
            else f"{mode} mode attends to every document in context already"
        )
        raise InvalidRequestError(f"{name}={rows} needs mode 'lazy': {why}", name)


def check_ape(mode: str, temperature: float, scale: float, prefix: bool = False, tilt: float = 0.0) -> None:
    """The attention temperature, scale and tilt on documents (docs/design.md, "APE") are options of the block
    semantics: lazy and block mode; prefix and full attend to every document in context already. The shared prefix
    (documents encoded after the first segment) is lazy mode's: block mode's private copies are rotated from
    position 0."""
    _check_lazy_switch(
        "ape_prefix", prefix, mode, "copies documents encoded at position 0", "attends to everything in context"
    )
    for name, value in (("ape_temperature", temperature), ("ape_scale", scale)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise InvalidRequestError(f"{name} must be a finite number > 0, got {value!r}", name)
    if temperature < APE_MIN_TEMPERATURE:
        raise InvalidRequestError(
            f"ape_temperature must be at least {APE_MIN_TEMPERATURE} (1/T scales the scores in float32), "
            f"got {temperature!r}",
            "ape_temperature",
        )
    if isinstance(tilt, bool) or not isinstance(tilt, (int, float)) or not abs(tilt) <= APE_MAX_TILT:
        raise InvalidRequestError(
            f"ape_tilt must be a number in [-{APE_MAX_TILT}, {APE_MAX_TILT}], got {tilt!r}", "ape_tilt"
        )
    if (temperature != 1 or scale != 1 or tilt != 0) and mode not in ("lazy", "block"):
        param = "ape_temperature" if temperature != 1 else "ape_scale" if scale != 1 else "ape_tilt"
        raise InvalidRequestError(
            f"ape_temperature={temperature}, ape_scale={scale}, ape_tilt={tilt} need mode 'lazy' or 'block': {mode} "
            "mode attends to every document in context already",
            param,
        )


def check_parallel(mode: str, parallel: bool, relink: tuple[int, int]) -> None:
    """Every document at the first segment's end (`ape_parallel`, docs/design.md "APE") is lazy mode's: block mode
    copies each document to its sequential start, prefix and full mode read the prompt in order. Relinked rows are
    recomputed at the sequential positions, so the two do not combine."""
    _check_lazy_switch(
        "ape_parallel", parallel, mode, "copies each document to its place in order", "reads the prompt in order"
    )
    if parallel and any(relink):
        raise InvalidRequestError(
            "ape_parallel does not combine with relink_tokens or relink_last_tokens: relinked rows are recomputed at "
            "the documents' positions in order",
            "ape_parallel",
        )


def _check_lazy_switch(name: str, value: object, mode: str, in_block: str, elsewhere: str) -> None:
    """A lazy-mode switch: true or false, and true only in lazy mode (what block mode, and the causal modes, do
    instead: `in_block`, `elsewhere`)."""
    if not isinstance(value, bool):
        raise InvalidRequestError(f"{name} must be true or false, got {value!r}", name)
    if value and mode != "lazy":
        raise InvalidRequestError(
            f"{name} needs mode 'lazy': {mode} mode " + (in_block if mode == "block" else elsewhere), name
        )


def document_log_scales(scale: float, tilt: float, n: int) -> list[float]:
    """ln S_i of the n documents after the first segment, in slot order (docs/design.md, "APE"): ln S plus the tilt
    spread evenly from +tilt/2 on the first document to -tilt/2 on the last (one document: ln S)."""
    base = math.log(scale)
    if n < 2 or not tilt:
        return [base] * n
    return [base + tilt * (0.5 - i / (n - 1)) for i in range(n)]


@dataclass(frozen=True)
class RequestOptions:
    """A request's options; a field left None is the engine's setting. Resolved (`resolve`, what a sequence
    carries), no field is None.

    relink_tokens, relink_last_tokens: the first and the last rows of each placed document recomputed in the
    request's context (lazy mode).
    ape_temperature, ape_scale: T and S on the final segment's attention to the documents after the first (lazy and
    block mode; 1: off). ape_prefix: documents encoded after the first segment (lazy mode), also for a prefill-only
    request. ape_tilt: ln S raised by tilt/2 on the first document, lowered by tilt/2 on the last, evenly between
    (lazy and block mode; 0: off). ape_parallel: every document read from the first segment's end, the final segment
    after the longest (lazy mode, no relink)."""

    relink_tokens: int | None = None
    ape_temperature: float | None = None
    ape_scale: float | None = None
    ape_prefix: bool | None = None
    ape_tilt: float | None = None
    relink_last_tokens: int | None = None
    ape_parallel: bool | None = None

    @property
    def relink(self) -> tuple[int, int]:
        """(first, last) relinked rows of resolved options."""
        return self.relink_tokens, self.relink_last_tokens  # type: ignore[return-value]

    @property
    def ape(self) -> tuple[float, float]:
        """(T, S) of resolved options."""
        return self.ape_temperature, self.ape_scale  # type: ignore[return-value]

    def resolve(self, defaults: RequestOptions, mode: str, prefill_only: bool = False) -> RequestOptions:
        """The options with the fields left None taken from `defaults` (the engine's, resolved), checked against
        `mode`; raises InvalidRequestError naming the field. A prefill-only request computes no final segment: it
        relinks nothing and weighs nothing, whatever it asks."""
        if prefill_only:
            relink, last, t, s, tilt, parallel = 0, 0, 1.0, 1.0, 0.0, False
        else:
            relink = defaults.relink_tokens if self.relink_tokens is None else self.relink_tokens
            last = defaults.relink_last_tokens if self.relink_last_tokens is None else self.relink_last_tokens
            t = defaults.ape_temperature if self.ape_temperature is None else self.ape_temperature
            s = defaults.ape_scale if self.ape_scale is None else self.ape_scale
            tilt = defaults.ape_tilt if self.ape_tilt is None else self.ape_tilt
            parallel = defaults.ape_parallel if self.ape_parallel is None else self.ape_parallel
        prefix = defaults.ape_prefix if self.ape_prefix is None else self.ape_prefix
        check_relink(mode, relink)
        check_relink(mode, last, "relink_last_tokens")
        check_ape(mode, t, s, tilt=tilt)
        check_ape(mode, 1.0, 1.0, prefix)
        check_parallel(mode, parallel, (relink, last))
        return RequestOptions(relink, float(t), float(s), prefix, float(tilt), last, parallel)


ENGINE_DEFAULTS = RequestOptions()  # a request that sets none of them: the engine's settings
# The options off, resolved: no relink rows, T = S = 1, no tilt, documents encoded alone (a sequence made without
# options).
OFF = RequestOptions(
    relink_tokens=0,
    ape_temperature=1.0,
    ape_scale=1.0,
    ape_prefix=False,
    ape_tilt=0.0,
    relink_last_tokens=0,
    ape_parallel=False,
)
