"""Random RAG requests laid out in a page pool, with their dense ground truth: the kernel tests' fixture.

A scenario holds documents (segments) encoded once at local positions in their own pages, and requests
that place some of them, in any order, before a final segment. Physical pages are shuffled so that any
indexing mistake shows. Documents may be shared by several requests at different deltas.

Relinked requests (docs/design.md, "Relink") replace the first k rows of every placed document after the
first with rows of their own (random q/k/v here, cached at their logical positions in private pages) and
read the rest of the document from its shared pages, skipping the shared copy's first k slots.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from lazyattn.kernels.paged import EntryPages, PagedBatch, cdiv, page_fill, transposed_copy
from lazyattn.kernels.reference import attend, block_mask
from lazyattn.kernels.rope import RopeTables, apply_rope


@dataclass
class Tokens:
    """Raw (unrotated) per-token q/k/v of one segment, and where its keys live."""

    q: torch.Tensor  # [L, Hq, D]
    k: torch.Tensor  # [L, Hkv, D]
    v: torch.Tensor  # [L, Hkv, D]
    pages: list[int]

    @property
    def length(self) -> int:
        return self.q.shape[0]


@dataclass
class Request:
    docs: list[int]  # indices into Scenario.docs, in placement order
    final: Tokens  # final segment; its keys are cached at logical positions
    relinks: list[Tokens] = field(default_factory=list)  # recomputed first rows of docs[1:], if relinked


@dataclass
class Scenario:
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    tables: RopeTables
    docs: list[Tokens]
    requests: list[Request]
    page_size: int
    scale: float

    def doc_starts(self, r: Request) -> list[int]:
        starts, s = [], 0
        for d in r.docs:
            starts.append(s)
            s += self.docs[d].length
        return starts

    def context_len(self, r: Request) -> int:
        return sum(self.docs[d].length for d in r.docs)

    # --- batches -------------------------------------------------------------------------------------

    def placed(self, r: Request) -> list[tuple[Tokens, int, int]]:
        """(document, logical start, rows replaced by a relink) for each placed document."""
        skips = [0] + [t.length for t in r.relinks] if r.relinks else [0] * len(r.docs)
        return [(self.docs[d], start, skip) for d, start, skip in zip(r.docs, self.doc_starts(r), skips)]

    def context_entry(self, r: Request, upto_doc: int | None = None) -> EntryPages:
        """Pages of the documents before `upto_doc` (default: all) at their deltas; a relinked document lists
        its private rows (delta 0), then its shared pages from the first row it did not replace."""
        pages, deltas, valid, firsts = [], [], [], []
        for j, (doc, start, skip) in enumerate(self.placed(r)[:upto_doc]):
            if skip:
                own = r.relinks[j - 1]
                pages += own.pages
                deltas += [0] * len(own.pages)
                valid += page_fill(skip, self.page_size)
                firsts += [0] * len(own.pages)
            fill = page_fill(doc.length, self.page_size)
            for m, page in enumerate(doc.pages):
                first = min(max(skip - m * self.page_size, 0), fill[m])
                if fill[m] - first:
                    pages.append(page)
                    deltas.append(start)
                    valid.append(fill[m] - first)
                    firsts.append(first)
        return EntryPages(pages, deltas, valid, firsts)

    def final_entry(self, r: Request, upto: int) -> EntryPages:
        """Pages of every document at its delta, then the final segment's pages holding its first `upto` keys."""
        n_final = cdiv(upto, self.page_size)
        return self.context_entry(r).then(r.final.pages[:n_final], page_fill(upto, self.page_size))

    def final_prefill(self, chunks: list[tuple[int, int]] | None = None) -> tuple[torch.Tensor, PagedBatch]:
        """Queries of each request's final segment rows [lo, hi) (default: all), rotated, and their batch."""
        chunks = chunks or [(0, r.final.length) for r in self.requests]
        qs, entries, lens, starts = [], [], [], []
        for r, (lo, hi) in zip(self.requests, chunks):
            ctx = self.context_len(r)
            pos = torch.arange(ctx + lo, ctx + hi, device=self.k_cache.device)
            qs.append(apply_rope(r.final.q[lo:hi], pos, self.tables))
            entries.append(self.final_entry(r, hi))
            lens.append(hi - lo)
            starts.append(ctx + lo)
        batch = PagedBatch.build(entries, lens, starts, self.k_cache.device)
        return torch.cat(qs), batch

    def decode(self) -> tuple[torch.Tensor, PagedBatch]:
        """The last row of each final segment as a decode query."""
        return self.final_prefill([(r.final.length - 1, r.final.length) for r in self.requests])

    def relink_prefill(self) -> tuple[torch.Tensor, PagedBatch]:
        """Every relinked document's recomputed rows as one entry each: at their logical positions, over the
        documents before them (relinked) and their own private pages."""
        qs, entries, lens, starts = [], [], [], []
        for r in self.requests:
            for j, ((_, start, skip), own) in enumerate(zip(self.placed(r)[1:], r.relinks), start=1):
                pos = torch.arange(start, start + skip, device=self.k_cache.device)
                qs.append(apply_rope(own.q, pos, self.tables))
                entries.append(self.context_entry(r, j).then(own.pages, page_fill(skip, self.page_size)))
                lens.append(skip)
                starts.append(start)
        return torch.cat(qs), PagedBatch.build(entries, lens, starts, self.k_cache.device)

    def doc_prefill(self, chunks: list[tuple[int, int, int]]) -> tuple[torch.Tensor, PagedBatch]:
        """Encoding documents alone: (doc, lo, hi) rows at local positions against the doc's own pages."""
        qs, entries, lens, starts = [], [], [], []
        for d, lo, hi in chunks:
            doc = self.docs[d]
            pos = torch.arange(lo, hi, device=self.k_cache.device)
            qs.append(apply_rope(doc.q[lo:hi], pos, self.tables))
            n = cdiv(hi, self.page_size)
            entries.append(EntryPages(doc.pages[:n], [0] * n, page_fill(hi, self.page_size)))
            lens.append(hi - lo)
            starts.append(lo)
        return torch.cat(qs), PagedBatch.build(entries, lens, starts, self.k_cache.device)

    def with_transposed_v(self) -> Scenario:
        """The same scenario with V's pages stored transposed (a page's slots contiguous for each kv head and
        channel, as the pool stores FP8 pages' V), seen as [pages, slots, heads, head_dim] like any V cache."""
        return dataclasses.replace(self, v_cache=transposed_copy(self.v_cache))

    def poison_unlisted(self, batch: PagedBatch) -> None:
        """NaN into every cache slot the batch does not list as a valid key (page tails, unused pages):
        a kernel that reads one of them shows it in its output."""
        listed = torch.zeros(self.k_cache.shape[:2], dtype=torch.bool, device=self.k_cache.device)
        for b in range(batch.batch_size):
            for i in range(int(batch.num_pages[b])):
                first = 0 if batch.firsts is None else int(batch.firsts[b, i])
                listed[int(batch.pages[b, i]), first : first + int(batch.valid[b, i])] = True
        for cache in (self.k_cache, self.v_cache):
            if cache.element_size() == 1:  # FP8 pages: the NaN byte (torch's masked_fill takes no float8)
                cache.view(torch.uint8)[~listed] = 0x7F
            else:
                cache[~listed] = float("nan")

    # --- ground truth ------------------------------------------------------------------------------

    def _context_tokens(self, r: Request, upto_doc: int | None = None) -> list[Tokens]:
        """The rows of the documents before `upto_doc` as the request sees them: a relinked document's own
        first rows, then the rest of the shared document."""
        parts = []
        for j, (doc, _, skip) in enumerate(self.placed(r)[:upto_doc]):
            if skip:
                parts.append(r.relinks[j - 1])
            parts.append(Tokens(doc.q[skip:], doc.k[skip:], doc.v[skip:], []))
        return parts

    def dense_final(self, r: Request, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        """The semantics' reference (docs/design.md): attention over the concatenation at logical positions,
        block mask (the final segment sees every row before it)."""
        hi = r.final.length if hi is None else hi
        parts = self._context_tokens(r) + [r.final]
        ctx = self.context_len(r)
        return self._dense(parts, ctx + lo, ctx + hi)

    def dense_relinks(self) -> torch.Tensor:
        """Ground truth of relink_prefill: each document's recomputed rows see every row before them."""
        outs = []
        for r in self.requests:
            for j, ((_, start, skip), own) in enumerate(zip(self.placed(r)[1:], r.relinks), start=1):
                outs.append(self._dense(self._context_tokens(r, j) + [own], start, start + skip))
        return torch.cat(outs)

    def _dense(self, parts: list[Tokens], lo: int, hi: int) -> torch.Tensor:
        """Rows [lo, hi) of causal attention over the concatenated parts at positions 0, 1, ... (fp64)."""
        q = torch.cat([p.q for p in parts])[lo:hi]
        k = torch.cat([p.k for p in parts])
        v = torch.cat([p.v for p in parts])
        q = apply_rope(q.double(), torch.arange(lo, hi, device=q.device), self.tables)
        k = apply_rope(k.double(), torch.arange(k.shape[0], device=k.device), self.tables)
        mask = torch.arange(k.shape[0], device=q.device)[None, :] <= torch.arange(lo, hi, device=q.device)[:, None]
        return attend(q, k, v.double(), mask, self.scale)

    def dense_doc(self, d: int, lo: int, hi: int) -> torch.Tensor:
        doc = self.docs[d]
        pos = torch.arange(doc.length, device=doc.q.device)
        q, k = apply_rope(doc.q.double(), pos, self.tables), apply_rope(doc.k.double(), pos, self.tables)
        mask = block_mask([], doc.length, q.device)
        return attend(q[lo:hi], k, doc.v.double(), mask[lo:hi], self.scale)


def make_scenario(
    doc_lens: list[int],
    requests: list[tuple[list[int], int]],
    *,
    q_heads: int = 4,
    kv_heads: int = 1,
    head_dim: int = 64,
    page_size: int = 16,
    tables: RopeTables,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
    spare_pages: int = 3,
    relink: int = 0,
) -> Scenario:
    """Documents of the given lengths, and requests of (doc order, final-segment length).

    Documents' keys are cached rotated at their local positions, final segments' at their logical ones.
    relink=k: every request replaces the first min(k, length) rows of each document after its first.
    """
    gen = torch.Generator().manual_seed(seed)

    def tokens(n: int) -> Tokens:
        def randn(h: int) -> torch.Tensor:
            return torch.randn(n, h, head_dim, generator=gen).to(dtype).to(device)

        return Tokens(randn(q_heads), randn(kv_heads), randn(kv_heads), [])

    docs = [tokens(n) for n in doc_lens]
    reqs = [Request(list(order), tokens(f)) for order, f in requests]
    for r in reqs:
        r.relinks = [tokens(min(relink, doc_lens[d])) for d in r.docs[1:]] if relink else []
    own = [t for r in reqs for t in [r.final] + r.relinks]
    need = sum(cdiv(t.length, page_size) for t in docs + own) + spare_pages
    perm = torch.randperm(need, generator=gen).tolist()
    k_cache = torch.randn(need, page_size, kv_heads, head_dim, generator=gen).to(dtype).to(device)
    v_cache = torch.randn(need, page_size, kv_heads, head_dim, generator=gen).to(dtype).to(device)
    scenario = Scenario(k_cache, v_cache, tables, docs, reqs, page_size, head_dim**-0.5)

    def place(t: Tokens, first_pos: int) -> None:
        n_pages = cdiv(t.length, page_size)
        t.pages = [perm.pop() for _ in range(n_pages)]
        pos = torch.arange(first_pos, first_pos + t.length, device=t.k.device)
        k_rot = apply_rope(t.k, pos, tables)
        for i, p in enumerate(t.pages):
            lo, hi = i * page_size, min((i + 1) * page_size, t.length)
            k_cache[p, : hi - lo] = k_rot[lo:hi]
            v_cache[p, : hi - lo] = t.v[lo:hi]

    for d in docs:
        place(d, 0)
    for r in reqs:
        place(r.final, scenario.context_len(r))
        for own, (_, start, _) in zip(r.relinks, scenario.placed(r)[1:]):
            place(own, start)
    return scenario
