"""EngineConfig.gc_freeze: the objects that exist once the engine is built are out of Python's garbage collections
until shutdown."""

from __future__ import annotations

import gc

from lazyattn.engine.config import EngineConfig
from lazyattn.engine.llm_engine import LLMEngine


def test_gc_freeze_until_shutdown():
    """gc_freeze: what exists once the engine is built is out of collections (frozen) until shutdown."""
    before = gc.get_freeze_count()
    engine = LLMEngine(EngineConfig(model="tiny", mode="lazy", page_size=16, progress=False, gc_freeze=True))
    try:
        assert gc.get_freeze_count() > before
        assert not any(o is engine.scheduler for o in gc.get_objects())  # frozen objects are not tracked any more
    finally:
        engine.shutdown()
    assert gc.get_freeze_count() == 0


def test_gc_freeze_until_the_last_engine_shuts_down():
    """Two frozen engines: the first to shut down leaves the heap frozen for the other."""
    config = EngineConfig(model="tiny", mode="lazy", page_size=16, progress=False, gc_freeze=True)
    first = LLMEngine(config)
    second = LLMEngine(config)
    try:
        first.shutdown()
        assert gc.get_freeze_count() > 0
        assert not any(o is second.scheduler for o in gc.get_objects())
    finally:
        second.shutdown()
    assert gc.get_freeze_count() == 0
