"""What every mode answers (`Mode`) and what it may ask of the engine's cache (`DocumentSource`):

- `admit`: which cached parts a sequence acquires (through a `DocumentSource`) and which run of tokens it computes
  itself;
- `context`: the page table its run attends to before its own pages (physical page, delta, valid tokens);
- per-sequence state (`ModeState`, engine/sequence.py): what a sequence keeps through its mode (relinks, copies,
  the cache pages its own run fills);
- `copies_needed`, `copy_sources`, `set_copies`: the private re-rotated copies of placed documents a sequence
  reads (block), made by the scheduler before its first chunk;
- `pages_needed`: the one page-count formula (validation, admission, the server's default max_tokens, the
  hit-ratio simulation all use it);
- `caches_documents`: whether a request's segments are cached documents (so they can be encoded ahead of time
  and hits count in whole documents).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from lazyattn.engine.sequence import ModeState, Part, Run, Sequence
from lazyattn.kernels.paged import EntryPages

if TYPE_CHECKING:
    from lazyattn.cache.document_cache import Segment


class DocumentSource(Protocol):
    """What a mode's `admit` may ask of the engine's cache (engine/admission.py implements it): acquire documents or
    single pages under keys, and the page size. Every acquired part is the caller's to release."""

    page_size: int

    def acquire_documents(
        self, segments: list[list[int]], salt: str | None, acquired: list[Part], keys: list[str] | None, prefix: bool
    ) -> None:
        """Acquire each segment as a cached document at its logical start, appending its Part to `acquired`."""
        ...

    def chain_key(self, tokens: list[int], salt: str | None, parent: str | None) -> str:
        """The cache key of `tokens` hanging from the key `parent` (None: a document's own key)."""
        ...

    def holds(self, key: str) -> bool:
        """Whether the cache holds `key`, without acquiring it."""
        ...

    def acquire_key(self, key: str, num_tokens: int) -> tuple[Segment, bool]:
        """Acquire `key` (created empty if new, to be computed by the caller); (segment, is_new)."""
        ...


class Mode:
    name: str
    caches_documents: bool = False
    copies: bool = False
    # A sequence's chunk may run in the same step as the last chunk of a document it reads: each layer writes
    # the K/V of every row in the batch before any row attends. Not so for copies, made before the forward pass.
    reads_documents_in_same_step: bool = True

    def new_state(self) -> ModeState:
        """A new sequence's state private to this mode (filled by `admit`)."""
        return ModeState()

    def admit(self, source: DocumentSource, seq: Sequence, acquired: list[Part], state: ModeState) -> Run:
        """Acquire the sequence's cached parts into `acquired` (in order), fill `state` (from `new_state`, what the
        sequence keeps through this mode) and return the run it computes. Changes nothing of `seq`: the scheduler
        sets what admission returns. Raises OutOfPagesError; the caller then releases what `acquired` and `state`
        hold."""
        raise NotImplementedError

    def context(self, seq: Sequence, page_size: int) -> EntryPages:
        """The pages the sequence's run attends to before its own."""
        raise NotImplementedError

    def copies_needed(self, seq: Sequence) -> bool:
        """Whether the sequence still needs private copies made before its first chunk (`copy_sources`)."""
        return False

    def copy_sources(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """The pages to copy privately for the sequence and the delta each is re-rotated by."""
        return [], []

    def set_copies(self, seq: Sequence, pages: list[int]) -> None:
        """The sequence's private copies were allocated (as `pages`, in `copy_sources` order) and are in a batch.
        Called only by the scheduler: it changes the mode's state of the sequence on the scheduler's behalf."""

    def pages_needed(
        self, segment_lens: list[int], run_tokens: int, n: int, page_size: int, relink: tuple[int, int] = (0, 0)
    ) -> int:
        """Pages a request holds at its peak: segments of `segment_lens` tokens, then `n` samples whose runs reach
        `run_tokens` tokens each (the final segment plus what they generate), and, relinked (`relink`: the first
        and last rows of each document), their private recomputed rows."""
        raise NotImplementedError

    def reused_documents(self, cached_tokens: int, system_len: int, doc_len: int, num_docs: int) -> float:
        """Documents of a request found in the cache, from the engine's count of cached context tokens
        (requests of a system segment and `num_docs` documents of `doc_len` tokens)."""
        return 0.0

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
