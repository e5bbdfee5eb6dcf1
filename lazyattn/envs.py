"""Every `LAZYATTN_*` environment variable, declared once: name, type, default, what it does.

`read_env()` parses all of them at once into a frozen `EnvSettings`; EngineConfig holds one (its `env` field, read
when the config is made) and the engine passes it down. Nothing else reads these variables, except LAZYATTN_CACHE
(the model cache, read through `read_var` by model/hub.py) and LAZYATTN_API_KEYS (read through `read_var` when the
server starts).

The kernels' toggles (LAZYATTN_GEMV*, LAZYATTN_PDL, LAZYATTN_GLUON_PREFILL, LAZYATTN_DECODE_TMA) are decided at
launch time deep inside the model, so they come from the settings `activate`d for the process rather than through
every call: the engine activates its config's settings at construction, before it loads the model, warms up or
captures CUDA graphs. Invariant: one set of kernel settings per process while an engine runs, so a captured graph
and an eager step launch the same kernels; a second engine made in the same process with other settings changes
them for both. Kernels used without an engine (tests, benchmarks) take the environment as first read.

`python -m lazyattn.envs --markdown` prints the README's table.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lazyattn.errors import InvalidRequestError

# The kernel families a launcher names to launch.pdl_options (LAZYATTN_PDL lists some of them).
PDL_FAMILIES = ("gemv", "attention", "rope", "norm", "sampling")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _bad(name: str, raw: str, accepted: str) -> InvalidRequestError:
    # InvalidRequestError is a ValueError; the server maps it to a 400 naming the variable.
    return InvalidRequestError(f"{name}={raw!r}: expected {accepted}", param=name)


def _flag(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise _bad(name, raw, f"one of {', '.join(_TRUE + _FALSE)}")


def _choice(*choices: str, aliases: Mapping[str, str] | None = None) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        value = raw.strip().lower()
        value = (aliases or {}).get(value, value)
        if value not in choices:
            raise _bad(name, raw, f"one of {', '.join(choices)}")
        return value

    return parse


def _integer(minimum: int) -> Callable[[str, str], int]:
    def parse(name: str, raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise _bad(name, raw, f"an integer >= {minimum}")
        return value

    return parse


def _seconds(positive: bool) -> Callable[[str, str], float]:
    def parse(name: str, raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            value = float("nan")
        if not (value > 0 if positive else value >= 0):
            raise _bad(name, raw, f"a number of seconds {'> 0' if positive else '>= 0'}")
        return value

    return parse


def _text(name: str, raw: str) -> str:
    return raw.strip()


def _directory(name: str, raw: str) -> str:
    value = raw.strip()
    if not value:
        raise _bad(name, raw, "a directory (unset the variable for the default)")
    return value


def _pdl(name: str, raw: str) -> str:
    value = raw.strip().lower()
    if value in ("auto", "1", "0"):
        return value
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in PDL_FAMILIES]
    if not names or unknown:
        why = f" ({', '.join(unknown)}: no such kernel family)" if unknown and len(names) > 1 else ""
        raise _bad(name, raw, f"auto, 1, 0 or a comma-separated list of {', '.join(PDL_FAMILIES)}{why}")
    return ",".join(names)


def _keys(name: str, raw: str) -> tuple[str, ...]:
    return tuple(k.strip() for k in raw.split(",") if k.strip())


@dataclass(frozen=True)
class Var:
    """One variable: its name, the type shown in the README, the default (when unset or empty), what it does, and
    the parser of its text (raises InvalidRequestError naming the variable)."""

    name: str
    type: str
    default: Any
    doc: str
    parse: Callable[[str, str], Any]
    shown_default: str | None = None  # the README's words for the default, where `default` (None) says nothing
    # Whether an empty value means the default, as unset does; else the parser sees it (and may refuse it).
    empty_is_default: bool = True


def _var(name: str, type: str, default: Any, doc: str, parse: Callable, shown: str | None = None) -> Any:
    return field(default=default, metadata={"var": Var(name, type, default, doc, parse, shown)})


@dataclass(frozen=True)
class EnvSettings:
    """The parsed `LAZYATTN_*` variables (read_env). Field order is the README table's."""

    decode_fusion: bool = _var(
        "LAZYATTN_DECODE_FUSION",
        "bool",
        True,
        "Fold the RMSNorm weights and run the fused decode path on CUDA (0: norms and adds as kernels of their own).",
        _flag,
    )
    kv_layout: str = _var(
        "LAZYATTN_KV_LAYOUT",
        "token / head",
        "token",
        "Memory order of the KV pages: `token` (slot by slot, every kv head) or `head` (each kv head's rows together).",
        _choice("token", "head"),
    )
    prefill_plan: bool = _var(
        "LAZYATTN_PREFILL_PLAN",
        "bool",
        True,
        "Captured prefill steps take the host's split plan where prefill.py's kernel reads one (0: no plans).",
        _flag,
    )
    gluon_prefill: bool = _var(
        "LAZYATTN_GLUON_PREFILL",
        "bool",
        True,
        "Short prefill calls on Hopper take the Gluon kernel where it supports them (0: prefill.py's kernel).",
        _flag,
    )
    decode_tma: bool = _var(
        "LAZYATTN_DECODE_TMA",
        "bool",
        True,
        "Decode may load K/V tiles with the copy engine (TMA) on Hopper or later (0: per-thread copies only).",
        _flag,
    )
    pdl: str = _var(
        "LAZYATTN_PDL",
        "auto / 1 / 0 / families",
        "auto",
        "Kernel families launched with programmatic dependent launch: the device's measured default, all, none, "
        f"or a comma-separated list of {', '.join(PDL_FAMILIES)}.",
        _pdl,
    )
    gemv: str = _var(
        "LAZYATTN_GEMV",
        "auto / 0 / force",
        "auto",
        "Skinny products through the GEMV kernel where its table measured it faster (0: never; force: every CUDA "
        "product of at most 64 rows).",
        _choice("auto", "0", "force", aliases={"off": "0", "1": "auto"}),
    )
    gemv_table: str | None = _var(
        "LAZYATTN_GEMV_TABLE",
        "path",
        None,
        "The GEMV dispatch table to read instead of the shipped kernels/gemv_table.json.",
        _text,
        "the shipped table",
    )
    gemv_max_m: int = _var(
        "LAZYATTN_GEMV_MAX_M",
        "int",
        64,
        "Most rows of a product the GEMV table's decisions are used for.",
        _integer(0),
    )
    gemv_prefetch: int = _var(
        "LAZYATTN_GEMV_PREFETCH",
        "int",
        0,
        "128-byte lines of each weight row a GEMV program prefetches before it waits under PDL.",
        _integer(0),
    )
    tp_allreduce: str = _var(
        "LAZYATTN_TP_ALLREDUCE",
        "auto / nccl / symm_mem",
        "auto",
        "Tensor parallelism's all-reduce: symmetric memory where available else NCCL, NCCL, or symmetric memory "
        "(required).",
        _choice("auto", "nccl", "symm_mem"),
    )
    tp_probe_timeout_s: float = _var(
        "LAZYATTN_TP_PROBE_TIMEOUT_S",
        "float",
        60.0,
        "Seconds the symmetric-memory rendezvous waits for the peers before NCCL serves.",
        _seconds(positive=True),
    )
    tp_stacks_after_s: float = _var(
        "LAZYATTN_TP_STACKS_AFTER_S",
        "float",
        0.0,
        "Seconds after which a starting tensor-parallel worker prints its threads' stacks, and again as often "
        "(0: never).",
        _seconds(positive=False),
    )
    tp_trace: str | None = _var(
        "LAZYATTN_TP_TRACE",
        "path",
        None,
        "Directory where every tensor-parallel rank writes dispatch_rank{r}.json (dispatch latencies) when it stops.",
        _text,
        "unset",
    )
    check_invariants: bool = _var(
        "LAZYATTN_CHECK_INVARIANTS",
        "bool",
        False,
        "Check the document cache's and the scheduler's invariants after every engine step (the CPU test suite "
        "turns it on).",
        _flag,
    )


# Read where they are used, through read_var, not part of the engine's settings.
CACHE = Var(
    "LAZYATTN_CACHE",
    "path",
    None,
    "Cache directory: fetched checkpoints and GGUF files, and `lazyattn serve`'s state (state/: the document "
    "registry). Set, it must not be empty.",
    _directory,
    "`$XDG_CACHE_HOME/lazyattn`, else `~/.cache/lazyattn`",
    # An empty value is a mistake (a variable expanded from nothing), not a request for ~/.cache: models and the
    # server's state would quietly land elsewhere than meant.
    empty_is_default=False,
)
API_KEYS = Var(
    "LAZYATTN_API_KEYS",
    "list",
    (),
    "Comma-separated API keys `lazyattn serve` accepts, besides --api-key.",
    _keys,
    "none",
)


def variables() -> list[Var]:
    """Every variable, in the README table's order."""
    return [f.metadata["var"] for f in dataclasses.fields(EnvSettings)] + [CACHE, API_KEYS]


def _parse(var: Var, environ: Mapping[str, str]) -> Any:
    raw = environ.get(var.name)
    if raw is None or (var.empty_is_default and not raw.strip()):
        return var.default
    return var.parse(var.name, raw)


def read_env(environ: Mapping[str, str] | None = None) -> EnvSettings:
    """Every engine setting from `environ` (default: os.environ), parsed; a bad value raises InvalidRequestError
    (a ValueError) naming the variable and what it accepts."""
    environ = os.environ if environ is None else environ
    return EnvSettings(**{f.name: _parse(f.metadata["var"], environ) for f in dataclasses.fields(EnvSettings)})


def read_var(var: Var, environ: Mapping[str, str] | None = None) -> Any:
    """One variable outside EnvSettings (CACHE, API_KEYS), parsed now."""
    return _parse(var, os.environ if environ is None else environ)


def changed(before: EnvSettings, after: EnvSettings) -> list[str]:
    """The variables whose settings differ, as NAME=value of `after`."""
    return [
        f"{f.metadata['var'].name}={getattr(after, f.name)!r}"
        for f in dataclasses.fields(EnvSettings)
        if getattr(before, f.name) != getattr(after, f.name)
    ]


_active: EnvSettings | None = None


def activate(settings: EnvSettings) -> EnvSettings | None:
    """Make `settings` the kernels' settings for this process (the module docstring); returns the previous ones."""
    global _active
    previous, _active = _active, settings
    return previous


def active() -> EnvSettings:
    """The kernels' settings: those activated by the engine, else the environment as first read."""
    global _active
    if _active is None:
        _active = read_env()
    return _active


def markdown() -> str:
    """The README's table of variables."""
    rows = ["| Variable | Type | Default | What it does |", "| --- | --- | --- | --- |"]
    for v in variables():
        if v.shown_default is not None:
            default = v.shown_default
        elif isinstance(v.default, bool):
            default = "`1`" if v.default else "`0`"
        else:
            default = f"`{v.default:g}`" if isinstance(v.default, float) else f"`{v.default}`"
        rows.append(f"| `{v.name}` | {v.type} | {default} | {v.doc} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lazyattn.envs", description="The LAZYATTN_* environment variables.")
    p.add_argument("--markdown", action="store_true", help="print the README's table (default: current values)")
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown(), end="")
    else:
        settings = read_env()
        for f in dataclasses.fields(EnvSettings):
            print(f"{f.metadata['var'].name}={getattr(settings, f.name)!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
