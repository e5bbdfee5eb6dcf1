"""A minimal stand-in for the engine's model runner: prefill token runs into pages of a pool, attend by page
tables built from segments and deltas (kernels/paged.py), and return logits. Tests only."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lazyattn.kernels.backend import ForwardBatch, ReferenceBackend
from lazyattn.kernels.paged import EntryPages, PagedBatch
from lazyattn.kernels.rope import RopeTables
from lazyattn.model import CausalLM, ModelConfig


@dataclass
class Segment:
    """Tokens whose K/V sit in their own pages, `length` of them so far, rotated at positions start + i."""

    pages: list[int]
    length: int = 0


@dataclass
class Run:
    """New tokens of `seg`, at logical positions start + seg.length + i, seeing `context` then `seg`.

    context: earlier segments and their deltas (= their logical start minus the start they were cached at).
    """

    tokens: list[int]
    seg: Segment
    start: int = 0
    context: list[tuple[Segment, int]] = field(default_factory=list)


def page_fill(n: int, page_size: int) -> list[int]:
    full, rest = divmod(n, page_size)
    return [page_size] * full + ([rest] if rest else [])


class PagedRunner:
    def __init__(self, model: CausalLM, cfg: ModelConfig, page_size: int = 8, num_pages: int = 64) -> None:
        self.model, self.cfg, self.page_size = model, cfg, page_size
        kv = torch.zeros(cfg.num_layers, 2, num_pages, page_size, cfg.num_kv_heads, cfg.head_dim, dtype=cfg.dtype)
        self.backend = ReferenceBackend(kv, RopeTables.build(cfg.rope, 1024), cfg.attn_scale)
        self.next_page = 0

    def segment(self, max_tokens: int) -> Segment:
        """Pages for up to max_tokens, allocated contiguously from the pool."""
        n = -(-max_tokens // self.page_size)
        pages = list(range(self.next_page, self.next_page + n))
        self.next_page += n
        return Segment(pages)

    def entry(self, run: Run) -> EntryPages:
        pages, deltas, valid = [], [], []
        for seg, delta in run.context:
            pages += seg.pages[: -(-seg.length // self.page_size)]
            deltas += [delta] * len(page_fill(seg.length, self.page_size))
            valid += page_fill(seg.length, self.page_size)
        own = page_fill(run.seg.length + len(run.tokens), self.page_size)
        return EntryPages(pages + run.seg.pages[: len(own)], deltas + [0] * len(own), valid + own)

    @torch.inference_mode()
    def run(self, runs: list[Run]) -> list[torch.Tensor]:
        """Forward all runs as one packed batch; returns each run's fp32 logits [len(tokens), vocab]."""
        ids, positions, slots, q_starts = [], [], [], []
        for r in runs:
            first = r.seg.length
            q_starts.append(r.start + first)
            for i, tok in enumerate(r.tokens):
                ids.append(tok)
                positions.append(r.start + first + i)
                page, off = divmod(first + i, self.page_size)
                slots.append(r.seg.pages[page] * self.page_size + off)
        attn = PagedBatch.build([self.entry(r) for r in runs], [len(r.tokens) for r in runs], q_starts)
        fb = ForwardBatch(
            positions=torch.tensor(positions),
            slot_mapping=torch.tensor(slots),
            attn=attn,
            is_decode=all(len(r.tokens) == 1 for r in runs),
            logits_indices=torch.arange(len(ids)),
        )
        hidden = self.model(torch.tensor(ids), fb, self.backend)
        logits = self.model.compute_logits(hidden[fb.logits_indices])
        for r in runs:
            r.seg.length += len(r.tokens)
        return list(logits.split([len(r.tokens) for r in runs]))
