"""lazyattn: a RAG inference engine that caches each document's KV once and places it anywhere."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["LLM", "RequestOptions", "SamplingParams", "__version__"]

if TYPE_CHECKING:
    from lazyattn.engine.llm import LLM
    from lazyattn.engine.request_options import RequestOptions
    from lazyattn.engine.sampling import SamplingParams


def __getattr__(name: str) -> Any:
    # Lazy, so that `import lazyattn.kernels...` does not pull in the engine (and its dependencies).
    if name == "LLM":
        from lazyattn.engine.llm import LLM

        return LLM
    if name == "RequestOptions":
        from lazyattn.engine.request_options import RequestOptions

        return RequestOptions
    if name == "SamplingParams":
        from lazyattn.engine.sampling import SamplingParams

        return SamplingParams
    raise AttributeError(name)
