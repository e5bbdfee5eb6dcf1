"""prefix and full: ordinary causal attention over the concatenated prompt, keys at absolute positions. prefix
reuses exact token prefixes page by page (vLLM-style); full reuses nothing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lazyattn.engine.modes.base import DocumentSource, Mode
from lazyattn.engine.sequence import ModeState, Part, Run, Sequence
from lazyattn.kernels.paged import EntryPages, cdiv

if TYPE_CHECKING:
    from lazyattn.cache.document_cache import Segment


class _CausalMode(Mode):
    """What prefix and full share: the page count, and the context of cached pages read at delta 0."""

    def pages_needed(
        self, segment_lens: list[int], run_tokens: int, n: int, page_size: int, relink: tuple[int, int] = (0, 0)
    ) -> int:
        return n * cdiv(sum(segment_lens) + run_tokens, page_size)

    def context(self, seq: Sequence, page_size: int) -> EntryPages:
        # Cached prefix pages this sequence did not compute itself; delta 0: keys sit at absolute positions.
        pages = [page for p in seq.parts for page in p.segment.pages]
        return EntryPages(pages, [0] * len(pages), [page_size] * len(pages))


@dataclass
class PrefixState(ModeState):
    """The pages of a sequence's prompt that it missed in the cache, cached under their chained keys as its own run
    computes them (the run's first pages, in order)."""

    segments: list[Segment] = field(default_factory=list)

    def filled_segments(self) -> list[Segment]:
        return self.segments


class PrefixMode(_CausalMode):
    """vLLM-style prefix caching: the prompt's full pages are cached under chained keys and reused only for an
    exact token prefix; the sequence computes the pages it misses itself (and caches them)."""

    name = "prefix"

    def new_state(self) -> PrefixState:
        return PrefixState()

    def admit(self, source: DocumentSource, seq: Sequence, acquired: list[Part], state: PrefixState) -> Run:
        tokens = seq.all_tokens
        ps = source.page_size
        # Each new page goes into `state` as it is acquired: a failed admission lets go of what it filled so far.
        parent = None
        # The last token is never cached: its logits are needed, so the sequence computes it.
        for b in range((len(tokens) - 1) // ps):
            key = source.chain_key(tokens[b * ps : (b + 1) * ps], seq.salt, parent)
            if state.segments and source.holds(key):
                break  # an orphan left after its parent was evicted: keep the rest private
            segment, is_new = source.acquire_key(key, ps)
            if is_new:  # this and every page after it: computed by the sequence's own run
                state.segments.append(segment)
            else:
                acquired.append(Part(segment, b * ps, ps, hit=True))
            parent = key
        start = len(acquired) * ps
        pages = [page for segment in state.segments for page in segment.pages]
        return Run(tokens[start:], start_pos=start, pages=pages, owned=len(pages))

    def reused_documents(self, cached_tokens: int, system_len: int, doc_len: int, num_docs: int) -> float:
        # A reused prefix is whole pages and may end inside a document (always, once BOS shifts documents off
        # page boundaries): the reused share of the document tokens, in documents.
        return max(0.0, min(float(num_docs), (cached_tokens - system_len) / doc_len))


class FullMode(_CausalMode):
    """No caching: every request computes its whole prompt."""

    name = "full"

    def admit(self, source: DocumentSource, seq: Sequence, acquired: list[Part], state: ModeState) -> Run:
        return Run(seq.all_tokens, start_pos=0)
