"""The engine's bookkeeping checked whole (the `check_invariants` option; on in the CPU test suite).

The document cache checks what it knows itself (`DocumentCache.check`: index, LRU, evictable and held counts, the
tiers'). Who holds what is known only here: every page of the pool is held by exactly one owner, and every live
segment's refcount is exactly the number of its holders.

- owners of pool pages: the cache's live segments, each live sequence's private pages (its run past the pages it
  fills for the cache, its mode's copies and relinked rows) and the pages a KV budget withholds;
- holders of a segment: each live sequence that lists it as a part or fills it, and each fill from a lower tier
  still in flight;
- a sequence's recomputed runs (relink), once placed: each holds the pages its rows need from its first slot on,
  and no two rows share a slot (they are packed one after another into shared pages);
- live sequences: the running ones and those that ended while a step in flight may still read their pages
  (`Scheduler.ended`, engine/step_pipeline.py); a waiting sequence (queued, or preempted) holds nothing;
- an encode job's segment is live and pending, unless the job is dead (nobody holds its segment, or it failed):
  the next schedule drops it before anything could run it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from lazyattn.cache.document_cache import DocumentCache
from lazyattn.engine.scheduler import Scheduler
from lazyattn.engine.sequence import Sequence, Status
from lazyattn.errors import CacheInvariantError
from lazyattn.kernels.paged import cdiv


def check_engine(cache: DocumentCache, scheduler: Scheduler, ended: Iterable[Sequence]) -> None:
    """Raise CacheInvariantError naming the first invariant broken (module docstring). O(pages)."""
    cache.check()
    live = [*scheduler.running, *ended]
    for seq in scheduler.waiting:
        if seq.parts or seq.run is not None:
            raise CacheInvariantError(f"waiting sequence {seq.seq_id} still holds pages or segments")
    for seq in scheduler.running:
        if seq.status is not Status.RUNNING or seq.run is None:
            raise CacheInvariantError(f"running sequence {seq.seq_id} has status {seq.status.value}, no run")

    holders: Counter[int] = Counter()
    for seq in live:
        for segment in [*(p.segment for p in seq.parts), *seq.mode_state.filled_segments()]:
            holders[id(segment)] += 1
    for tier in cache.tiers:
        for segment in tier.filling():
            holders[id(segment)] += 1
    segments = cache.live_segments()
    for segment in segments:
        if segment.refcount != holders.pop(id(segment), 0):
            raise CacheInvariantError(
                f"segment {segment.key[:16]} has refcount {segment.refcount}, held by {holders.get(id(segment), 0)}"
            )
    if holders:
        raise CacheInvariantError(f"{len(holders)} segment(s) held by sequences or fills are not the cache's")

    for seq in live:
        check_runs(seq, scheduler.page_size)

    pages = [page for segment in segments for page in segment.pages]
    for seq in live:
        run = seq.run
        if run is not None:
            pages += run.pages[run.owned :]
        for private in seq.mode_state.private_pages():
            pages += private
    pool = cache.pool
    twice = [page for page, n in Counter(pages).items() if n > 1]
    if twice:
        raise CacheInvariantError(f"pages held by two owners: {sorted(twice)[:8]}")
    if len(pages) + pool.num_withheld != pool.num_used:
        raise CacheInvariantError(
            f"the pool has {pool.num_used} pages in use; owners hold {len(pages)}, a budget withholds "
            f"{pool.num_withheld}: {pool.num_used - len(pages) - pool.num_withheld} leaked"
        )
    if not all(pool.is_used(page) for page in pages):
        raise CacheInvariantError("a page held by an owner is free in the pool")

    held = {id(s) for s in segments}
    for key, job in scheduler.jobs.items():
        segment = job.segment
        if segment.refcount == 0 or segment.failed:
            continue  # dead: nobody waits for it, dropped before the next schedule (Admission.drop_dead_jobs)
        if segment.ready or id(segment) not in held or segment.key != key:
            raise CacheInvariantError(f"encode job {key[:16]} is for a segment that is not live and pending")


def check_runs(seq: Sequence, page_size: int) -> None:
    """Raise CacheInvariantError if the sequence's placed recomputed runs (module docstring) lack a page their rows
    need or share a slot."""
    taken: set[tuple[int, int]] = set()
    for run in seq.mode_state.runs:
        if not run.pages:
            continue  # not placed yet: its pages are allocated with its first chunk
        f = run.first_slot
        if not 0 <= f < page_size or len(run.pages) != cdiv(f + len(run.tokens), page_size):
            raise CacheInvariantError(
                f"sequence {seq.seq_id}: a run of {len(run.tokens)} rows from slot {f} holds {len(run.pages)} pages"
            )
        slots = {(run.pages[(f + i) // page_size], (f + i) % page_size) for i in range(len(run.tokens))}
        if slots & taken:
            raise CacheInvariantError(
                f"sequence {seq.seq_id}: two recomputed runs share slots {sorted(slots & taken)[:4]}"
            )
        taken |= slots
