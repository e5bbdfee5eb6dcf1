"""The four modes of docs/design.md, one small class each, chosen once per engine.

A mode decides what a sequence reuses and how it reads it; the scheduler, the cache, the model and the kernels
are the same for all four. Everything mode-specific is in this package: what every mode answers and what it may
ask of the cache (`base.py`), the modes that cache documents (`documents.py`: lazy, block) and the ordinary causal
ones (`causal.py`: prefix, full).
"""

from __future__ import annotations

from lazyattn.engine.config import MODES
from lazyattn.engine.modes.base import DocumentSource, Mode
from lazyattn.engine.modes.causal import FullMode, PrefixMode, PrefixState
from lazyattn.engine.modes.documents import BlockMode, BlockState, LazyMode, LazyState, relink_rows, with_ape
from lazyattn.errors import InvalidRequestError

__all__ = [
    "MODE_CLASSES",
    "BlockMode",
    "BlockState",
    "DocumentSource",
    "FullMode",
    "LazyMode",
    "LazyState",
    "Mode",
    "PrefixMode",
    "PrefixState",
    "make_mode",
    "relink_rows",
    "with_ape",
]

# The implementation of each of config.MODES (the one list of mode names), by name.
MODE_CLASSES: dict[str, type[Mode]] = {m.name: m for m in (LazyMode, BlockMode, PrefixMode, FullMode)}


def make_mode(name: str) -> Mode:
    try:
        return MODE_CLASSES[name]()
    except KeyError:
        raise InvalidRequestError(f"mode must be one of {', '.join(MODES)}, got {name!r}", "mode") from None
